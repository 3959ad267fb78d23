"""Issue 9 item 2: a rank blocked in an asyncio event loop. The Flight Recorder agent
thread writes the loop's pending tasks with their await chains at snapshot time (the main
thread is inside the loop), and the stuck verdict names the innermost awaited task chain
(tests/integration/scripts/asyncio_stuck.py, under torchrun)."""

import glob
import json
import os
import shutil

import pytest

from test_examples import run_example

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "asyncio_stuck.py")
TORCHRUN = shutil.which("torchrun")


def test_rank_in_event_loop_names_awaited_task_chain(tmp_path):
    if TORCHRUN is None:
        pytest.skip("torchrun not on PATH")
    r = run_example(
        tmp_path, "none", stall_s=8, launcher_cmd=[TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT]
    )
    ds = r.diagnoses()
    assert ds, r.why()
    d = ds[0]
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [1]), d["summary"] + r.why()
    s = d["summary"]
    assert "task 'Task-1' (serve) awaits task 'fetch-weights' in wait (locks.py" in s, s
    assert "wait_for_weights" in s and "fetch_weights" in s and "awaiting <Future pending" in s, s
    files = glob.glob(os.path.join(r.run_dir, "snapshots", "*", "fr", "*.tasks.json"))
    assert len(files) == 1, files  # rank 0 runs no loop: no file
    with open(files[0]) as f:
        loops = json.load(f)["loops"]
    names = {t["name"] for t in loops[0]["tasks"]}
    assert names == {"Task-1", "fetch-weights"}, loops
