"""The watcher's log lines and incident details, as text: ring headers (and what a poll
found in them) in, one line of text out. Pure, apart from the threshold asked of the watcher."""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from hangtrace.tracer.watch.headers import Header, who

Death = Tuple[str, Header, str]  # (ring path, header, live state: 'killed' or 'exited')


def busy_note(
    headers: Mapping[str, Header], busy: Sequence[int], quiet_s: float, threshold: Callable[[], float]
) -> str:
    """The log line for a quiet spell of ``quiet_s`` seconds while pids ``busy`` work on CPU;
    ``threshold()``: the watcher's stall threshold now (inf: no stall while that lasts)."""
    rank_of: Dict[int, int] = {
        int(h.get("pid") or 0): int(h.get("rank", -1) or 0) if h.get("rank") is not None else -1
        for h in headers.values()
    }
    return (
        "no progress for %.1f s, but pid(s) %s busy on CPU outside collectives (importing, building, "
        "computing): %s"
        % (
            quiet_s,
            ", ".join(
                "%d%s" % (pid, " (rank %d)" % rank_of[pid] if rank_of.get(pid, -1) >= 0 else "")
                for pid in busy[:8]
            ),
            "no stall while that lasts and no rank waits in a collective"
            if threshold() == float("inf")
            else "a stall needs %.0f s while that lasts (a rank waits in a collective)" % threshold(),
        )
    )


def death_lines(deaths: Sequence[Death], headers: Mapping[str, Header]) -> List[str]:
    """One line per death of ``deaths``: who died (named with its parent among ``headers``)
    and how."""
    lines = []
    parents = {(x.get("host"), x.get("pid")): x for x in headers.values()}
    for path, h, st in deaths:
        what = (
            "vanished without a clean-exit record"
            if st == "killed"
            else "exited with code %d" % h["exit_code"]
        )
        lines.append("%s (pid %d on %s) %s" % (who(h, parents), h["pid"], h["host"], what))
    return lines
