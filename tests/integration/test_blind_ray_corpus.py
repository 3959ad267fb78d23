"""Issue 9, the blind Ray corpus: Ray jobs written from public incident descriptions and the
README alone, by someone who had not read the analysis code (``tests/integration/blind/ray/``;
each file tells its incident and holds ``LAUNCH = "ray"`` and ``EXPECT``). Each runs as
``blind/ray/RESULTS.md``'s harness runs it: ``cd blind/ray && hangtrace run --stall-s 10
--stop-on-stall -- python FILE`` (with a timeout, in a fresh run directory). The verdict of the
run - the FIRST snapshot's ``diagnosis.json`` and ``hangtrace analyze RUN_DIR --json`` after
the job is gone - must name the expected kind, culprit ranks, culprit actors and cause.

Actors are matched as ``culprit_actors`` spells them: an expected actor is the class or the
name of one named culprit (``Class`` or ``Class 'name'`` at the top level for actors without
a rank, ``details.culprit_actors`` for ranked ones), and every named culprit is expected.

Each job starts its own Ray (``ray.init(address="local")``) and takes 40-140 s on 2 cores,
so ``.ci/run`` runs two fast ones of different rules (``CI_SET``, about 2 minutes); set
``HANGTRACE_BLIND=all`` for the whole corpus. Where the tool and the job's author disagree
on purpose (``AGREED``, documented in RESULTS.md) the test asserts the agreed verdict; where
the verdict is wrong (``WRONG``) the test is an ``xfail(strict=True)`` saying what the tool
said: it fails as soon as the verdict changes, so it is looked at again.

Every process of a job (Ray's own included) inherits the job's ``HANGTRACE_DIR``; after each
job none may be left (those found are killed and the test fails). Other sessions' Ray
clusters are never touched (no ``ray stop``).
"""
import ast
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jobs import REPO, base_env

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blind", "ray")
JOBS = sorted(glob.glob(os.path.join(HERE, "*.py")))
#: for .ci/run, two fast jobs of different rules: actor_waits (a cycle of actor calls, 45 s) and
#: rankless_root (a rank-less actor's segfault beside ranked trainers, which wait as its cascade,
#: 72 s); ray_producer_dies (rule actors) takes 130 s: its consumer polls until the driver gives up
CI_SET = {"ray_actor_cycle", "ray_rollout_crash_trainer_waits"}
#: deliberate differences from the author's EXPECT, documented in RESULTS.md (job -> verdict)
AGREED = {
    # the actor is alive and idle after its train_step raised, on purpose not dead
    "ray_trainer_raise": {"kind": "stuck-outside-collective", "culprit_ranks": [0], "culprit_actors": ["trainer-0"],
                          "cause": "blocked", "summary_has": "ValueError: loss is NaN at step 4"},
}
#: wrong verdicts on the current tree (job -> what the tool said vs expected)
WRONG = {}


def _consts(path):
    out = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("LAUNCH", "EXPECT"):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def _selected():
    every = os.environ.get("HANGTRACE_BLIND") == "all"
    out = []
    for path in JOBS:
        name = os.path.basename(path)[:-3]
        if not every and name not in CI_SET:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=WRONG[name])] if name in WRONG else []
        out.append(pytest.param(path, id=name, marks=marks))
    return out


def _lacks(path):
    """Why this machine cannot run the job (None: it can)."""
    src = open(path).read()
    need = ["ray"] + (["torch"] if "import torch" in src else []) + (["numpy"] if "import numpy" in src else [])
    for mod in need:
        try:
            __import__(mod)
        except ImportError:
            return "needs %s, not importable here" % mod
    name = os.path.basename(path)[:-3]
    if name == "ray_openrlhf_memmon":
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) << 10 for line in f}
        if info.get("MemAvailable", 0) < 3 << 30:
            return "needs 3 GiB of free memory to push the node over Ray's memory-monitor threshold " \
                   "(%.1f GiB available)" % (info.get("MemAvailable", 0) / (1 << 30))
    if name == "ray_unschedulable" and (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")):
        return "the job asks for a GPU the cluster must not have, and this machine has one"
    return None


def _ours(run_dir):
    """pids of live processes whose environment names ``run_dir`` as HANGTRACE_DIR."""
    want = ("HANGTRACE_DIR=%s" % run_dir).encode()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if want in f.read().split(b"\0"):
                    with open("/proc/%s/stat" % pid) as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(pid))
        except OSError:
            pass
    return out


def run_job(path, tmp_path, timeout_s=300):
    """Run ``path`` under ``hangtrace run`` from its folder; return (EXPECT, first diagnosis,
    ``analyze RUN_DIR --json`` afterwards, console text). No process of the job may be left."""
    c = _consts(path)
    run_dir = str(tmp_path / "run")
    full = [sys.executable, "-m", "hangtrace", "run", "--stall-s", "10", "--stop-on-stall", "--dir", run_dir,
            "--", sys.executable, path]
    p = subprocess.Popen(full, env=base_env(traced=False), cwd=HERE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.monotonic()
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the job's session: anything left of it
        except OSError:
            pass
    why = "rc=%s %.0fs\nstdout:\n%s\nstderr:\n%s" % (p.returncode, time.monotonic() - t0, (out or "")[-2500:],
                                                     (err or "")[-5000:])
    deadline = time.time() + 30  # Ray's own processes end a few seconds after the driver
    while _ours(run_dir) and time.time() < deadline:
        time.sleep(0.5)
    left = _ours(run_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, "processes of the job left running: %s\n%s" % (left, why)
    diags = []
    for f in sorted(glob.glob(os.path.join(run_dir, "snapshots", "*", "diagnosis.json"))):
        with open(f) as fh:
            diags.append(json.load(fh))
    assert diags, "no verdict\n" + why
    a = subprocess.run([sys.executable, "-m", "hangtrace", "analyze", "--json", run_dir],
                       env=base_env(traced=False), capture_output=True, text=True, timeout=180, cwd=REPO)
    assert a.returncode == 0, a.stderr[-3000:] + "\n" + why
    return c, diags[0], json.loads(a.stdout), why


def _named(d):
    """{(class, name)} of every culprit actor of verdict ``d``: rank-less ones from the top-level
    ``culprit_actors`` (``Class`` or ``Class 'name'``), ranked ones from ``details.culprit_actors``."""
    out = set()
    for s in d.get("culprit_actors") or []:
        cls, _, name = s.partition(" ")
        out.add((cls, name.strip("'") or None))
    for a in (d.get("details") or {}).get("culprit_actors") or []:
        if isinstance(a, dict):
            out.add((a.get("class"), a.get("name")))
    return out


def _actors_match(want, named):
    """Each expected actor is the class or the name of a named one, and each named one is expected."""
    return all(any(w in a for a in named) for w in want) and all(any(w in a for w in want) for a in named)


def _check(want, d, what, why):
    named = _named(d)
    msg = "%s: %s / %s / %s / %s\n%s\n%s" % (what, d["kind"], d["culprit_ranks"], sorted(named, key=str),
                                             d["cause"], d["summary"], why)
    assert (d["kind"], d["culprit_ranks"]) == (want["kind"], want["culprit_ranks"]), msg
    assert _actors_match(want["culprit_actors"], named), "expected actors %s\n%s" % (want["culprit_actors"], msg)
    assert d["cause"] == want["cause"], msg
    if want.get("summary_has"):
        assert want["summary_has"] in d["summary"], msg


@pytest.mark.parametrize("path", _selected())
def test_blind_ray_job(path, tmp_path):
    lacks = _lacks(path)
    if lacks:
        pytest.skip(lacks)
    name = os.path.basename(path)[:-3]
    c, first, analyzed, why = run_job(path, tmp_path)
    want = AGREED.get(name) or c["EXPECT"]
    _check(want, first, "first snapshot", why)
    _check(want, analyzed, "analyze RUN_DIR", why)
