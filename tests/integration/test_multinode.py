"""Issue 39: one job-wide verdict across the nodes of a torchrun job without Ray.

Two nodes are simulated on this machine as two torchrun agents (``--nnodes 2 --node-rank
0/1``, one free master port: node 0's agent hosts the job's TCPStore), 2 ranks each, each
node with its own run directory and its own watcher, as on a real cluster. The default run
holds one case (the sleeping rank under ``hangtrace run``, about 50 s); the others run with
``HANGTRACE_MULTINODE=all`` or ``HANGTRACE_LONG=1`` (docs/MULTINODE.md gives the command).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ddp_jobs import descendants, stop
from jobs import REPO, base_env, free_port

SCRIPT = os.path.join(REPO, "tests", "integration", "scripts", "mn_ddp.py")
TORCHRUN = shutil.which("torchrun")
ALL = os.environ.get("HANGTRACE_MULTINODE") == "all" or os.environ.get("HANGTRACE_LONG") == "1"
need_all = pytest.mark.skipif(
    not ALL, reason="multi-node case beyond the default one: HANGTRACE_MULTINODE=all or HANGTRACE_LONG=1"
)
STALL_S = 8


def start_nodes(tmp_path, mode, args=(), env_extra=None, rdzv="static", terms=None):
    """Two torchrun agents as nodes 0 and 1 (``mode`` 'run': each under ``hangtrace run``;
    'auto': HANGTRACE=1 with the auto-started watcher; ``rdzv`` 'static': ``--node-rank`` and
    ``--master-addr/--master-port``, 'c10d': ``--rdzv-backend c10d``, the rendezvous assigns
    the node ranks and its store is the job's; ``terms``: one terminal per node, its
    agent's stderr, as where a user typed the command). Returns (procs, run dirs, out dir)."""
    if TORCHRUN is None:
        pytest.skip("torchrun not on PATH")
    port, out = free_port(), tmp_path / "out"
    out.mkdir()
    (tmp_path / "port").write_text(str(port))
    procs, dirs = [], []
    for n in (0, 1):
        run = tmp_path / ("node%d" % n)
        dirs.append(run)
        cmd = cmd_of(n, port, out, args, rdzv)
        extra = dict(HANGTRACE_STARTUP_STALL_S=90, OMP_NUM_THREADS=1, **(env_extra or {}))
        if mode == "run":
            env = base_env(traced=False, **extra)
            cmd = [sys.executable, "-m", "hangtrace", "run", "--stall-s", str(STALL_S), "--stop-on-stall"]
            cmd += ["--dir", str(run), "--"] + cmd_of(n, port, out, args, rdzv)
        else:
            run.mkdir()
            env = base_env(run, HANGTRACE_AUTO_WATCH=1, HANGTRACE_STALL_S=STALL_S, **extra)
        log = open(tmp_path / ("node%d.log" % n), "w")
        err = terms[n].slave if terms else subprocess.STDOUT
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=err, start_new_session=True))
        log.close()
    return procs, dirs, out


def cmd_of(n, port, out, args, rdzv="static"):
    cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2"]
    if rdzv == "c10d":
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", "ht39"]
    else:
        cmd += ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return cmd + [SCRIPT, "--out", str(out)] + list(args)


def analyze(*run_dirs):
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "analyze", "--json"] + [str(d) for d in run_dirs],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def logs(tmp_path):
    return "\n".join(
        "---- %s\n%s" % (p.name, p.read_text()[-4000:]) for p in sorted(tmp_path.glob("node*.log"))
    ) + "".join(
        "\n---- %s\n%s" % (w, w.read_text()[-3000:]) for w in sorted(tmp_path.glob("node*/watcher-*.log"))
    )


def wait_for(pred, timeout, procs=(), why=lambda: ""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError("timed out\n%s" % why())


def check_sleeper(d, why):
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [3]), "%s\n%s" % (
        d["summary"],
        why,
    )
    assert d["details"]["nodes"]["culprits"] == {"3": "node 1 (%s)" % os.uname().nodename}, d["details"]
    assert any("mn_ddp.py:26" in f for f in d["frames"][:2]), d["frames"]
    assert "Rank 3 is on node 1" in d["summary"], d["summary"]


def test_sleeping_rank_on_node1_under_hangtrace_run(tmp_path):
    """Rank 3 (node 1) asleep outside collectives: both nodes' analyze name it, its node, its line."""
    procs, dirs, _ = start_nodes(tmp_path, "run", ["--sleep-rank", "3", "--sleep-step", "15"])
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    for run in dirs:
        check_sleeper(analyze(run), why)
    assert "Rank 3 is on node 1" in " ".join((tmp_path / "node0.log").read_text().split()), why
    assert list(dirs[1].glob("snapshots/*/nodes/job_verdict.json")), why  # node 0's word, on node 1
    for n, run in enumerate(dirs):  # the meeting's notes: in the watcher log, not on the console
        console = (tmp_path / ("node%d.log" % n)).read_text()
        assert "node meeting" not in console and "incident " not in console, why
        assert "node meeting: registered node %d" % n in watcher_log(run), why
    # node-local run directories copied from both nodes (their own snapshots, without the
    # other node's parts) analysed as one job: `hangtrace analyze DIR1 DIR2`
    copies = []
    for n, run in enumerate(dirs):
        copies.append(tmp_path / ("copy%d" % n))
        shutil.copytree(run, copies[-1], ignore=shutil.ignore_patterns("nodes"))
    assert check_sleeper(analyze(*copies), why) is None


@need_all
def test_sleeping_rank_on_node1_with_the_c10d_rendezvous(tmp_path):
    """The same job launched as multi-node jobs mostly are (``--rdzv-backend c10d
    --rdzv-endpoint``): the rendezvous numbers the nodes, and the ranks' store (MASTER_PORT:
    torch's dynamic rendezvous has its node 0 agent host one on a free port) is where the
    watchers meet. Both nodes' analyze name rank 3, its node (the rendezvous's node 1,
    whichever agent that is) and its line."""
    procs, dirs, _ = start_nodes(tmp_path, "run", ["--sleep-rank", "3", "--sleep-step", "15"], rdzv="c10d")
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    for run in dirs:
        check_sleeper(analyze(run), why)
    logs_ = [watcher_log(run) for run in dirs]
    assert sorted("node meeting: registered node 1" in w for w in logs_) == [False, True], why
    assert any("node meeting: registered node 0" in w for w in logs_), why
    # both meet in the ranks' store (MASTER_ADDR:MASTER_PORT): with torch's c10d rendezvous
    # one that the rendezvous's node 0 agent hosts on a free port, not the endpoint's
    stores = {w.split("; store ")[1].split("\n")[0] for w in logs_ if "; store " in w}
    port = int((tmp_path / "port").read_text())
    assert len(stores) == 1 and not stores & {"127.0.0.1:%d" % port, "localhost:%d" % port}, why
    for run in dirs:  # the verdict is job-wide on both: node 0's word stored on the other
        assert list(run.glob("snapshots/*/nodes/nodes.json")), why


@need_all
def test_sleeping_rank_on_node1_under_auto_watch(tmp_path):
    """HANGTRACE=1 on each node, each agent's stderr a terminal: both terminals show the
    job-wide verdict (the auto-started watcher writes it there), `dump` on node 1 and both
    nodes' `analyze` name rank 3, its node and its line."""
    from test_entry_points import Terminal  # (a pty drained by a thread)

    terms = [Terminal(), Terminal()]
    try:
        _auto_watch_case(tmp_path, terms)
    finally:
        for t in terms:
            t.close()


def _auto_watch_case(tmp_path, terms):
    procs, dirs, _ = start_nodes(tmp_path, "auto", ["--sleep-rank", "3", "--sleep-step", "15"], terms=terms)
    try:
        wait_for(
            lambda: (
                all(list(d.glob("snapshots/*/nodes/nodes.json")) for d in dirs)
                and all("verdict:" in "".join(w.read_text() for w in d.glob("watcher-*.log")) for d in dirs)
            ),
            240,
            why=lambda: logs(tmp_path),
        )
        # `hangtrace dump` on node 1 while the job still hangs: node 0's watcher answers
        r = subprocess.run(
            [sys.executable, "-m", "hangtrace", "dump", "--json", str(dirs[1])],
            env=base_env(traced=False),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr
        dumped = json.loads(r.stdout)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    check_sleeper(dumped, why + r.stderr)
    assert dumped["details"]["nodes"]["unseen"] == [], dumped["details"]
    for run in dirs:
        check_sleeper(analyze(run), why)
    for n, t in enumerate(terms):  # the verdict on each node's terminal, job-wide
        text = " ".join(t.text().split())
        assert "hangtrace verdict (node watcher)" in text and "Rank 3 is on node 1" in text, (
            "node %d's terminal:\n%s\n%s" % (n, t.text()[-3000:], why)
        )


@need_all
def test_node1_killed(tmp_path):
    """Node 1's ranks and agent SIGKILLed: node 0 names the dead ranks and their node."""
    procs, dirs, out = start_nodes(tmp_path, "run")
    try:
        wait_for(
            lambda: (out / "step").exists() and int((out / "step").read_text() or 0) >= 20,
            180,
            why=lambda: logs(tmp_path),
        )
        time.sleep(2 * 2.5)  # two beats of the meeting: every node registered
        for pid in descendants(procs[1].pid):  # node 1's torchrun agent and its ranks, not its watcher
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in procs:
            p.wait(timeout=180)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    d = analyze(dirs[0])
    assert d["kind"] == "dead-rank" and sorted(d["culprit_ranks"]) in ([2], [3], [2, 3]), "%s\n%s" % (
        d["summary"],
        why,
    )
    assert set(d["details"]["nodes"]["culprits"].values()) == {"node 1 (%s)" % os.uname().nodename}, d[
        "details"
    ]


@need_all
def test_store_gone(tmp_path):
    """Node 0 (the store's host) killed whole: node 1's node-local verdict names what it could not see."""
    procs, dirs, out = start_nodes(tmp_path, "run")
    try:
        wait_for(
            lambda: (out / "step").exists() and int((out / "step").read_text() or 0) >= 20,
            180,
            why=lambda: logs(tmp_path),
        )
        tree = descendants(procs[0].pid)
        os.killpg(procs[0].pid, signal.SIGKILL)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        procs[1].wait(timeout=180)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    d = analyze(dirs[1])
    unseen = d["details"]["nodes"]["unseen"]
    assert unseen and unseen[0].startswith("node 0 (") and "ranks 0-1" in unseen[0], "%s\n%s" % (
        d["summary"],
        why,
    )
    assert "Not seen" in d["summary"], d["summary"]
    # node 0 died whole: its ranks are the root, lost with their node (never "no rank is dead")
    assert (d["kind"], d["culprit_ranks"]) == ("dead-rank", [0, 1]), "%s\n%s" % (d["summary"], why)
    assert [n["node_rank"] for n in d["details"]["nodes"]["lost"]] == [0], d["details"]["nodes"]


def kill_node(proc):
    """SIGKILL a node whole: its `hangtrace run` (its watcher), the torchrun agent and the ranks."""
    tree = [proc.pid] + descendants(proc.pid)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@need_all
def test_node1_dies_whole_with_its_watcher(tmp_path):
    """Node 1's watcher, agent and ranks SIGKILLed together: node 0 names node 1 as gone, its
    watcher's last sign of life, and ranks 2-3 lost with it."""
    procs, dirs, out = start_nodes(tmp_path, "run")
    try:
        wait_for(
            lambda: (out / "step").exists() and int((out / "step").read_text() or 0) >= 20,
            180,
            why=lambda: logs(tmp_path),
        )
        time.sleep(2 * 2.5)  # two beats of the meeting: every node registered
        kill_node(procs[1])
        procs[0].wait(timeout=180)
    finally:
        stop(*procs)
    why = logs(tmp_path)
    d = analyze(dirs[0])
    msg = "%s\n%s" % (d["summary"], why)
    assert (d["kind"], d["cause"], d["culprit_ranks"]) == ("dead-rank", "killed-without-record", [2, 3]), msg
    host = os.uname().nodename
    assert [n["node_rank"] for n in d["details"]["nodes"]["lost"]] == [1], msg
    assert "node 1 (%s; ranks 2-3) went away whole" % host in d["summary"], msg
    unseen = d["details"]["nodes"]["unseen"]
    assert len(unseen) == 1 and unseen[0].startswith("node 1 (%s; ranks 2-3)" % host), msg
    assert "last sign of life" in unseen[0], msg
    assert "Next: look at node 1 (%s) itself" % host in " ".join(d["summary"].split()), msg
    assert "no rank is dead" not in d["summary"], msg


def watcher_log(run):
    return "".join(w.read_text() for w in run.glob("watcher-*.log"))


@need_all
def test_store_unreachable_meets_in_the_shared_directory(tmp_path):
    """The job's store stops answering (node 0's agent, its host, SIGSTOPped: the ranks no longer
    need it, the watchers' operations time out) and HANGTRACE_SHARED_DIR is given: the watchers
    meet there and both nodes' verdicts are job-wide, naming rank 3, its node and its line."""
    shared, go = tmp_path / "shared", tmp_path / "go"
    procs, dirs, out = start_nodes(
        tmp_path,
        "run",
        ["--sleep-rank", "3", "--sleep-step", "5", "--sleep-when", str(go)],
        env_extra={"HANGTRACE_SHARED_DIR": str(shared)},
    )
    tree = []
    try:
        wait_for(
            lambda: (out / "step").exists() and all("in the job's store" in watcher_log(d) for d in dirs),
            180,
            why=lambda: logs(tmp_path),
        )
        tree = descendants(procs[0].pid) + descendants(procs[1].pid)  # (node 0's ranks outlive its agent)
        # node 0's torchrun agent: it hosts the job's store
        agent = next(p for p in tree if b"torchrun" in open("/proc/%d/cmdline" % p, "rb").read())
        os.kill(agent, signal.SIGSTOP)
        wait_for(
            lambda: all("meeting in the shared directory" in watcher_log(d) for d in dirs),
            120,
            why=lambda: logs(tmp_path),
        )
        go.write_text("1")  # now rank 3 sleeps: the stall comes with the store unreachable
        for p in procs:
            p.wait(timeout=240)
    finally:
        stop(*procs)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    why = logs(tmp_path)
    for run in dirs:
        d = analyze(run)
        check_sleeper(d, why)
        assert d["details"]["nodes"]["unseen"] == [], "%s\n%s" % (d["details"]["nodes"], why)
        assert "the shared directory" in watcher_log(run), why
    assert list(shared.glob("hangtrace-*/*_part_1")), sorted(p.name for p in shared.rglob("*"))
    assert list(dirs[1].glob("snapshots/*/nodes/job_verdict.json")), why  # node 0's word, on node 1
