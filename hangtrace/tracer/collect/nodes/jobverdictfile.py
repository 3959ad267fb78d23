"""Node 0's job-wide verdict stored in another node's snapshot folder, read back (issue 39).

Above ``FETCH_ALL_MAX`` nodes (``watch/jobwatch``) a node other than node 0 publishes its
summary but gathers nobody's: its own snapshot folder sees only its node. Node 0 assembles
the job from every part and publishes its verdict; the other nodes store it as
``<snapshot>/nodes/job_verdict.json`` (``watch/jobverdict.store_verdict``): ``{paragraph,
kind, culprit_ranks, assembled_by, host, nodes, snapshot, incident, diagnosis}``
(``diagnosis``: node 0's ``Diagnosis`` as JSON schema 1, docs/DIAGNOSIS.md).

In: a snapshot (``Snapshot.path``: its folder). Out: a :class:`JobVerdict` when the folder
holds node 0's verdict and node 0 saw more nodes than this snapshot does (else this node's
own analysis is the job's, and richer: None). ``hangtrace analyze`` of that folder, or of
its run directory, then gives node 0's verdict and says where it came from.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

import orjson

from hangtrace.tracer.diagnosis import Cause, Diagnosis, Kind
from hangtrace.tracer.snapshot import Snapshot

VERDICT_FILE = "job_verdict.json"


@dataclass(frozen=True)
class JobVerdict:
    """Node 0's verdict as read here: ``diagnosis`` (its fields; ``details['nodes']['from']``
    and the first evidence line say where it came from), ``paragraph`` (node 0's, then the
    source line), ``nodes`` (node 0's ``Snapshot.nodes``), ``source`` (the source line)."""

    diagnosis: Diagnosis
    paragraph: str
    nodes: Tuple[Dict[str, Any], ...]
    source: str


def read_doc(sdir: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``sdir/nodes/job_verdict.json`` as a dict, and None; (None, None) when absent; (None,
    why) when it cannot be read or is not a JSON object."""
    path = os.path.join(sdir, "nodes", VERDICT_FILE)
    try:
        with open(path, "rb") as f:
            d = orjson.loads(f.read())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, "%s: unreadable (%s)" % (path, e)
    if not isinstance(d, dict):
        return None, "%s: not a stored job verdict (a JSON %s)" % (path, type(d).__name__)
    return d, None


def _seen(nodes: Any) -> int:
    return sum(1 for n in nodes or () if isinstance(n, dict) and n.get("seen"))


def diagnosis_of(doc: Dict[str, Any]) -> Diagnosis:
    """The ``Diagnosis`` in ``doc`` (its ``diagnosis``, JSON schema 1; a verdict stored by an
    older hangtrace has only ``kind``, ``culprit_ranks`` and ``paragraph``). Raises ValueError
    for a kind this version does not know."""
    raw = doc.get("diagnosis")
    if not isinstance(raw, dict):
        raw = {"kind": doc.get("kind"), "culprit_ranks": doc.get("culprit_ranks") or []}
        raw["summary"] = str(doc.get("paragraph") or "")
    names = {f.name for f in fields(Diagnosis)}
    kw = {k: v for k, v in raw.items() if k in names}
    kw["kind"] = Kind(str(kw.get("kind")))
    cause = kw.get("cause")
    if isinstance(cause, str) and cause in {c.value for c in Cause}:
        kw["cause"] = Cause(cause)
    kw["details"] = dict(kw.get("details") or {})
    return Diagnosis(**kw)


def stored_job_verdict(snap: Snapshot) -> Tuple[Snapshot, Optional[JobVerdict]]:
    """Node 0's verdict stored in ``snap``'s folder when it saw more nodes than ``snap`` does
    (module docstring), else None; with ``snap`` (its ``nodes`` node 0's when the verdict is
    used; an error line naming the file when it is there but cannot be used: this node's own
    analysis then stands). Never raises."""
    try:
        jv, err = _stored(snap)
    except Exception as e:  # (a verdict file of another version: never the reason analyze fails)
        jv, err = None, "%s/nodes/%s: unusable (%r)" % (snap.path, VERDICT_FILE, e)
    if err:
        snap = dataclasses.replace(snap, errors=list(snap.errors) + [err])
    if jv is not None:
        snap = dataclasses.replace(snap, nodes=[dict(n) for n in jv.nodes])
    return snap, jv


def _stored(snap: Snapshot) -> Tuple[Optional[JobVerdict], Optional[str]]:
    if not snap.path:
        return None, None
    doc, err = read_doc(snap.path)
    remedy = " (remedy: this node's own snapshot is analysed; node 0's run directory has the job's verdict)"
    if doc is None:
        return None, err + remedy if err else None
    if _seen(doc.get("nodes")) <= max(1, _seen(snap.nodes)):
        return None, None
    try:
        d = diagnosis_of(doc)
    except (ValueError, TypeError) as e:
        return None, "%s/nodes/%s: %s%s" % (snap.path, VERDICT_FILE, e, remedy)
    where = os.path.join(snap.path, "nodes", VERDICT_FILE)
    source = (
        "The job's verdict, assembled by node %s (%s) from %d nodes' summaries (incident %s; its "
        "snapshot %s), stored here as %s: this node's own snapshot saw %s."
        % (
            doc.get("assembled_by", 0),
            doc.get("host") or "host unknown",
            _seen(doc.get("nodes")),
            doc.get("incident", "?"),
            doc.get("snapshot") or "unknown",
            where,
            _own(snap),
        )
    )
    nodes = d.details.setdefault("nodes", {})
    if isinstance(nodes, dict):
        nodes["from"] = {
            "node_rank": doc.get("assembled_by", 0),
            "host": doc.get("host"),
            "file": where,
            "snapshot": doc.get("snapshot"),
        }
    d.evidence = [source] + list(d.evidence)
    d.errors = list(d.errors) + list(snap.errors)
    paragraph = "%s\n%s" % (str(doc.get("paragraph") or d.summary).rstrip(), source)
    nodes_seen = tuple(n for n in doc.get("nodes") or () if isinstance(n, dict))
    return JobVerdict(d, paragraph, nodes_seen, source), None


def _own(snap: Snapshot) -> str:
    ranks: List[int] = sorted({p.rank for p in snap.processes if p.rank >= 0})
    if not ranks:
        return "no rank"
    return "only its own node (rank%s %s)" % (
        "s" if len(ranks) > 1 else "",
        "%d-%d" % (ranks[0], ranks[-1]) if ranks == list(range(ranks[0], ranks[-1] + 1)) else ranks,
    )
