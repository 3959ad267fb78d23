"""Shared helpers of the per-rule analysis tests."""

import json

from hangtrace.tracer.diagnosis import KINDS, Diagnosis
from hangtrace.tracer.report.json import diagnosis_json

QUEUE_GET = (
    "get queue.py:171",
    "next_batch loader.py:22",
    "train_step train.py:38",
    "main train.py:90",
    "<module> train.py:100",
)


def check(d: Diagnosis, kind: str, culprits: list) -> Diagnosis:
    assert d.kind in KINDS
    assert (d.kind, d.culprit_ranks) == (kind, culprits), (d.kind, d.culprit_ranks, d.evidence)
    json.dumps(diagnosis_json(d))  # always serialisable
    return d
