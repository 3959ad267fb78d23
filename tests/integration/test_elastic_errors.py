"""Issue 9 item 2: torchelastic's error file. A torchrun job whose rank 1 fails under
``@record`` (tests/integration/scripts/elastic_record.py): the verdict names the exception
and, when our own records of that rank lack it (a child of the rank raised and the rank
exited 3), says it was read from torchelastic's error file."""

import os
import shutil

import pytest

from test_examples import run_example

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "elastic_record.py")
TORCHRUN = shutil.which("torchrun")


def _first(tmp_path, mode):
    if TORCHRUN is None:
        pytest.skip("torchrun not on PATH")
    r = run_example(
        tmp_path,
        "none",
        stall_s=8,
        launcher_cmd=[TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--mode", mode],
    )
    ds = r.diagnoses()
    assert ds, r.why()
    return ds[0], r


def test_child_of_rank_raised_error_file_names_it(tmp_path):
    d, r = _first(tmp_path, "child")
    assert (d["kind"], d["culprit_ranks"], d["cause"]) == ("dead-rank", [1], "exception"), d["summary"]
    assert "ValueError: bad shard 7: expected 128 rows, got 0" in d["summary"], d["summary"]
    assert "read from torchelastic's error file" in d["summary"], d["summary"]
    assert "error.json" in d["summary"]


def test_rank_raised_own_record_names_it(tmp_path):
    d, r = _first(tmp_path, "self")
    assert (d["kind"], d["culprit_ranks"], d["cause"]) == ("dead-rank", [1], "exception"), d["summary"]
    assert "KeyError" in d["summary"] and "tokenizer vocab" in d["summary"], d["summary"]
    # our own excepthook record has it: the error file is not the source named
    assert "torchelastic's error file" not in d["summary"], d["summary"]
