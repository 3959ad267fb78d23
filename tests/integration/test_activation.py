"""Activation: which processes get a ring file, and which get nothing at all.

Real processes only: a parent that starts children by subprocess, multiprocessing
'spawn' and 'fork', torchrun with a tiny gloo job, and programs run without tracing.
"""

import glob
import os
import re
import stat
import subprocess
import sys

import pytest

from jobs import base_env, free_port, kill_all
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")


def run(cmd, env, timeout=120, cwd=None):
    """Run ``cmd`` to completion; return (returncode, stdout, stderr). Killed in finally."""
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        kill_all([p])
    return p.returncode, out, err


def rings(run_dir):
    """{pid: RingData} of every ring file in ``run_dir``."""
    out = {}
    for path in glob.glob(os.path.join(str(run_dir), "ring-*.htr")):
        r = R.read_ring(path)
        assert path.endswith("-%d.htr" % r.header["pid"])
        out[r.header["pid"]] = r
    return out


def phases(ring):
    return [r["phase"] for r in ring.records if r["kind"] == "phase_enter"]


def colls(ring):
    return [(r["op"], r["numel"], r["state"]) for r in ring.records if r["kind"] == "collective"]


def test_children_of_every_start_method_get_their_own_ring(tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err = run(
        [sys.executable, os.path.join(SCRIPTS, "act_children.py"), "--torch", str(free_port())],
        base_env(run_dir),
    )
    assert rc == 0, err
    assert "hangtrace" not in err, err
    pids = {}
    for line in out.splitlines():
        how, pid, code = line.split()[:3]
        assert code == "0", line
        pids[how] = int(pid)
    assert sorted(pids) == ["fork", "fork-torch", "parent", "spawn", "subprocess"]
    rs = rings(run_dir)
    for how, pid in pids.items():
        assert pid in rs, "no ring for the %s child (pid %d): %s" % (how, pid, sorted(rs))
        h = rs[pid].header
        assert h["pid"] == pid and h["state"] == F.ST_EXITED and h["exit_code"] == 0, (how, h)
        if how != "parent":
            assert h["ppid"] == pids["parent"], how
    parent = rs[pids["parent"]]
    # the parent's ring holds only the parent's records: nothing of the forked children
    assert phases(parent) == ["parent"]
    assert colls(parent) == []
    assert [e["event"] for e in parent.events] == [
        "start",
        "exiting",
        "exit",
    ]  # (exiting: its program returned)
    # each multiprocessing child records its phase and step into its own file
    for how in ("spawn", "fork"):
        r = rs[pids[how]]
        assert phases(r) == ["child-" + how], how
        assert r.header["step"] == 11
        assert r.events[0]["event"] == "start"
    assert rs[pids["fork"]].events[0]["forked_from"] == pids["parent"]
    assert rs[pids["spawn"]].events[0]["forked_from"] is None
    # the forked torch child records its collective (wrappers inherited from the parent)
    ft = rs[pids["fork-torch"]]
    assert colls(ft) == [("all_reduce", 3, "completed")]
    assert ft.header["rank"] == 0 and ft.header["world_size"] == 1
    # a forked child writes its exit record (multiprocessing ends it with os._exit)
    assert [e["event"] for e in ft.events][-1] == "exit"
    # the child signal files are the child's own; a process that exits cleanly removes
    # them when they stayed empty (issue 40): a file left is one of these processes' own,
    # and none of them left an empty one
    stacks = os.path.join(str(run_dir), "stacks")
    for n in os.listdir(stacks) if os.path.isdir(stacks) else ():
        if n.startswith("sigterm-"):
            assert int(n.rsplit("-", 1)[1][:-4]) in pids.values(), n
            assert os.path.getsize(os.path.join(stacks, n)) or int(n.rsplit("-", 1)[1][:-4]) not in (
                pids["parent"],
                pids["spawn"],
                pids["subprocess"],
            ), n


def test_torchrun_workers_are_traced(tmp_path):
    run_dir = tmp_path / "run"
    env = base_env(run_dir, OMP_NUM_THREADS=1)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--nnodes",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        os.path.join(SCRIPTS, "act_gloo.py"),
    ]
    rc, out, err = run(cmd, env)
    assert rc == 0, err
    # both workers share the stdout pipe: their lines may interleave
    results = sorted(re.findall(r"result (\d) (\d+) ", out))
    assert [r[0] for r in results] == ["0", "1"], out
    rs = rings(run_dir)
    workers = {r.header["rank"]: r for r in rs.values() if r.header["rank"] >= 0}
    assert sorted(workers) == [0, 1]
    for rank, r in workers.items():
        assert r.header["pid"] == int(results[rank][1])
        assert r.header["world_size"] == 2 and r.header["local_rank"] == rank
        assert colls(r) == [("all_reduce", 2, "completed")]
        assert r.groups[0]["ranks"] == [0, 1]
    # the torchrun agent (a Python process too) has its own ring and is the workers' parent
    agents = [r for r in rs.values() if r.header["rank"] < 0]
    assert len(agents) == 1
    assert all(r.header["ppid"] == agents[0].header["pid"] for r in workers.values())
    run_ids = {r.header["run_id"] for r in rs.values()}
    assert len(run_ids) == 1


@pytest.mark.parametrize("value", [None, "0", ""])
def test_off_writes_nothing_and_imports_nothing(tmp_path, value):
    run_dir = tmp_path / "run"
    tmp = tmp_path / "tmp"
    run_dir.mkdir()
    tmp.mkdir()
    env = base_env(run_dir, traced=False, TMPDIR=tmp)
    if value is not None:
        env["HANGTRACE"] = value
    rc, out, err = run([sys.executable, os.path.join(SCRIPTS, "act_modules.py")], env, cwd=str(tmp_path))
    assert rc == 0, err
    lines = [l.split() for l in out.splitlines() if l.startswith("modules")]
    assert len(lines) == 2
    for _, pid, ht, torch_, ray_ in lines:
        assert (ht, torch_, ray_) == ("False", "False", "False")
    assert os.listdir(str(run_dir)) == []
    assert os.listdir(str(tmp)) == []
    assert err == ""


def test_on_does_not_import_torch_or_ray(tmp_path):
    run_dir = tmp_path / "run"
    rc, out, err = run([sys.executable, os.path.join(SCRIPTS, "act_modules.py")], base_env(run_dir))
    assert rc == 0, err
    lines = [l.split() for l in out.splitlines() if l.startswith("modules")]
    assert len(lines) == 2
    for _, pid, ht, torch_, ray_ in lines:
        assert (ht, torch_, ray_) == ("True", "False", "False")
    assert sorted(rings(run_dir)) == sorted(int(l[1]) for l in lines)


def test_helpers_do_not_trace_themselves(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rc, out, err = run(
        [sys.executable, os.path.join(SCRIPTS, "act_modules.py")], base_env(run_dir, HANGTRACE_HELPER=1)
    )
    assert rc == 0, err
    assert os.listdir(str(run_dir)) == []
    assert err == ""


def test_default_run_dir_is_private_and_shared(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = base_env(None, TMPDIR=tmp)
    rc, out, err = run([sys.executable, os.path.join(SCRIPTS, "act_modules.py")], env)
    assert rc == 0, err
    made = os.listdir(str(tmp))
    assert len(made) == 1 and made[0].startswith("hangtrace-"), made
    run_dir = tmp / made[0]
    assert stat.S_IMODE(os.stat(str(run_dir)).st_mode) == 0o700
    pids = [int(l.split()[1]) for l in out.splitlines() if l.startswith("modules")]
    rs = rings(run_dir)
    assert sorted(rs) == sorted(pids)
    child, parent = pids
    assert rs[child].header["ppid"] == parent
    assert made[0] == "hangtrace-" + rs[parent].header["run_id"]
    assert rs[child].header["run_id"] == rs[parent].header["run_id"]


def test_relative_run_dir_is_shared_by_children_in_other_directories(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rc, out, err = run(
        [sys.executable, os.path.join(SCRIPTS, "act_modules.py"), str(elsewhere)],
        base_env("rel/run"),
        cwd=str(tmp_path),
    )
    assert rc == 0, err
    pids = [int(l.split()[1]) for l in out.splitlines() if l.startswith("modules")]
    assert sorted(rings(tmp_path / "rel" / "run")) == sorted(pids)
    assert not (elsewhere / "rel").exists()


def test_forked_child_without_a_ring_leaves_the_parents_alone(tmp_path):
    run_dir = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "act_fork_fail.py")],
        env=base_env(run_dir),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        from jobs import wait_line

        child = wait_line(p, "child").split()
        wait_line(p, "checked-in")
        # the untraced child behaves as without tracing: uncaught exception -> 1
        assert child[2] == "1"
        (parent,) = rings(str(run_dir) + "-moved").values()
        assert parent.header["pid"] == p.pid
        assert parent.header["state"] == F.ST_RUNNING and parent.header["step"] == -1
        assert [e["event"] for e in parent.events] == ["start"]
        # the parent's own start-up memory sample (issue 5) aside, only its start event
        assert [r["kind"] for r in parent.records if r["kind"] != "memory"] == ["event"]
        assert all(r["step"] is None and r["phase"] is None for r in parent.records)
        assert parent.warnings == []
        # nothing of the child's in the parent's signal files either
        p.stdin.close()
        assert p.wait(timeout=30) == 0
        err = p.stderr.read()
    finally:
        kill_all([p])
    assert "tracing disabled in forked child %s" % child[1] in err
    assert err.count("hangtrace:") == 1, err


def test_child_started_with_preexec_fn_is_traced(tmp_path):
    """subprocess with preexec_fn runs fork hooks in the child before exec: the ring made
    there must not keep the exec'd program from tracing (same pid, same start time)."""
    prog = (
        "import subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-c', 'from hangtrace import tracer; "
        "tracer.step(7); print(tracer.enabled())'], preexec_fn=lambda: None, "
        "capture_output=True, text=True)\n"
        "print(p.stdout.strip(), p.stderr.strip())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", prog], env=base_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "True", out
    rings = [R.read_ring(p) for p in glob.glob(str(tmp_path / "ring-*.htr"))]
    assert len(rings) == 2
    assert sorted(r.header["step"] for r in rings) == [-1, 7]
