"""What error texts, phases and records say about a failure (pure).

In: error texts (an exception's message, a failed record's ``error``, a phase exit's
``'Type: message'``), a process's ``RingSummary`` (``failed_phases``), a record's times,
a rank view. Out: whether an error is a transport failure (:func:`is_transport_error`,
``TRANSPORT_MARKERS``; for an exception, also where it came from: :func:`is_transport_exception`,
:func:`is_transport_raise`) or a stop (:func:`is_stop_error`, ``STOP_ERRORS``), the phases that
raised (:func:`raised_phases`) or were stopped at work (:func:`interrupted_at_work`), a
record's end time (:func:`rec_fail_wall`, ns since the epoch), a death's cause before
memory evidence refined it (:func:`base_cause`), and ``STOPPED_WAIT_NS``. Shared by
``rankview`` (the index), ``deaths`` and ``teardown``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple

from hangtrace.tracer.config import CONTROL_FLOW_ERRORS
from hangtrace.tracer.diagnosis import Cause

if TYPE_CHECKING:
    from hangtrace.tracer.analyze.rankview import RankView

#: Lower-case substrings of error texts that mean "the transport (peer, socket) failed".
#: gloo: "Connection closed by peer" (peer SIGKILLed), "Timed out waiting ...ms for recv
#: operation to complete" (timeout); NCCL: "NCCL communicator was aborted", watchdog.
TRANSPORT_MARKERS = (
    "connection closed by peer",
    "timed out waiting",
    "connection reset",
    "broken pipe",
    "connection refused",
    "socket timeout",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",
    "ncclremoteerror",
    "ncclsystemerror",
    "read error",
    "write error",
    "no route to host",
    "peer closed",
    "ecconnreset",
    "econnreset",
)

KILLED = Cause.KILLED_WITHOUT_RECORD.value
#: A rank SIGTERMed after waiting at least this long (ns) in a collective is taken for a
#: stopped hung job (a victim); a SIGTERM earlier in a wait is an ordinary root death.
STOPPED_WAIT_NS = 10_000_000_000


def is_transport_error(text: Any) -> bool:
    """True when ``text`` (an error message) names a transport failure (``TRANSPORT_MARKERS``)."""
    if not text:
        return False
    t = str(text).lower()
    return any(m in t for m in TRANSPORT_MARKERS)


#: Python's own OSError family (type names): raised by the program's own I/O - ``print`` into
#: a pipe whose reader left (``job | head``: BrokenPipeError), its own sockets and files. Such
#: an exception is the rank's own failure unless torch.distributed raised it (issue 38).
OS_ERRORS = frozenset(
    {
        "OSError",
        "IOError",
        "EnvironmentError",
        "BrokenPipeError",
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "ConnectionRefusedError",
        "TimeoutError",
        "timeout",
        "InterruptedError",
    }
)
#: Path parts of the files whose code talks to the job's peers: torch.distributed (gloo,
#: NCCL and the store are reached through it), and the backends' own Python files if any.
COMM_FILES = ("/torch/distributed/", "gloo", "nccl")


def _innermost_file(traceback: Any) -> str:
    """The file of the innermost frame of the last traceback in ``traceback`` (Python's
    format), '' when there is none."""
    block = str(traceback or "").rsplit("Traceback (most recent call last):", 1)[-1]
    files = [
        ln.split('"')[1]
        for ln in block.splitlines()
        if ln.lstrip().startswith('File "') and ln.count('"') >= 2
    ]
    return files[-1] if files else ""


def is_transport_exception(exc_type: Any, message: Any, traceback: Any = "") -> bool:
    """True when an exception (its type name, message and traceback text, as the ``exception``
    event holds them) is a failure of the job's communication: its message names a
    transport failure (``TRANSPORT_MARKERS``) and it is not one of Python's own OSErrors
    (``OS_ERRORS``) raised outside torch.distributed (``COMM_FILES``, the traceback's
    innermost frame; no traceback: not raised there). ``print`` into a closed stdout raises
    ``BrokenPipeError: [Errno 32] Broken pipe``: the rank's own exception, not the network's
    (issue 38, measured under ``hangtrace run ... | head -3``)."""
    if not is_transport_error(message):
        return False
    name = str(exc_type or "").strip().rsplit(".", 1)[-1]
    if name not in OS_ERRORS:
        return True
    inner = _innermost_file(traceback).replace("\\", "/")
    return any(m in inner for m in COMM_FILES)


def is_transport_raise(text: Any) -> bool:
    """:func:`is_transport_exception` for a ``'Type: message'`` text without a traceback (a
    phase's or a Ray actor method's error; also ``'method m raised Type: message'``: the
    type is the word before the first ``': '``)."""
    t = str(text or "").strip()
    words = t.split(": ", 1)[0].split() if ": " in t else []
    return is_transport_exception(words[-1] if words else "", t)


def rec_fail_wall(rec: Optional[Mapping[str, Any]]) -> int:
    """End time (ns since the epoch) of record ``rec``: its wall start plus its monotonic
    duration; its start when the end is unknown; 0 for no record."""
    if not rec:
        return 0
    w = int(rec.get("t_wall_ns") or 0)
    end, start = rec.get("t_end_mono_ns"), rec.get("t_mono_ns")
    if w and end and start and end >= start:
        return w + int(end - start)
    return w


def base_cause(v: RankView) -> Optional[str]:
    """The cause before memory evidence refined it."""
    b: Optional[str] = (v.mem or {}).get("base_cause") or v.cause
    return b


#: A phase or Ray actor method that ended with one of these was stopped, not failed: Ray's
#: SIGTERM handler raises SystemExit in the worker, Ctrl-C raises KeyboardInterrupt.
STOP_ERRORS = ("SystemExit", "KeyboardInterrupt")


def is_stop_error(error: Any) -> bool:
    """True for a phase-exit error text ``Type: message`` whose type is in STOP_ERRORS."""
    return str(error or "").split(":", 1)[0].strip() in STOP_ERRORS


def raised_phases(p: Any) -> List[Tuple[int, str, str, Optional[int]]]:
    """The phases (Ray actor methods included) of ``p`` that raised and have not completed
    since (``RingSummary.failed_phases``), stops and control flow (``config.
    CONTROL_FLOW_ERRORS``: a queue's ``Empty`` / ``Full``) excepted: ``(wall ns, name,
    'Type: message', step)``, oldest first."""
    sm = getattr(p, "summary", None)
    out = [
        (int(rec.get("t_wall_ns") or 0), name, str(rec.get("error") or "").strip(), rec.get("step"))
        for name, rec in (sm.failed_phases.items() if sm is not None else ())
    ]
    return sorted(
        f
        for f in out
        if f[2]
        and not is_stop_error(f[2])
        and f[2].split(":")[0].strip().rsplit(".", 1)[-1] not in CONTROL_FLOW_ERRORS
    )


def interrupted_at_work(p: Any) -> bool:
    """True when a phase of ``p`` ended with a stop (STOP_ERRORS) and has not completed
    since (``RingSummary.failed_phases``): the process was at work when it was stopped -
    Ray's SIGTERM handler raises SystemExit in the worker, which unwinds the actor
    method's phase, so at exit no phase is open any more."""
    sm = getattr(p, "summary", None)
    return any(is_stop_error(r.get("error")) for r in (sm.failed_phases.values() if sm is not None else ()))
