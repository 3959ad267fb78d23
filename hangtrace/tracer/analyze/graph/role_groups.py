"""Role groups: the groups that play the same role as a group (the CP groups cp0, cp1 of
a mesh), and how many collectives each rank issued on its group of a role (pure)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from hangtrace.tracer.analyze.context import Ctx, GroupDef

_DESC_INDEX = re.compile(r"[_\-.:]?\d+$")
_NO_DESC = frozenset(("", "undefined", "default_pg"))


def role_stem(desc: Any) -> Optional[str]:
    """'cp0' / 'cp_1' / 'cp' -> 'cp'; None for no usable description."""
    if not desc or str(desc) in _NO_DESC:
        return None
    stem = _DESC_INDEX.sub("", str(desc))
    return stem or None


def _disjoint(groups: Sequence[GroupDef]) -> bool:
    seen: Set[int] = set()
    for gd in groups:
        rs = set(gd["ranks"])
        if seen & rs:
            return False
        seen |= rs
    return True


def _run_of(ctx: Ctx, gd: GroupDef) -> Tuple[List[GroupDef], int]:
    """The run of undescribed groups created consecutively with ``gd``'s size, and
    ``gd``'s index in it."""
    size = len(gd["ranks"])
    by_order = sorted(
        (
            h
            for h in ctx.groups.values()
            if h.get("ranks") and h.get("order") is not None and role_stem(h.get("desc")) is None
        ),
        key=lambda h: h["order"],
    )
    i = next(k for k, h in enumerate(by_order) if h["name"] == gd["name"])
    lo = hi = i
    while (
        lo > 0
        and len(by_order[lo - 1]["ranks"]) == size
        and by_order[lo - 1]["order"] == by_order[lo]["order"] - 1
    ):
        lo -= 1
    while (
        hi + 1 < len(by_order)
        and len(by_order[hi + 1]["ranks"]) == size
        and by_order[hi + 1]["order"] == by_order[hi]["order"] + 1
    ):
        hi += 1
    return by_order[lo : hi + 1], i - lo


def _same_by_order(ctx: Ctx, gd: GroupDef) -> List[GroupDef]:
    run, i = _run_of(ctx, gd)
    size = len(gd["ranks"])
    # a run can hold several layouts back to back (CP groups, then DP groups): cut it
    # into blocks of consecutive groups that each partition the run's ranks
    union: Set[int] = set()
    for h in run:
        union |= set(h["ranks"])
    k = len(union) // size
    same: List[GroupDef] = []
    if k >= 2 and len(run) % k == 0:
        for j in range(0, len(run), k):
            block = run[j : j + k]
            if any(h["name"] == gd["name"] for h in block):
                same = block
    if not same or not _disjoint(same):
        same = [gd]  # greedy: the disjoint neighbours of g
        for h in run[i + 1 :]:
            if not _disjoint(same + [h]):
                break
            same.append(h)
        for h in reversed(run[:i]):
            if not _disjoint(same + [h]):
                break
            same.insert(0, h)
    return same


def role_groups(ctx: Ctx, g: Any) -> List[str]:
    """Names of the groups that play the same role as group ``g`` (``g`` included), or [].

    Same role: the same description once a trailing index is stripped ('cp0', 'cp1' ->
    'cp'); without usable descriptions, the run of groups created consecutively
    (``order``) with the same size as ``g``. Either way the groups must be pairwise
    disjoint (one group per rank, like the CP or DP groups of a mesh) and at least two.
    """
    gd = ctx.groups.get(g)
    if not gd or not gd.get("ranks") or len(gd["ranks"]) < 2:
        return []
    stem = role_stem(gd.get("desc"))
    if stem is not None:
        same = [h for h in ctx.groups.values() if h.get("ranks") and role_stem(h.get("desc")) == stem]
    elif gd.get("order") is not None:
        same = _same_by_order(ctx, gd)
    else:
        return []
    if len(same) < 2 or not _disjoint(same):
        return []
    return sorted(h["name"] for h in same)


def role_counts(ctx: Ctx, role: Sequence[str]) -> Dict[int, Tuple[str, int]]:
    """{rank: (group, highest seq issued on its group of the role)} for ranks with a record file."""
    out: Dict[int, Tuple[str, int]] = {}
    for h in role:
        for m in ctx.members(h):
            v = ctx.views.get(m)
            if v is None:
                continue
            rec = v.last.get(h)
            n: int = (rec.get("seq") or 0) if rec else 0
            b = v.blocked
            if b is not None and b.get("kind") == "collective" and b.get("group") == h:
                n = max(n, b.get("seq") or 0)
            out[m] = (h, n)
    return out
