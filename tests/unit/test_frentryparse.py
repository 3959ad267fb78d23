"""Flight Recorder entries parsed once per shape (issue 40): the same FrEntry values and
record dicts as parsing and converting every entry on its own."""

import pickle
import random
from typing import Any, Dict, List

from hangtrace.tracer.collect.frdump import parse_fr_bytes
from hangtrace.tracer.collect.frentryparse import _entry, parse_entries
from hangtrace.tracer.ring.frrecords import fr_record, fr_records

T0 = 1_700_000_000_000_000_000


def _entries(seed: int, n: int) -> List[Any]:
    """``n`` entry dicts over a few shapes, with values of odd types in both the shared and
    the varying fields (strings, floats, bools, None, missing keys), and a non-dict."""
    rnd = random.Random(seed)
    out: List[Any] = []
    for i in range(n):
        d: Dict[str, Any] = {
            "record_id": rnd.choice([i, str(i), None, float(i)]),
            "pg_id": rnd.choice([0, 1, "1", True]),
            "process_group": rnd.choice([("0", "default_pg"), ["1", "sub"], ("2", "")]),
            "thread_name": rnd.choice(["python", "", None]),
            "thread_id": rnd.choice(["139", 139]),
            "collective_seq_id": rnd.choice([i, i + 1, "x", None]),
            "p2p_seq_id": rnd.choice([0, 3]),
            "op_id": i,
            "profiling_name": rnd.choice(["gloo:all_reduce", "nccl:send 0->1", "nccl:recv 1<-0", "barrier"]),
            "time_created_ns": rnd.choice([T0 + i, str(T0 + i), None]),
            "input_sizes": rnd.choice([[[3]], [[2, 2], [1]], [], [[1.0]], [3]]),
            "input_dtypes": rnd.choice([["Float"], ["Int", "Float"], []]),
            "output_sizes": rnd.choice([[[3]], []]),
            "output_dtypes": rnd.choice([["Float"], []]),
            "state": rnd.choice(["scheduled", "completed", "started"]),
            "time_discovered_started_ns": rnd.choice([None, 0, T0 + i, "7"]),
            "time_discovered_completed_ns": rnd.choice([None, T0 + 2 * i]),
            "retired": rnd.choice([True, False, 1]),
            "timeout_ms": rnd.choice([600000, "600000", 1.5]),
            "is_p2p": rnd.choice([True, False, None]),
            "frames": rnd.choice([None, [{"name": "f", "filename": "a.py", "line": 3}], [{"line": "4"}]]),
            "duration_ms": rnd.choice([None, 1, 2.5, "3"]),
        }
        if rnd.random() < 0.2:
            d.pop(rnd.choice(sorted(d)))
        out.append(d if rnd.random() > 0.03 else "not an entry")
    return out


def test_parse_entries_equals_each_entry_parsed_alone():
    for seed in range(40):
        raw = _entries(seed, 120)
        want = tuple(_entry(d) for d in raw if isinstance(d, dict))
        got = parse_entries(raw)
        assert got == want
        # the shared shape's fields are not the varying ones: every entry keeps its own
        assert [e.record_id for e in got] == [e.record_id for e in want]
        assert [e.time_created_ns for e in got] == [e.time_created_ns for e in want]


def test_fr_records_equal_each_entry_converted_alone():
    cfg = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        "1": {"name": "1", "ranks": [2, 0]},
    }
    for seed in range(40):
        raw = [d for d in _entries(seed, 120) if isinstance(d, dict)]
        dump = parse_fr_bytes(pickle.dumps({"version": "2.10", "entries": raw, "pg_config": cfg}), "p")
        want = [fr_record(e, dump) for e in sorted(dump.entries, key=lambda e: e.record_id)]
        assert fr_records(dump) == want


def test_a_missing_is_p2p_and_a_none_one_are_two_shapes():
    """Missing, ``is_p2p`` follows the name (a send is p2p); None, it is False: the two
    entries parse differently, so they are not one shape (their fields read alike)."""
    none = {"profiling_name": "nccl:send 0->1", "is_p2p": None, "record_id": 0}
    missing = {"profiling_name": "nccl:send 0->1", "record_id": 1}
    for raw in ([none, missing], [missing, none]):
        got = parse_entries(raw)
        assert got == tuple(_entry(d) for d in raw)
        assert sorted(e.is_p2p for e in got) == [False, True]


def test_values_marshal_refuses_still_parse():
    """A shared field holding a value ``marshal`` cannot write (a set, from no real dump)
    keys its shape by repr instead: the entries parse as each does alone."""
    raw = [{"profiling_name": "gloo:barrier", "frames": {1, 2}, "record_id": i} for i in range(3)]
    assert parse_entries(raw) == tuple(_entry(d) for d in raw)
