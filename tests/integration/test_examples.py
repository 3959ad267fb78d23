"""Every fault of examples/train_faults.py through the real CLI, verdict checked exactly.

Each test runs ``python -m hangtrace run --stall-s S --stop-on-stall --dir RUN --
python examples/train_faults.py --fault F [--world-size N]`` (real gloo ranks, real
watcher, real py-spy stacks) and reads the verdict hangtrace stored: the newest
``RUN/snapshots/*/diagnosis.json``. Hang faults must print the console verdict block and
its ``next:`` line; ``slow`` and ``none`` must finish with status 0 and no hang verdict.

Each run costs 10-25 s on 2 cores (``import torch`` in every rank dominates). The
example's gloo timeout is lowered to 90 s so a run hangtrace failed to stop still ends;
every process is killed in ``finally`` (the job's launcher is a session leader: its
process group holds the ranks).
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time


from jobs import REPO, base_env, long_only

EXAMPLE = os.path.join(REPO, "examples", "train_faults.py")
STALL_S = 8  # import torch in 4 ranks on 2 busy cores can take ~6 s before step 1
RUN_TIMEOUT_S = 150
HANG_KINDS = (
    "collective-mismatch",
    "skipped-collective",
    "cross-group-deadlock",
    "stuck-outside-collective",
    "dead-rank",
    "transport-error",
    "unknown",
)


class Run:
    def __init__(self, rc, out, err, run_dir, elapsed):
        self.rc, self.out, self.err, self.run_dir, self.elapsed = rc, out, err, run_dir, elapsed

    def diagnoses(self):
        """Every stored diagnosis, oldest first (snapshot folders sort by time)."""
        out = []
        for path in sorted(glob.glob(os.path.join(self.run_dir, "snapshots", "*", "diagnosis.json"))):
            with open(path) as f:
                out.append(json.load(f))
        return out

    def verdict(self):
        ds = self.diagnoses()
        assert ds, "no diagnosis.json in %s\nstderr:\n%s" % (self.run_dir, self.err[-4000:])
        return ds[-1]

    def why(self):
        return "rc=%s %.1fs\nstdout:\n%s\nstderr:\n%s" % (
            self.rc,
            self.elapsed,
            self.out[-3000:],
            self.err[-6000:],
        )


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def run_example(tmp_path, fault, world=None, stall_s=STALL_S, extra=(), launcher_cmd=None):
    """``launcher_cmd``: the command that starts the example (default ``python EXAMPLE``),
    e.g. torchrun's."""
    run_dir = str(tmp_path / "run")
    cmd = (
        [
            sys.executable,
            "-m",
            "hangtrace",
            "run",
            "--stall-s",
            str(stall_s),
            "--stop-on-stall",
            "--dir",
            run_dir,
            "--",
        ]
        + list(launcher_cmd or [sys.executable, EXAMPLE])
        + ["--fault", fault, "--timeout-s", "90"]
    )
    if world is not None:
        cmd += ["--world-size", str(world)]
    cmd += list(extra)
    env = base_env(traced=False)
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    out = err = ""
    try:
        out, err = p.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        # the job runs in its own session (hangtrace run starts it so): its launcher prints
        # its pid, which is also the process group of every rank
        launchers = re.findall(r"launcher pid (\d+)", out or "")
        if p.poll() is None:
            _kill_group(p.pid)
            o2, e2 = p.communicate()
            out, err = (out or "") + (o2 or ""), (err or "") + (e2 or "")
            launchers += re.findall(r"launcher pid (\d+)", o2 or "")
        for pid in launchers:
            _kill_group(int(pid))
    r = Run(p.returncode, out, err, run_dir, time.monotonic() - t0)
    assert r.elapsed < RUN_TIMEOUT_S, "run did not finish in %d s: %s" % (RUN_TIMEOUT_S, r.why())
    return r


def assert_console_verdict(r):
    assert "==== hangtrace verdict ====" in r.err, r.why()
    assert re.search(r"^next:\s+hangtrace analyze ", r.err, re.M), r.why()


def group_desc(d):
    return (d.get("details") or {}).get("group_desc")


def check_hang(r, kind, culprits):
    d = r.verdict()
    assert (d["kind"], d["culprit_ranks"]) == (kind, culprits), "%s\n%s\n%s" % (
        d["kind"],
        d["summary"],
        r.why(),
    )
    assert_console_verdict(r)
    assert d["summary"] in " ".join(r.err.split()), "stored verdict is not the one printed"
    return d


# --- hangs -------------------------------------------------------------------------------


def test_rank0_checkpoint(tmp_path):
    r = run_example(tmp_path, "rank0-checkpoint", 4)
    d = check_hang(r, "collective-mismatch", [0])
    assert d["group"] == "0" and group_desc(d) == "default_pg" and d["group_ranks"] == [0, 1, 2, 3]
    assert (d["op"], d["phase"], d["step"]) == ("all_reduce", "checkpoint", 3)
    sigs = {s["op"]: s for s in d["details"]["signatures"]}
    assert sigs["all_reduce"]["ranks"] == [0] and sigs["all_gather"]["ranks"] == [1, 2, 3]
    assert (sigs["all_gather"]["phase"], sigs["all_gather"]["step"]) == ("rollout", 4)
    s = d["summary"]
    assert (
        "phase 'checkpoint', step 3" in s and "ranks 1-3: all_gather" in s and "phase 'rollout', step 4" in s
    ), s
    assert r.rc == 128 + signal.SIGTERM, r.why()  # --stop-on-stall stopped the job
    assert "the job was stopped after the verdict above (--stop-on-stall): its exit status 143" in r.err, (
        r.why()
    )


@long_only("the demo's fault: test_launch_matrix and test_ray run it")
def test_cp_extra_microbatch(tmp_path):
    r = run_example(tmp_path, "cp-extra-microbatch", 4)
    d = check_hang(r, "skipped-collective", [1])
    assert d["cause"] == "extra-collective"
    assert group_desc(d) == "cp0" and d["group_ranks"] == [0, 1]
    assert (d["op"], d["phase"], d["step"]) == ("all_reduce", "train", 2)
    ex = d["details"]["extra_collective"]
    counts = {int(k): v for k, v in ex["counts"].items()}
    base = ex["majority_count"]
    assert counts[1] == base + 1 and [counts[x] for x in (0, 2, 3)] == [base] * 3, ex
    assert ex["peers"] == [0] and ex["other_group_ranks"] == [2, 3]
    assert sorted(d["waiting_ranks"]) == [0, 2, 3]
    assert (
        "rank 1 issued one more all_reduce on group '%s' (cp0) than its peer rank 0 and than the "
        "other cp group(s)' ranks 2-3" % d["group"] in d["summary"]
    ), d["summary"]


@long_only("the unit goldens hold its verdict")
def test_decode_loop(tmp_path):
    r = run_example(tmp_path, "decode-loop", 4)
    d = check_hang(r, "collective-mismatch", [3])
    assert d["group"] == "0" and group_desc(d) == "default_pg"
    assert (d["op"], d["phase"], d["step"]) == ("all_gather", "rollout", 2)
    sigs = {s["op"]: s["ranks"] for s in d["details"]["signatures"]}
    assert sigs == {"all_reduce": [0, 1, 2], "all_gather": [3]}


@long_only("the blind mismatch jobs (mp_broadcast_resized) run by default")
def test_mismatch(tmp_path):
    r = run_example(tmp_path, "mismatch", 4)
    d = check_hang(r, "collective-mismatch", [1])
    assert d["group"] == "0" and group_desc(d) == "default_pg"
    assert (d["op"], d["phase"], d["step"]) == ("broadcast", "train", 2)
    sigs = {s["op"]: s["ranks"] for s in d["details"]["signatures"]}
    assert sigs == {"all_reduce": [0, 2, 3], "broadcast": [1]}


def test_stuck_queue(tmp_path):
    r = run_example(tmp_path, "stuck-queue")
    d = check_hang(r, "stuck-outside-collective", [1])
    assert (d["phase"], d["step"]) == ("rollout", 2)
    assert d["waiting_ranks"] == [0]
    assert any("Queue.get" in f for f in d["frames"][:3]), d["frames"]
    assert "Queue.get" in d["summary"]
    # the dead producer thread is evidence
    assert any("reward-producer" in e for e in d["evidence"]), d["evidence"]


def test_kill_rank(tmp_path):
    r = run_example(tmp_path, "kill-rank")
    assert r.rc == 137, r.why()  # the launcher's status: 128 + SIGKILL
    d = check_hang(r, "dead-rank", [1])
    assert d["cause"] == "killed-without-record"
    assert group_desc(d) == "cp0" and (d["phase"], d["step"]) == ("train", 2)
    for dd in r.diagnoses():  # every verdict of the run names rank 1
        assert (dd["kind"], dd["culprit_ranks"]) == ("dead-rank", [1]), dd["summary"]
    casc = {c["rank"]: c for c in d["cascade"]}
    assert 0 in casc and casc[0]["victim"], d["cascade"]
    assert "stall detected" not in r.err


# --- no hang ------------------------------------------------------------------------------


def assert_no_hang(r):
    assert r.rc == 0, r.why()
    assert "stall detected" not in r.err and "death detected" not in r.err, r.why()
    assert "==== hangtrace verdict ====" not in r.err, r.why()
    hangs = [d for d in r.diagnoses() if d["kind"] in HANG_KINDS]
    assert not hangs, [d["summary"] for d in hangs]
    assert "command finished with status 0" in r.err


def test_slow_is_progressing(tmp_path):
    # 4 steps x 1 s of "compute" spread over each step's 2-4 micro-batches: every single
    # sleep is <= 0.5 s and collectives/phases progress in between, so a 4 s threshold is
    # never reached although the job runs for several times that
    r = run_example(tmp_path, "slow", stall_s=4, extra=("--steps", "4", "--step-sleep-s", "1.0"))
    assert_no_hang(r)
    assert "done: 4 steps" in r.out


def test_none(tmp_path):
    r = run_example(tmp_path, "none")
    assert_no_hang(r)
    assert "done: 6 steps" in r.out
