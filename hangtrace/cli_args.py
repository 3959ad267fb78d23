"""Argument types shared by the ``hangtrace`` subcommands' parsers (argparse ``type=``):
the text of one command-line argument in, its value out, or ``argparse.ArgumentTypeError``
(argparse prints it as a usage error, exit 2)."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, FrozenSet, Iterable, Set


def ranks_arg(text: str) -> FrozenSet[int]:
    """``0,2,5-7`` -> frozenset of ints (argparse type)."""
    out: Set[int] = set()
    try:
        for part in text.split(","):
            a, _, b = part.strip().partition("-")
            out.update(range(int(a), int(b) + 1) if b else (int(a),))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a rank list like 0,2,5-7" % text) from None
    return frozenset(out)


def ranks_text(ranks: Iterable[int]) -> str:
    """The inverse of :func:`ranks_arg`: ``[0, 1, 2, 5]`` -> ``'0-2,5'`` (``'none'`` when empty)."""
    rs, out = sorted(set(ranks)), []
    for r in rs:
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in out) or "none"


def non_negative(kind: type) -> Callable[[str], Any]:
    """An argparse type: the text as ``kind`` (int, float), refused when below 0."""

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text) from None
        if v < 0:
            raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
        return v

    return parse


def positive_float(text: str) -> float:
    """An argparse type: seconds as a float, refused unless finite and > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError("must be > 0 seconds, got %r" % text)
    return v


def finite_float(text: str) -> float:
    """An argparse type: seconds as a float, refused unless finite (negative allowed)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text) from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError("must be a finite number of seconds, got %r" % text)
    return v
