"""Capture the analysis scenarios of the unit tests as golden inputs (a pytest plugin).

Loaded with ``-p golden.capture`` (tests/unit on ``sys.path``), it wraps
``hangtrace.tracer.analyze.diagnose.diagnose`` before the test modules import it, and
records every snapshot a test diagnoses (with the call's ``now_wall_ns`` / ``stall_s``)
under the test function's name. At the end of the session it writes one
``<test name>.in.json.gz`` per test into this folder: a list of
``{"call": {...}, "snapshot": {...}}``. ``test_golden.py`` turns the inputs into the
expected outputs (``<test name>.out.json``). Used only when regenerating
(``HANGTRACE_REGEN_GOLDEN=capture``, see test_golden.py).
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import os
from typing import Any, Dict, List, Optional

import pytest

import hangtrace.tracer.analyze.diagnose as _dmod

HERE = os.path.dirname(os.path.abspath(__file__))
_CASES: Dict[str, List[Dict[str, Any]]] = {}
_CURRENT: List[Optional[str]] = [None]
_ORIG = _dmod.diagnose


def snapshot_to_json(snap: Any) -> Dict[str, Any]:
    """A Snapshot as JSON-ready data (tuples become lists). Each process's ``summary`` is
    left out: ``ProcessInfo`` recomputes it from the records (its per-peer keys are tuples,
    which JSON cannot hold, and a stored dict would not be a RingSummary)."""
    d = dataclasses.asdict(snap)
    for p in d.get("processes") or ():
        p.pop("summary", None)
    return json.loads(json.dumps(d, default=list))


def _wrapped(
    snapshot: Any, now_wall_ns: Optional[int] = None, stall_s: Optional[float] = None, envs: Any = ()
) -> Any:
    name = _CURRENT[0]
    if name is not None:
        call: Dict[str, Any] = {"now_wall_ns": now_wall_ns, "stall_s": stall_s}
        if envs:  # (only then: inputs captured before envs existed stay byte-identical)
            from hangtrace.tracer.envfacts import to_json

            call["envs"] = [dict(to_json(pe), rank=pe.rank) for pe in envs]
        _CASES.setdefault(name, []).append(
            {"call": call, "snapshot": snapshot_to_json(copy.deepcopy(snapshot))}
        )
    return _ORIG(snapshot, now_wall_ns=now_wall_ns, stall_s=stall_s, envs=envs)


_dmod.diagnose = _wrapped  # before the test modules run `from ... import diagnose`


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    _CURRENT[0] = item.name.replace("[", "-").replace("]", "").replace("/", "_")
    yield
    _CURRENT[0] = None


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    for name, cases in _CASES.items():
        data = json.dumps(cases, sort_keys=True, separators=(",", ":")).encode()
        with open(os.path.join(HERE, name + ".in.json.gz"), "wb") as f:
            f.write(gzip.compress(data, mtime=0))  # byte-identical when the scenario is
