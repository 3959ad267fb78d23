"""The rule contract: ``find(ctx) -> Optional[Finding]`` and
``explain(ctx, finding, d) -> None``.

``find`` looks at the analysis context (``analyze.context.Ctx``, with its wait-for graph)
and returns a :class:`Finding` when its verdict applies, else None; it adds no evidence.
``explain`` fills the Diagnosis ``d`` (kind, cause, culprits, group, details) and adds
evidence lines to ``ctx``. A rule may assume that every rule before it in
``rules.HANG_RULES`` found nothing (that is what precedence means).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Tuple

from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.diagnosis import Diagnosis


@dataclass(frozen=True)
class Finding:
    """What a rule found. ``rule``: the rule's NAME; ``culprits``: global ranks it
    names; ``start``: when the hang began (ns since the epoch, 0 unknown);
    ``end_kinds``: chain end rank -> kind value (the arbiter asks whether the root death
    is itself a chain end); ``data``: the rule's own payload."""

    rule: str
    culprits: Tuple[int, ...] = ()
    start: int = 0
    end_kinds: Mapping[int, str] = field(default_factory=dict)
    data: Any = None


class Rule(Protocol):
    """A verdict rule (a module under ``analyze/rules/``)."""

    NAME: str

    def find(self, ctx: Ctx) -> Optional[Finding]: ...

    def explain(self, ctx: Ctx, finding: Finding, d: Diagnosis) -> None: ...
