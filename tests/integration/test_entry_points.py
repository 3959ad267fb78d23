"""One verdict per incident, the same from every entry point (issue 38, item 2), and the
start-up grace under load for every launcher (item 4).

The job: the 3-rank torchrun + DDP + DataLoader job of scripts/ddp_loader_train.py, hung
with rank 2 in ``multiprocessing.Queue.get()`` (``queue``) or failed by a rank-0-only
metric all_reduce (``metric``: gloo aborts rank 0 on the size mismatch, torchrun SIGTERMs the
others, then exits 1 itself). The same incident goes through ``hangtrace run``, ``HANGTRACE=1``
(the auto-started node watcher, its verdict on the launching terminal: a pty here) and
``hangtrace dump``, and each stored snapshot through ``hangtrace analyze``: kind, culprit
ranks and paragraph must agree, the paragraph up to times, ages, pids, fds and paths, and
each entry point gives one verdict.

Default run (CI's budget): one ``HANGTRACE=1`` job of the queue hang: its watcher's verdict
(log and terminal), ``dump`` of the live job and ``analyze`` of the watcher's snapshot,
about 30 s. With ``HANGTRACE_LONG=1``: the three entry points on three jobs, both faults,
and the start-up grace under load.
"""

import json
import os
import pty
import re
import subprocess
import sys
import threading
import time

import pytest

from ddp_jobs import NPROC, SCRIPT, TORCHRUN, burner, stop
from jobs import REPO, base_env, free_port, long_only

pytestmark = pytest.mark.skipif(TORCHRUN is None, reason="torchrun not on PATH")

STALL_S = 5
FAULTS = {
    "queue": ("--hang-rank", "2", "--hang-step", "8"),
    "metric": ("--metric-step", "8"),
}
WANT = {
    "queue": ("stuck-outside-collective", [2], "Queue.get"),
    "metric": ("dead-rank", [0], "all_reduce"),
}

#: what may differ between two snapshots of one incident (the test's own list)
_VARYING = [
    (r"\b(pid|pids) \d+", r"\1 N"),
    (r"(pipe|socket):\[\d+\]", r"\1:[N]"),
    (r"\bfd \d+", "fd N"),
    (r"0x[0-9a-f]+", "0xN"),
    (r"/[\w./+-]+", "PATH"),
    (r"\b\d+(\.\d+)? ?(ms|s|min)\b", "T"),
]


def normalized(text):
    for pat, rep in _VARYING:
        text = re.sub(pat, rep, text)
    return " ".join(text.split())


def key(d):
    return (d["kind"], sorted(d["culprit_ranks"]), normalized(d["summary"]))


def _cli(*args, timeout=180):
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace", *args],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def analyze(snap):
    return json.loads(_cli("analyze", snap, "--json"))


def stored(snap):
    with open(os.path.join(snap, "diagnosis.json")) as f:
        return json.load(f)


def _job_cmd(tmp_path, fault):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return [
        TORCHRUN,
        "--nproc-per-node",
        str(NPROC),
        "--master-port",
        str(free_port()),
        SCRIPT,
        "--out",
        str(out),
        *FAULTS[fault],
    ]


class Terminal:
    """A pty whose slave is the job's stderr; a thread drains the master (a full pty would
    block the job's writes)."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        self.chunks = []
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        while True:
            try:
                b = os.read(self.master, 65536)
            except OSError:
                return
            if not b:
                return
            self.chunks.append(b)

    def text(self):
        return b"".join(self.chunks).decode("utf-8", "replace").replace("\r\n", "\n")

    def close(self):
        for fd in (self.slave, self.master):
            try:
                os.close(fd)
            except OSError:
                pass


def watcher_verdicts(run):
    """(verdicts given, the snapshots of the verdicts and their replacements, the log's text)
    of the node watcher's log: one verdict per incident; a later, different one of the same
    incident is 'verdict (replaces ...)' (not counted), the same one 'verdict unchanged'."""
    logs = [run / f for f in os.listdir(run) if f.startswith("watcher-") and f.endswith(".log")]
    text = "".join(p.read_text() for p in logs)
    verdicts = re.findall(r"^\S+ verdict: (.*)$", text, re.M)
    snaps = re.findall(r"^\S+ snapshot: (\S+)$", text, re.M)
    return verdicts, snaps, text


def start_auto(tmp_path, fault, watch=True):
    """``HANGTRACE=1 torchrun ...`` with the job's stderr on a terminal; auto-watch on."""
    run = tmp_path / "run"
    run.mkdir()
    term = Terminal()
    env = base_env(run, traced=True, HANGTRACE_STALL_S=STALL_S, TMPDIR=tmp_path)
    env["HANGTRACE_AUTO_WATCH"] = "1" if watch else "0"
    with open(tmp_path / "job.log", "w") as log:
        job = subprocess.Popen(
            _job_cmd(tmp_path, fault),
            env=env,
            stdout=log,
            stderr=term.slave,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return job, run, term


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timeout waiting for %s" % what)


def check_wanted(fault, d):
    kind, culprits, word = WANT[fault]
    assert (d["kind"], d["culprit_ranks"]) == (kind, culprits), d["summary"]
    assert word in d["summary"], d["summary"]


@pytest.mark.timeout(240)
def test_hangtrace1_watcher_terminal_dump_and_analyze_give_one_verdict(tmp_path):
    job, run, term = start_auto(tmp_path, "queue")
    try:
        wait_for(lambda: watcher_verdicts(run)[0], 180, "the watcher's verdict")
        dumped = json.loads(_cli("dump", str(run), "--json"))
        time.sleep(3)  # more polls of the watcher: no second verdict for the same hang
        verdicts, snaps, log = watcher_verdicts(run)
        assert len(verdicts) == 1 and len(snaps) == 1, log
        watched = stored(snaps[0])
        check_wanted("queue", watched)
        assert key(dumped) == key(watched), (dumped["summary"], watched["summary"])
        assert key(analyze(snaps[0])) == key(watched)
        assert key(analyze(dumped["snapshot"])) == key(dumped)
        # the launching terminal got the verdict block too
        seen = wait_for(lambda: "==== hangtrace verdict" in term.text() and term.text(), 10, "the block")
        block = seen[seen.index("==== hangtrace verdict") :]
        assert normalized(watched["summary"].split(" Next: ")[0]) in normalized(block), block
        assert "hangtrace analyze %s" % snaps[0] in block
    finally:
        stop(job)
        term.close()
    wait_for(lambda: "watcher exits" in watcher_verdicts(run)[2], 30, "the watcher's exit")
    assert watcher_verdicts(run)[0] == verdicts  # the deaths of the stopped job add nothing


# --- the three entry points, one job each (HANGTRACE_LONG=1) ----------------------------------


def via_run(tmp_path, fault):
    """``hangtrace run --stall-s 5 --stop-on-stall``: (its verdict, how many blocks it printed)."""
    sub = tmp_path / "a"
    sub.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "hangtrace", "run", "--stall-s", str(STALL_S), "--stop-on-stall"]
        + ["--dir", str(sub / "run"), "--"]
        + _job_cmd(sub, fault),
        env=base_env(traced=False, TMPDIR=tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    snaps = sorted((sub / "run" / "snapshots").iterdir())
    blocks = p.stderr.count("==== hangtrace verdict ====")  # (a replacing one says so: not counted)
    return stored(str(snaps[-1])), blocks, p.stderr, str(snaps[-1])


def via_auto(tmp_path, fault):
    sub = tmp_path / "b"
    sub.mkdir()
    job, run, term = start_auto(sub, fault)
    try:
        wait_for(lambda: watcher_verdicts(run)[0], 180, "the watcher's verdict")
        time.sleep(6)  # the launcher's exit, more polls
    finally:
        stop(job)
        term.close()
    verdicts, snaps, log = watcher_verdicts(run)
    return stored(snaps[-1]), len(verdicts), log + "\nterminal:\n" + term.text(), snaps[-1]


def via_dump(tmp_path, fault):
    sub = tmp_path / "c"
    sub.mkdir()
    job, run, term = start_auto(sub, fault, watch=False)
    try:
        wait_for(lambda: (sub / "out" / "hanging").exists(), 180, "the fault")
        time.sleep(STALL_S + 3)
        d = json.loads(_cli("dump", str(run), "--json"))
    finally:
        stop(job)
        term.close()
    return d, 1, "", d["snapshot"]


@long_only("test_hangtrace1_watcher_terminal_dump_and_analyze_give_one_verdict: watcher, dump, analyze")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", ["queue", "metric"])
def test_the_same_incident_through_run_hangtrace1_and_dump_is_one_identical_verdict(tmp_path, fault):
    got = {
        name: how(tmp_path, fault) for name, how in (("run", via_run), ("auto", via_auto), ("dump", via_dump))
    }
    for name, (d, n, text, snap) in got.items():
        print("\n%s: %s %s (%d verdict(s))\n  %s" % (name, d["kind"], d["culprit_ranks"], n, d["summary"]))
        assert n == 1, "%s gave %d verdicts\n%s" % (name, n, text)
        check_wanted(fault, d)
        assert key(analyze(snap)) == key(d)
    keys = {name: key(d) for name, (d, _, _, _) in got.items()}
    assert keys["run"] == keys["auto"] == keys["dump"], keys


# --- item 4: the start-up grace under load, every launcher (HANGTRACE_LONG=1) -----------------


@long_only("the start-up grace: tests/unit/test_watcher.py (startup, helpers, launchers)")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_a_healthy_short_job_started_under_load_gets_no_stall(tmp_path, launcher):
    from test_examples import EXAMPLE, run_example

    hot = [burner() for _ in range(4)]
    try:
        time.sleep(5)
        load0 = os.getloadavg()[0]
        if launcher == "torchrun":
            r = run_example(
                tmp_path,
                "none",
                stall_s=STALL_S,
                extra=("--loader-workers", "2"),
                launcher_cmd=[TORCHRUN, "--standalone", "--nproc-per-node", "3", EXAMPLE],
            )
        else:  # torch.multiprocessing.spawn, RANK/WORLD_SIZE/MASTER_* set in the parent
            r = run_example(
                tmp_path,
                "none",
                world=3,
                stall_s=STALL_S,
                extra=("--launcher", "spawn", "--loader-workers", "2"),
            )
        load1 = os.getloadavg()[0]
    finally:
        stop(*hot)
    print("\n%s: load %.1f -> %.1f, %.1f s, rc %s" % (launcher, load0, load1, r.elapsed, r.rc))
    assert r.rc == 0, r.why()
    assert "stall detected" not in r.err and not r.diagnoses(), r.why()
    assert max(load0, load1) >= 4, "the machine was not loaded (load %.1f, %.1f)" % (load0, load1)
