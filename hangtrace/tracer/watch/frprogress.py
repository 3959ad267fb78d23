"""torch's own per-group counters of a rank (``fr_agent.progress_line``:
``"<pg>:<enqueued>:<completed>;..."``), read by the watcher (pure)."""

from __future__ import annotations

from typing import List


def in_flight(line: str) -> bool:
    """Does ``"<pg>:<enqueued>:<completed>;..."`` (``fr_agent.progress_line``) say that a
    collective was enqueued and not completed on some group? A rank inside DDP's gradient
    all-reduce (C++, never in the ring) waits in a collective although its ring has none
    in flight (blind helper 65: a spinning rank's peers waited in backward for ever while
    the watcher held the stall off as "no rank waits in a collective")."""
    for part in line.split(";"):
        fields = part.rsplit(":", 2)
        try:
            if len(fields) == 3 and int(fields[1]) > int(fields[2]):
                return True
        except ValueError:
            continue
    return False


def completed(line: str) -> List[str]:
    """``"<pg>:<enqueued>:<completed>;..."`` (``fr_agent.progress_line``) -> the
    ``"<pg>:<completed>"`` parts."""
    out = []
    for part in line.split(";"):
        fields = part.rsplit(":", 2)  # a group's name may hold a ':'
        if len(fields) == 3:
            out.append(fields[0] + ":" + fields[2])
    return out
