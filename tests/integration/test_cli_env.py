"""`hangtrace env` traces ONE command by default, and our own CLI never traces itself (issue 38).

Real shells (sh) and real traced interpreters: `$(hangtrace env) CMD` gives CMD a ring and the
shell's next Python command none; `--export` says that every later command joins; `hangtrace
...` run where HANGTRACE=1 is exported writes no ring file (it looks at the run, it is not
part of it), also when its output goes to `head` and it dies of the closed pipe.
"""

import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env  # noqa: E402

HT = "%s -m hangtrace" % shlex.quote(sys.executable)
PY = shlex.quote(sys.executable)
PID = "import os; print(os.getpid())"


def rings(d):
    return sorted(n for n in os.listdir(d) if n.startswith("ring-")) if os.path.isdir(d) else []


def sh(script, env):
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_env_prefixes_one_command(tmp_path):
    d = tmp_path / "run"
    env = base_env(traced=False, HANGTRACE_AUTO_WATCH="0")
    out = sh("%s env --dir %s" % (HT, d), env)
    assert out.returncode == 0 and out.stdout.startswith("env HANGTRACE=1 "), out
    assert "HANGTRACE_DIR=%s " % d in out.stdout and "HANGTRACE_RUN_ID=" in out.stdout
    res = sh(
        "$(%s env --dir %s) %s -c %s; %s -c %s" % (HT, d, PY, shlex.quote(PID), PY, shlex.quote(PID)), env
    )
    assert res.returncode == 0, res.stderr
    first, second = res.stdout.split()
    assert rings(d) == ["ring-%s-%s.htr" % (os.uname().nodename, first)], (rings(d), second)


def test_env_export_warns_and_exports(tmp_path):
    d = tmp_path / "run"
    out = sh("%s env --export --dir %s" % (HT, d), base_env(traced=False))
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("# ") and "every later Python command" in first, first
    assert "export HANGTRACE=1\n" in out.stdout and "export HANGTRACE_DIR=%s\n" % d in out.stdout
    res = sh(out.stdout + 'printf "%s %s" "$HANGTRACE" "$HANGTRACE_DIR"\n', base_env(traced=False))
    assert res.stdout == "1 %s" % d


def test_own_cli_not_traced_in_exported_shell(tmp_path):
    """`hangtrace records RUN | head -1` in a shell with HANGTRACE=1 exported: no ring of it."""
    job, here = tmp_path / "job", tmp_path / "here"
    env = base_env(traced=False, HANGTRACE_AUTO_WATCH="0")
    res = sh("$(%s env --dir %s) %s -c %s" % (HT, job, PY, shlex.quote(PID)), env)
    assert res.returncode == 0 and len(rings(job)) == 1, res
    exported = base_env(here, traced=True)
    cmds = ["%s records %s --last 50 | head -1" % (HT, job), "%s analyze %s | head -1" % (HT, job)]
    script = shutil.which("hangtrace")
    if script:  # the console script, as a user types it
        cmds.append("%s %s dump --help | head -1" % (PY, shlex.quote(script)))
    for cmd in cmds:
        r = sh(cmd, exported)
        assert r.returncode == 0 and r.stdout, (cmd, r.stderr)
    assert rings(here) == [] and rings(job) == rings(job)[:1], (rings(here), rings(job))
    # a Python program in that shell still joins the run
    r = sh("%s -c %s" % (PY, shlex.quote(PID)), exported)
    assert rings(here) == ["ring-%s-%s.htr" % (os.uname().nodename, r.stdout.strip())]
