"""Small phrases shared by the verdict texts (pure)."""

from typing import Any, Iterable, List, Optional

from hangtrace.tracer.analyze.stuck.stacktree import format_ranks


def ranks_text(rs: Optional[Iterable[int]]) -> str:
    """``'rank 2'``, ``'ranks 0-1,3'``, ``'no rank'``."""
    rs = list(rs or ())
    return ("rank " if len(rs) == 1 else "ranks ") + format_ranks(rs, 12) if rs else "no rank"


def verb(rs: Optional[List[Any]], one: str = "waits", many: str = "wait") -> str:
    """``one`` for a single item of ``rs``, ``many`` otherwise."""
    return one if len(rs or ()) == 1 else many
