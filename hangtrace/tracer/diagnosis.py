"""The analyze -> report contract: one Diagnosis per snapshot (docs/DIAGNOSIS.md)."""
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Diagnosis:
    """The verdict. ``kind`` is one of KINDS; ``culprit_ranks`` are global ranks."""

    kind: str
    culprit_ranks: List[int] = field(default_factory=list)
    summary: str = ""
    group: Optional[str] = None
    group_ranks: Optional[List[int]] = None
    seq: Optional[int] = None
    op: Optional[str] = None
    phase: Optional[str] = None
    step: Optional[int] = None
    cause: Optional[str] = None
    frames: List[str] = field(default_factory=list)
    evidence: List[str] = field(default_factory=list)
    waiting_ranks: List[int] = field(default_factory=list)
    cascade: List[Dict[str, Any]] = field(default_factory=list)
    stack_classes: List[Dict[str, Any]] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)

    def to_dict(self):
        return asdict(self)


KINDS = ("collective-mismatch", "skipped-collective", "cross-group-deadlock",
         "stuck-outside-collective", "dead-rank", "transport-error", "progressing", "unknown")
