"""The verdict as ``hangtrace run`` prints it on a terminal (issue 41, ``report/console.py``):
golden console blocks at 80 and 120 columns of three incidents recorded from real small
jobs (``golden/console/README.md``: how each was recorded), the user-first place of a
stack (``analyze/stuck/place.py``), the one line of an incident and the width.

Regenerate the expected blocks (then read them, as a tired engineer would, before
committing): ``HANGTRACE_REGEN_GOLDEN=1 python -m pytest tests/unit/test_console_verdict.py``.
"""

import gzip
import io
import json
import os
from typing import Any, Dict

import pytest

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.analyze.stuck.place import place_of, place_text
from hangtrace.tracer.report.console import console_width, incident_line, verdict_block
from hangtrace.tracer.report.paragraph import verdict_paragraph
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "console")
REGEN = os.environ.get("HANGTRACE_REGEN_GOLDEN", "")
#: the three incidents: a rank blocked in multiprocessing Queue.get, a collective only
#: rank 0 issues, a Ray actor killed (each with what its verdict must say)
INCIDENTS = {
    "mpqueue_hang": ("Queue.get (queues.py:",),
    "rank0_only_collective": ("rank 0",),
    "ray_actor_death": ("Trainer 'trainer-1'", "Ray says"),
}


def _snapshot(name: str) -> Snapshot:
    with gzip.open(os.path.join(HERE, name + ".in.json.gz"), "rt") as f:
        d: Dict[str, Any] = json.load(f)
    d["processes"] = [ProcessInfo(**p) for p in d.get("processes") or ()]
    return Snapshot(**d)


def _block(name: str, width: int) -> str:
    snap = _snapshot(name)
    diag = diagnose(snap)
    snap_dir = "/run/%s/snapshots/20261207T120000.000" % name
    para = diag.summary or verdict_paragraph(diag)  # (what pipeline.dump_live hands the console)
    return verdict_block(para, snap_dir, "/run/" + name, width, snap_dir + "/timeline.json")


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", sorted(INCIDENTS))
def test_console_verdict_golden(name: str, width: int) -> None:
    got = _block(name, width)
    path = os.path.join(HERE, "%s.%d.txt" % (name, width))
    if REGEN:
        with open(path, "w") as f:
            f.write(got)
        return
    with open(path) as f:
        assert got == f.read(), "console verdict of %s at %d columns changed:\n%s" % (name, width, got)
    for line in got.splitlines():  # only a line ending in a path may stick out
        assert len(line) <= width or line.split()[-1].startswith("/"), line
    text = " ".join(got.split())
    for must in INCIDENTS[name]:
        assert must in text, (must, got)


def test_the_queue_hang_names_the_users_line_and_its_queue_get_first() -> None:
    """The issue's example: the rank blocked in a multiprocessing ``Queue.get`` is placed at
    its own line and the ``Queue.get`` it called, before the internals (folded)."""
    diag = diagnose(_snapshot("mpqueue_hang"))
    where = place_text(diag.details.get("place"))
    assert where.startswith("Trainer.next_batch (mpqueue_job.py:"), where
    assert " > Queue.get (queues.py:" in where, where
    assert where in verdict_paragraph(diag)


def _f(name: str, path: str, line: int) -> Dict[str, Any]:
    return {"name": name, "filename": path, "line": line}


SITE = "/usr/lib/python3.11/site-packages/"


def test_place_is_user_first_with_internals_folded() -> None:
    frames = [  # innermost first: a rank in multiprocessing's Queue.get
        _f("_recv", "/usr/lib/python3.11/multiprocessing/connection.py", 395),
        _f("_recv_bytes", "/usr/lib/python3.11/multiprocessing/connection.py", 430),
        _f("recv_bytes", "/usr/lib/python3.11/multiprocessing/connection.py", 216),
        _f("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 103),
        _f("wrapper", "/x/hangtrace/hooks/torchdist/torch_dist.py", 10),
        _f("Job.rollout", "/home/u/train.py", 267),
        _f("main", "/home/u/train.py", 300),
    ]
    p = place_of(frames)
    assert place_text(p) == (
        "Job.rollout (train.py:267) > Queue.get (queues.py:103) > (2 more) > _recv (connection.py:395)"
    )
    assert place_text(place_of(frames[3:])) == "Job.rollout (train.py:267) > Queue.get (queues.py:103)"
    assert place_text(place_of(frames[5:])) == "Job.rollout (train.py:267)"
    assert place_of(frames[:4]) is None and place_text(None) == ""


def test_a_lightning_rank_is_placed_where_it_waits_not_at_its_trainer_fit_line() -> None:
    """Lightning: the rank's only frame of its own is ``main``'s ``trainer.fit`` line; it
    waits in DDP's backward far below: the place names both."""
    frames = [
        _f("backward", SITE + "torch/autograd/__init__.py", 266),
        _f("backward", SITE + "torch/_tensor.py", 581),
        _f("backward", SITE + "lightning/pytorch/core/module.py", 1090),
        _f("_run_stage", SITE + "lightning/pytorch/trainer/trainer.py", 1030),
        _f("_fit_impl", SITE + "lightning/pytorch/trainer/trainer.py", 599),
        _f("Trainer.fit", SITE + "lightning/pytorch/trainer/trainer.py", 561),
        _f("main", "/home/u/fit.py", 62),
        _f("<module>", "/home/u/fit.py", 66),
    ]
    assert place_text(place_of(frames)) == (
        "main (fit.py:62) > Trainer.fit (trainer.py:561) > (4 more) > backward (__init__.py:266)"
    )


def test_a_real_lightning_rank_is_placed_where_it_waits() -> None:
    """The issue's Lightning case on a real run (``lightning_stuck_outside``: the blind
    job ``lt_stuck_outside.py``, rank 1 in a Callback's ``Queue.get``): rank 0's only frame
    of its own is ``main``'s ``trainer.fit`` line; it is placed from there to the broadcast
    it waits in, and rank 1 at its Callback's line and the ``Queue.get`` it called."""
    diag = diagnose(_snapshot("lightning_stuck_outside"))
    assert (diag.kind, diag.culprit_ranks) == ("stuck-outside-collective", [1])
    text = diag.summary or verdict_paragraph(diag)
    assert place_text(diag.details.get("place")).startswith(
        "UploadCallback.on_train_batch_end (lt_stuck_outside.py:53) > Queue.get (queue.py:"
    ), text
    waits = text[text.index("Rank 0 waits for it in ") : text.index(" Next: ")]  # its sentence
    assert waits.startswith("Rank 0 waits for it in broadcast seq 37 on group '0'"), text
    at = waits[waits.index(", at ") + 5 :]
    assert at.startswith("main (lt_stuck_outside.py:59) > Trainer.fit (trainer.py:"), text
    assert at.endswith("more) > broadcast (distributed_c10d.py:3151)."), text


def test_an_incident_is_one_line_that_fits() -> None:
    lines = ["rank 1 (pid 12210 on vm) vanished without a clean-exit record"] + [
        "pid %d on vm (Ray worker of rank 1) exited with code 1 because its peer went away and so on" % p
        for p in range(5)
    ]
    one = incident_line("death", lines, 80)
    assert "\n" not in one and len(one) <= 140, one
    assert one.startswith("hangtrace: death detected: rank 1 (pid 12210 on vm)") and "+5 more" in one, one
    assert incident_line("stall", ["no progress for 10.0 s"], 80) == (
        "hangtrace: stall detected: no progress for 10.0 s; collecting ..."
    )


def test_width_env_override_then_terminal_then_80(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANGTRACE_COLUMNS", "120")
    assert console_width(io.StringIO()) == 120
    monkeypatch.setenv("HANGTRACE_COLUMNS", "10")
    assert console_width(None) == 40  # never below 40
    monkeypatch.delenv("HANGTRACE_COLUMNS")
    assert console_width(io.StringIO()) == 80  # not a terminal
