"""torchelastic's error files (issue 9 item 2): the hook's parser, and the analysis using a
recorded error file where our own records of a dead rank lack the exception."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synth import MS, R, ranks, snap  # noqa: E402

from hangtrace.hooks.process.elastic_errors import parse  # noqa: E402
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

ERR = "/tmp/torchelastic_x/run_y/attempt_0/1/error.json"


def test_parse_record_exception_form():
    f = parse(
        {
            "message": {
                "message": "ValueError: bad shard 7: got 0",
                "extraInfo": {
                    "py_callstack": "Traceback ...\nValueError: bad shard 7: got 0\n",
                    "timestamp": "1764630000",
                },
                "errorCode": 1,
            }
        }
    )
    assert (f["type"], f["message"], f["timestamp"], f["error_code"]) == (
        "ValueError",
        "bad shard 7: got 0",
        1764630000,
        1,
    )
    assert f["traceback"].startswith("Traceback")


def test_parse_flat_form_and_garbage():
    f = parse({"message": "worker lost its GPU", "timestamp": 17})
    assert (f["type"], f["message"], f["timestamp"]) == (None, "worker lost its GPU", 17)
    assert parse(["not", "a", "dict"])["message"] == ""


def _job(own_exception):
    b = ranks(2)
    b[0].wait()
    t = b[0].t + 100 * MS
    ev = (
        [{"event": "exception", "type": "KeyError", "message": "'pad'", "wall_ns": t}]
        if own_exception
        else []
    )
    b[1].set(state="exited", exit_code=3, exit_wall_ns=t + MS, events=ev)
    agent = R(-1, 2, pid=900).set(
        rank=-1,
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "elastic_error",
                "type": "ValueError",
                "message": "bad shard 7",
                "traceback": "Traceback ...",
                "timestamp": t // 10**9,
                "error_file": ERR,
                "pid": 1001,
                "local_rank": 1,
                "exit_code": 3,
                "seen_by": "agent",
                "wall_ns": t + 5 * MS,
            }
        ],
    )
    return diagnose(snap(b + [agent], reason="exit"))


def test_dead_rank_cause_from_error_file():
    d = _job(own_exception=False)
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "exception"), d.summary
    assert (
        "ValueError: bad shard 7" in d.summary and "read from torchelastic's error file " + ERR in d.summary
    )


def test_own_exception_record_wins_over_error_file():
    d = _job(own_exception=True)
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "exception"), d.summary
    assert "KeyError" in d.summary and "error file" not in d.summary
