"""Rule transport: failed records, nobody dead, nobody hung (transport-error)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.failures.causes import (
    is_transport_error,
    is_transport_exception,
    is_transport_raise,
)
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_transport_error_no_dead_rank():
    b = ranks(3)
    for x in b:
        x.t += (3 - x.rank) * S  # rank 2 fails first
        x.coll(state="failed", error="Connection reset by peer")
    d = check(diagnose(snap(b)), "transport-error", [2])
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]
    assert is_transport_error("Timed out waiting 1800000ms for recv operation to complete")


def _exc(r, typ, msg, tb, dt=0):
    """Rank builder ``r`` exited 1 by an uncaught ``typ: msg`` raised ``dt`` ns after its newest record."""
    r.set(
        state="exited",
        exit_code=1,
        events=[
            {"event": "exception", "type": typ, "message": msg, "traceback": tb, "wall_ns": r.t + MS + dt}
        ],
    )


PRINT_TB = (
    "Traceback (most recent call last):\n"
    '  File "/job/job.py", line 8, in <module>\n'
    '    print("rank %d step %d" % (r, i))\n'
    "BrokenPipeError: [Errno 32] Broken pipe\n"
)


def test_broken_pipe_of_the_programs_print_is_the_ranks_exception_not_transport():
    """`hangtrace run -- torchrun ... job.py | head -3` (issue 38, measured): both ranks'
    ``print`` raise BrokenPipeError when head leaves; no collective failed. The first is a
    dead rank by its own exception at its print line, never a transport error."""
    b = ranks(2, steps=4)
    _exc(b[0], "BrokenPipeError", "[Errno 32] Broken pipe", PRINT_TB)
    _exc(b[1], "BrokenPipeError", "[Errno 32] Broken pipe", PRINT_TB, dt=MS)
    d = check(diagnose(snap(b, reason="death")), "dead-rank", [0])
    assert d.cause == "exception" and "BrokenPipeError" in d.details["cause_text"]
    assert d.frames and d.frames[0] == "<module> (job.py:8)", d.frames
    assert not any("network" in e or "None" in e for e in d.evidence), d.evidence
    assert not any(c["victim"] for c in d.cascade), d.cascade


def test_oserror_from_torch_distributed_is_still_transport():
    """The same type raised inside torch.distributed (its innermost frame) is communication;
    a RuntimeError naming a closed connection (gloo's) is too, whatever its frames."""
    tb = PRINT_TB.replace(
        "BrokenPipeError",
        '  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
        "    work.wait()\nBrokenPipeError",
        1,
    ).replace("\nBrokenPipeError: [Errno 32]", "\nBrokenPipeError: [Errno 32]", 1)
    assert is_transport_exception("BrokenPipeError", "[Errno 32] Broken pipe", tb)
    assert not is_transport_exception("BrokenPipeError", "[Errno 32] Broken pipe", PRINT_TB)
    assert not is_transport_exception("ConnectionResetError", "Connection reset by peer", "")
    assert is_transport_exception("RuntimeError", "Connection closed by peer [10.0.0.2]:1234", PRINT_TB)
    assert is_transport_raise("RuntimeError: [gloo] Connection reset by peer")
    assert not is_transport_raise("method Rollout.generate raised BrokenPipeError: [Errno 32] Broken pipe")
    assert not is_transport_exception("ValueError", "bad value", "")


def test_transport_evidence_names_no_none_fields():
    """The first failure is an exception (a transport one, no failed record): the evidence
    says so instead of ``None on group 'None' seq None``."""
    b = ranks(2, steps=3)
    _exc(b[0], "RuntimeError", "Connection reset by peer", "")
    b[1].t += S
    b[1].coll(state="failed", error="Connection reset by peer", seq=3)
    d = check(diagnose(snap(b, reason="death")), "transport-error", [0])
    assert not any("None" in e for e in d.evidence), d.evidence
