"""Issue 37 with real 2-rank gloo jobs under ``hangtrace run --stall-s 10 --stop-on-stall``
(``scripts/tiebreak_job.py``; no ``tracer.step``, as under Lightning or HF Trainer):

* a rank-0-only ``barrier()`` in a callback meets rank 1's per-step broadcast: both hang;
  rank 0 is named by each rank's own history (``analyze/graph/history.py``), not both;
* a rank-0-only metric ``all_reduce`` meets DDP's C++ bucket all-reduce: gloo's size check
  aborts rank 0 (SIGABRT), rank 1 fails with "Connection reset by peer": a collective
  mismatch naming rank 0, not "Dead rank ... fatal-signal";
* rank 0 all-reduces 16 floats where the loop all-reduces 8: gloo aborts rank 1 (it receives
  more than it posted), which did not change: rank 0 is named, the abort is a consequence.
"""

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import REPO, base_env  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "tiebreak_job.py")


def _run(tmp_path, mode):
    """(the first snapshot's diagnosis document, all output) of the job in ``mode``."""
    pytest.importorskip("torch")
    run = tmp_path / "run"
    env = base_env(None, traced=False, PYTHONPATH=os.environ.get("PYTHONPATH", REPO))
    cmd = [sys.executable, "-m", "hangtrace", "run", "--dir", str(run), "--stall-s", "10", "--stop-on-stall"]
    cmd += ["--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT, mode]
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=240)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the job's session: hangtrace, torchrun and the ranks
        except ProcessLookupError:
            pass
        p.wait()
    docs = sorted(glob.glob(str(run / "snapshots" / "*" / "diagnosis.json")))
    assert docs, out[-3000:]
    with open(docs[0]) as f:
        return json.load(f), out


def test_a_rank_0_only_barrier_against_the_per_step_broadcast_names_rank_0(tmp_path):
    d, out = _run(tmp_path, "barrier")
    assert (d["kind"], d["culprit_ranks"]) == ("collective-mismatch", [0]), out[-3000:]
    hist = d["details"]["changed_by_history"]
    assert hist["ranks"] == [0] and hist["victims"] == [1] and not hist["left_loop"], hist
    assert "new to its loop" in d["summary"] and "on_step_end" in d["summary"], d["summary"]


def test_gloos_size_check_abort_at_a_call_the_peer_never_made_is_the_mismatch(tmp_path):
    d, out = _run(tmp_path, "metric")
    assert (d["kind"], d["culprit_ranks"]) == ("collective-mismatch", [0]), out[-3000:]
    ab = d["details"]["size_abort"]
    assert ab["rank"] == 0 and ab["peers"] == [1], ab
    assert "Received data size doesn't match expected size" in d["summary"], d["summary"]
    assert "Dead rank" not in d["summary"] and "faulthandler" not in d["summary"], d["summary"]
    # rank 1's bucket all-reduce is in the snapshot when its Flight Recorder was dumped before
    # it died (then the signatures are compared); else the call it never made decides
    if "call" in ab:
        assert ab["call"] == 1 and any("rank 1 failed in backward" in e for e in d["evidence"]), d["evidence"]
    else:
        assert {s["numel"]: s["ranks"] for s in d["details"]["signatures"]}[1] == [0], d["details"]
    assert any(c["rank"] == 1 and c["victim"] for c in d["cascade"]), d["cascade"]


def test_gloos_size_check_aborts_the_rank_that_did_not_change_and_the_other_is_named(tmp_path):
    d, out = _run(tmp_path, "size")
    assert (d["kind"], d["culprit_ranks"]) == ("collective-mismatch", [0]), out[-3000:]
    assert d["details"]["size_abort"]["rank"] == 1, d["details"]
    assert "which is not the rank that changed" in d["summary"], d["summary"]
    assert {s["numel"]: s["ranks"] for s in d["details"]["signatures"]} == {16: [0], 8: [1]}, d["details"]
