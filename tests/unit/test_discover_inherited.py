"""``hangtrace attach``'s scan when a rank sets its torch variables in Python (the torch
tutorial's ``os.environ['MASTER_ADDR'] = ...`` inside ``mp.spawn``'s function): its own
``/proc/PID/environ`` lacks them, but a tool it starts (``cat``) inherits them. The tool
is no rank; its Python parent and that parent's Python siblings are found instead. Real
processes."""

import os
import subprocess
import sys
import time

import pytest

from hangtrace.tracer.collect.discover import find_torch_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

RANK = (
    "import os, subprocess, sys, time\n"
    "os.environ['MASTER_ADDR'] = '127.0.0.1'; os.environ['MASTER_PORT'] = '%d'\n"
    "if sys.argv[1] == '0':\n"
    "    subprocess.Popen(['cat'], stdin=subprocess.PIPE).wait()\n"
    "time.sleep(60)\n"
)
LAUNCHER = (
    "import subprocess, sys, time\n"
    "ps = [subprocess.Popen([sys.executable, '-c', %r, str(r)]) for r in range(2)]\n"
    "[p.wait() for p in ps]\n"
)


def test_a_tool_that_inherited_master_addr_leads_to_its_rank_and_the_siblings():
    port = 20000 + os.getpid() % 20000
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "TORCHELASTIC_RUN_ID",
            "GROUP_RANK",
        )
    }
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER % (RANK % port)], env=env)
    # another job on the host whose ranks do show RANK must not hide these (CI, 2026-12-04)
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=dict(env, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + 1)),
    )
    try:
        import psutil

        t0 = time.monotonic()
        cat = None
        while cat is None and time.monotonic() - t0 < 20:
            cat = next(
                (c for c in psutil.Process(launcher.pid).children(recursive=True) if c.name() == "cat"), None
            )
            time.sleep(0.05)
        assert cat is not None, "the rank never started its tool"
        ranks = {c.pid for c in psutil.Process(launcher.pid).children()}
        found = [
            d
            for d in find_torch_processes()
            if d["env"].get("MASTER_PORT") == str(port) or d["pid"] in ranks or d["pid"] == cat.pid
        ]
        assert {d["pid"] for d in found} == ranks, found  # the two ranks, not cat
        assert all(d["inferred_from"] == cat.pid and d["python"] for d in found), found
    finally:
        for c in psutil.Process(launcher.pid).children(recursive=True):
            c.kill()
        launcher.kill()
        launcher.wait()
        other.kill()
        other.wait()


HARNESS = (
    "import os, subprocess, sys, time\n"
    "env = dict(os.environ, MASTER_ADDR='127.0.0.1', MASTER_PORT=sys.argv[1])\n"
    "subprocess.Popen(['sleep', '60'], env=env, user=sys.argv[2]).wait()\n"
)


@pytest.mark.skipif(os.getuid() != 0, reason="starting a process as another user needs root")
def test_a_tool_of_another_user_does_not_make_its_python_parent_a_rank():
    """A Python harness that starts a tool as another user with the torch variables passed
    in ``env=`` (a test harness, a job submitter) is not a rank: the parent runs as a
    different user than the child that carries the variables."""
    import psutil

    port = 20000 + (os.getpid() + 7) % 20000
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "TORCHELASTIC_RUN_ID",
            "GROUP_RANK",
        )
    }
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(port), "nobody"], env=env, cwd="/")
    try:
        t0 = time.monotonic()
        tool = None
        while tool is None and time.monotonic() - t0 < 20:
            tool = next((c for c in psutil.Process(harness.pid).children() if c.name() == "sleep"), None)
            time.sleep(0.05)
        assert tool is not None, "the harness never started its tool"
        assert tool.uids().real != 0
        found = find_torch_processes(include_all=True)
        assert harness.pid not in {d["pid"] for d in found}, found
        assert tool.pid not in {d["pid"] for d in found}, found  # no Python: no rank
    finally:
        for c in psutil.Process(harness.pid).children(recursive=True):
            c.kill()
        harness.kill()
        harness.wait()


def test_a_process_denied_even_to_root_is_not_listed_as_a_reason():
    """This VM's init (pid 1) refuses its environ even to root. A scan as root left it as
    the first 'skipped' reason, and `hangtrace attach` printed "no torch.distributed
    process found (pid 1: access denied ... run as root ...)": a wrong remedy, read as the
    cause. Such a process is no user's job: it is not listed."""
    import psutil

    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        psutil.Process(1).environ()
        pytest.skip("pid 1's environ is readable to root on this host")
    except psutil.AccessDenied:
        pass
    res = find_torch_processes()
    assert 1 not in [s["pid"] for s in res.skipped], res.skipped


def test_multiprocessing_helpers_that_inherited_rank_are_not_ranks():
    """multiprocessing's resource tracker inherits a rank's environment, RANK included;
    attach took it for 'rank 0' and blamed its pipe read (a blind job, 2026-12-04)."""
    port = 20000 + (os.getpid() + 11) % 20000
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tracker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)  # multiprocessing.resource_tracker"], env=env
    )
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.5)
        pids = {d["pid"] for d in find_torch_processes() if d["env"].get("MASTER_PORT") == str(port)}
        assert pids == {rank.pid}, pids
    finally:
        for p in (tracker, rank):
            p.kill()
            p.wait()


def test_spawned_children_of_a_launcher_with_rank_are_the_ranks_not_their_parent(tmp_path):
    """torch.multiprocessing.spawn from a launcher whose environment has RANK=0 (a cluster
    wrapper exported it): the children inherit RANK=0 and set their own in Python. They are
    the job's processes; attach took the launcher for rank 0 (blind helper 56)."""
    port = 20000 + (os.getpid() + 23) % 20000
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    launcher = (
        "import multiprocessing as mp, time\n"
        "def w(i):\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    ps = [ctx.Process(target=w, args=(i,)) for i in range(2)]\n"
        "    [p.start() for p in ps]\n"
        "    [p.join() for p in ps]\n"
    )
    script = tmp_path / "launcher.py"  # (spawn re-imports the main module: a file, not -c)
    script.write_text(launcher)
    p = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            found = [d for d in find_torch_processes() if d["env"].get("MASTER_PORT") == str(port)]
            if len(found) >= 2:
                break
            time.sleep(0.2)
        assert p.pid not in {d["pid"] for d in found}, found
        assert len(found) == 2 and all(d["ppid"] == p.pid for d in found), found
    finally:
        import psutil

        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()
