"""diagnose() as a whole: the empty snapshot, and random snapshots never raise."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from ruleutil import QUEUE_GET, check  # noqa: E402
from synth import COLL_STACK, R, group, snap, stack, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.diagnosis import KINDS  # noqa: E402
from hangtrace.tracer.report.text import diagnosis_json  # noqa: E402


def test_unknown_empty_snapshot():
    s = snap([], errors=["/tmp/run/ring-h-1.htr: truncated (remedy: copy again)"])
    d = check(diagnose(s), "unknown", [])
    assert d.cause == "no-data" and d.errors == s.errors


def test_random_snapshots_never_raise():
    import random

    from hangtrace.tracer.report.text import text_report

    rnd = random.Random(7)
    ops = ["all_reduce", "broadcast", "barrier", "send", "recv", "all_gather"]
    for trial in range(400):
        n = rnd.randint(1, 9)
        gs = [world(n), group("a", rnd.sample(range(n), rnd.randint(1, n)))]
        bs = [R(r, n, groups=gs) for r in range(n)]
        for x in bs:
            for _ in range(rnd.randint(0, 8)):
                op = rnd.choice(ops)
                g = rnd.choice(["0", "a", "zz"])
                st = rnd.choice(["completed", "completed", "issued", "failed"])
                err = rnd.choice([None, "Connection closed by peer", "boom"]) if st == "failed" else None
                if op in ("send", "recv"):
                    x.p2p(g, rnd.randrange(n), op, state=st, error=err)
                else:
                    x.coll(g, op=op, state=st, error=err, numel=rnd.choice([1, 2]))
            x.set(
                state=rnd.choice(["alive", "alive", "killed", "exited", "unknown"]),
                exit_code=rnd.choice([None, 0, 1, -9, -15]),
            )
            if rnd.random() < 0.3:
                x.set(stacks=stack(*rnd.choice([QUEUE_GET, COLL_STACK])))
        procs = [x.build() for x in bs if rnd.random() < 0.85]
        s = snap(procs, reason=rnd.choice(["stall", "request", "offline"]))
        d = diagnose(s)
        assert d.kind in KINDS
        json.dumps(diagnosis_json(d))
        text_report(d, s)


def test_history_keeps_ring_order_unless_joined_with_the_flight_recorder():
    """Memory samples carry a ``source`` too ('timer'): they must not switch a process's
    look-back to time order (only records joined with the Flight Recorder are ordered by
    time, their idx being torch's own numbering - kept apart from the ring's)."""
    from hangtrace.tracer.analyze.context import history
    from hangtrace.tracer.snapshot import ProcessInfo

    a = {"idx": 1, "kind": "collective", "t_wall_ns": 200}
    m = {"idx": 2, "kind": "memory", "source": "timer", "t_wall_ns": 100}
    assert [r["idx"] for r in history(ProcessInfo(host="h", pid=1, records=[a, m]))] == [1, 2]
    fr = {"idx": 1, "kind": "collective", "source": "flight-recorder", "t_wall_ns": 50}
    got = history(ProcessInfo(host="h", pid=1, records=[a, m, fr]))
    assert [(r.get("source"), r["idx"]) for r in got] == [("flight-recorder", 1), ("timer", 2), (None, 1)]
