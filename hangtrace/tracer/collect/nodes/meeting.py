"""The node watchers' meeting over the job's store (issue 39): keys, values, checks.

Every key lives under ``hangtrace/<job>/`` (``NodeIdentity.job``: the launcher's run id and
restart count), so nothing collides with torch's own keys and a restarted job meets anew:

* ``node/<r>``: node r's registration, JSON ``{version, node_rank, node_count, host,
  run_dir, pid, ranks, beat_wall_ns}``, rewritten at every beat (a few seconds);
* ``incidents``: a counter (``add``) numbering the incidents;
* ``incident/<n>``: its trigger, JSON ``{kind, detail, node_rank, host, wall_ns}``;
* ``incident/<n>/part/<r>``: node r's summary for it (``summaryformat``);
* ``incident/<n>/verdict``: the assembler's verdict, JSON ``{paragraph, kind,
  culprit_ranks, assembled_by, nodes}``.

:class:`Meeting` does one operation per call over a link (``storelink``) and raises
``StoreGone``; :meth:`Meeting.gather` waits for the parts until a deadline and names each
part it could not use (garbage, another version, another node's or incident's: stale or
foreign) and each node that never answered, with its last sign of life.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import orjson

from hangtrace.tracer.collect.nodes.identity import NodeIdentity
from hangtrace.tracer.collect.nodes.summaryformat import VERSION, NodePart, SummaryError, decode

PROTOCOL = 1
#: seconds between two reads of every part not read yet while :meth:`Meeting.gather` waits
PASS_S = 1.0


@dataclass
class Gathered:
    """What :meth:`Meeting.gather` got: ``parts`` (node rank -> NodePart) and their raw
    bytes, ``nodes`` (``Snapshot.nodes`` entries, one per node of the job), ``errors``
    (one line per unusable part), seconds waited."""

    parts: Dict[int, NodePart] = field(default_factory=dict)
    raw: Dict[int, bytes] = field(default_factory=dict)
    nodes: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    waited_s: float = 0.0
    bad: Dict[int, str] = field(default_factory=dict)  # node rank -> why its part is unusable


class Meeting:
    """The meeting of ``me`` over ``link`` (a StoreLink or DirLink)."""

    def __init__(self, link: Any, me: NodeIdentity, run_dir: str) -> None:
        self.link, self.me, self.run_dir = link, me, run_dir
        self.prefix = "hangtrace/%s/" % me.job
        self.cache: Dict[Any, bytes] = {}  # (incident, node rank) -> part bytes already read
        self.bad_regs: Dict[int, str] = {}  # node rank -> why its registration is unusable

    def _k(self, key: str) -> str:
        return self.prefix + key

    def register(self, ranks: List[int]) -> None:
        """Write (or renew: the beat) this node's registration."""
        doc = {
            "version": PROTOCOL,
            "summary_version": VERSION,
            "node_rank": self.me.node_rank,
            "node_count": self.me.node_count,
            "host": self.me.host,
            "run_dir": self.run_dir,
            "pid": os.getpid(),
            "ranks": sorted(ranks),
            "beat_wall_ns": time.time_ns(),
        }
        self.link.set(self._k("node/%d" % self.me.node_rank), orjson.dumps(doc))

    def registration(self, r: int) -> Optional[Dict[str, Any]]:
        """Node r's registration (:func:`checked_registration`), None when absent or unusable
        (why: ``bad_regs[r]``, named by :meth:`gather`). Raises StoreGone."""
        v = self.link.get(self._k("node/%d" % r))
        if v is None:
            return None
        try:
            d = checked_registration(r, v)
        except SummaryError as e:
            self.bad_regs[r] = str(e)
            return None
        self.bad_regs.pop(r, None)
        return d

    def incidents(self) -> int:
        """How many incidents were opened in the job so far."""
        return self.link.add(self._k("incidents"), 0)

    def open_incident(self, kind: str, detail: str) -> int:
        """A new incident (this node detected ``kind``); its number."""
        n = self.link.add(self._k("incidents"), 1)
        doc = {
            "kind": kind,
            "detail": detail,
            "node_rank": self.me.node_rank,
            "host": self.me.host,
            "wall_ns": time.time_ns(),
        }
        self.link.set(self._k("incident/%d" % n), orjson.dumps(doc))
        return n

    def trigger(self, n: int) -> Optional[Dict[str, Any]]:
        """Incident ``n``'s trigger (:func:`checked_trigger`), None when absent. Raises StoreGone."""
        v = self.link.get(self._k("incident/%d" % n))
        return checked_trigger(v) if v is not None else None

    def publish_part(self, n: int, data: bytes) -> None:
        """Publish this node's part of incident ``n`` and count it (``incident/<n>/parts``)."""
        self.link.set(self._k("incident/%d/part/%d" % (n, self.me.node_rank)), data)
        self.link.add(self._k("incident/%d/parts" % n), 1)

    def publish_verdict(self, n: int, doc: Dict[str, Any]) -> None:
        self.link.set(self._k("incident/%d/verdict" % n), orjson.dumps(doc, default=str))

    def verdict_taken(self, n: int) -> int:
        """A node stored node 0's verdict of incident ``n``: counts it; returns the count.
        Raises StoreGone."""
        return self.link.add(self._k("incident/%d/verdict_taken" % n), 1)

    def verdict_takers(self, n: int) -> int:
        """How many other nodes stored node 0's verdict of incident ``n``. Raises StoreGone."""
        return self.link.add(self._k("incident/%d/verdict_taken" % n), 0)

    def verdict(self, n: int) -> Optional[Dict[str, Any]]:
        v = self.link.get(self._k("incident/%d/verdict" % n))
        try:
            d = orjson.loads(v) if v is not None else None
        except ValueError:
            return None
        return d if isinstance(d, dict) else None

    def part(self, n: int, r: int) -> Optional[bytes]:
        """Node r's part of incident ``n`` (kept once read: the store may go away later,
        with the process that hosts it). Raises StoreGone."""
        if (n, r) not in self.cache:
            v = self.link.get(self._k("incident/%d/part/%d" % (n, r)))
            if v is None:
                return None
            self.cache[(n, r)] = v
        return self.cache[(n, r)]

    def prefetch(self, n: int) -> None:
        """Read every part of incident ``n`` present now (:meth:`part`). Raises StoreGone."""
        for r in range(self.me.node_count):
            if r != self.me.node_rank:
                self.part(n, r)

    def _check_part(self, n: int, r: int, data: bytes) -> NodePart:
        part = decode(data)
        if part.node_rank != r:
            raise SummaryError("foreign part: it says it is node %s's" % part.node_rank)
        if part.incident != n:
            raise SummaryError("stale part: it answers incident %d, not %d" % (part.incident, n))
        if str(part.node.get("job")) != self.me.job:
            raise SummaryError("stale part: of job %s, not %s" % (part.node.get("job"), self.me.job))
        return part

    def gather(
        self,
        n: int,
        deadline_s: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> Gathered:
        """Every other node's part of incident ``n``, waiting until each node answered (or
        its part proved unusable) or ``deadline_s`` seconds passed. One read of the parts
        counter per round (every 0.2 s), one ``multi_get`` once every node published; a check
        per node not read yet only every :data:`PASS_S` seconds and at the deadline (per
        round when the count moved, it was O(nodes) store operations per round: 2,046 per
        0.2 s at 1,024 nodes while their parts came in); a store that goes away ends the
        wait with the parts read until then (and those read before, :meth:`part`). Never
        raises."""
        g = Gathered()
        t0 = clock()
        pending = set(range(self.me.node_count)) - {self.me.node_rank}
        gone: Optional[str] = None
        last_pass = t0
        while True:
            final = clock() - t0 >= deadline_s
            try:
                count = self.link.add(self._k("incident/%d/parts" % n), 0) if gone is None else -1
            except Exception as e:  # StoreGone: keep what was read, name what was not
                gone, count = str(e), -1
            if gone is None and count >= self.me.node_count and pending:  # all published: one read
                gone = self._read_all(n, sorted(pending), g, pending)
            elif final or gone is not None or clock() - last_pass >= PASS_S:
                gone = self._read_each(n, sorted(pending), g, pending, gone)
                last_pass = clock()
            if not pending or final or gone is not None:
                break
            sleep(min(0.2, max(0.0, deadline_s - (clock() - t0))))
        g.waited_s = clock() - t0
        g.nodes = self._nodes(n, g, gone)
        return g

    def _take(self, n: int, r: int, data: bytes, g: Gathered, pending: "set[int]") -> None:
        pending.discard(r)
        try:
            g.parts[r] = self._check_part(n, r, data)
            g.raw[r] = data
        except SummaryError as e:
            g.bad[r] = str(e)
            g.errors.append("node %d's summary of incident %d: %s" % (r, n, e))

    def _read_all(self, n: int, rs: List[int], g: Gathered, pending: "set[int]") -> Optional[str]:
        """Every part of ``rs`` (all published) in one read; the reason when the store is gone."""
        todo = [r for r in rs if (n, r) not in self.cache]
        try:
            vs = self.link.multi_get([self._k("incident/%d/part/%d" % (n, r)) for r in todo]) if todo else []
        except Exception as e:
            return self._read_each(n, rs, g, pending, str(e))
        self.cache.update({(n, r): v for r, v in zip(todo, vs)})
        for r in rs:
            self._take(n, r, self.cache[(n, r)], g, pending)
        return None

    def _read_each(
        self, n: int, rs: List[int], g: Gathered, pending: "set[int]", gone: Optional[str]
    ) -> Optional[str]:
        """The parts of ``rs`` present now, one check each (only the cache once the store is
        gone); the reason when the store is (or went) away."""
        for r in rs:
            try:
                data = self.part(n, r) if gone is None else self.cache.get((n, r))
            except Exception as e:
                gone, data = str(e), self.cache.get((n, r))
            if data is not None:
                self._take(n, r, data, g, pending)
        return gone

    def _nodes(self, n: int, g: Gathered, gone: Optional[str]) -> List[Dict[str, Any]]:
        out = [
            {
                "node_rank": self.me.node_rank,
                "host": self.me.host,
                "ranks": list(self.me.ranks),
                "seen": True,
                "why": "",
            }
        ]
        for r in range(self.me.node_count):
            if r == self.me.node_rank:
                continue
            if r in g.parts:
                p = g.parts[r]
                ranks = sorted(
                    {
                        q.rank
                        for q in p.processes
                        if q.rank >= 0 and q.role is not None and q.role.value == "rank"
                    }
                )
                out.append(
                    {"node_rank": r, "host": p.node.get("host"), "ranks": ranks, "seen": True, "why": ""}
                )
                continue
            reg = None
            try:
                reg = self.registration(r) if gone is None else None  # a node not seen only
            except Exception as e:
                gone = gone or str(e)
            host = reg.get("host") if reg else None
            ranks = list(reg.get("ranks") or ()) if reg else []
            if r in g.bad:
                why = "its summary could not be used: %s" % g.bad[r]
            elif gone is not None:
                why = "its summary was not read before the store went away (%s)" % gone
            elif reg is None and r in self.bad_regs:
                why = "no summary within %.0f s" % g.waited_s
            elif reg is None:
                why = "its watcher never registered in the job's store (no hangtrace on it, or it never reached the store)"
            else:
                age = (time.time_ns() - int(reg.get("beat_wall_ns") or 0)) / 1e9
                why = "no summary within %.0f s; its watcher's last sign of life %.0f s ago" % (
                    g.waited_s,
                    age,
                )
            if r in self.bad_regs:  # a foreign or garbled key under the prefix: named, then passed over
                why += "; its registration in the job's store could not be used: %s" % self.bad_regs[r]
                g.errors.append(
                    "node %d's registration (%snode/%d): %s" % (r, self.prefix, r, self.bad_regs[r])
                )
            node = {"node_rank": r, "host": host, "ranks": ranks, "seen": False, "why": why}
            if reg and reg.get("beat_wall_ns"):
                node["last_beat_wall_ns"] = int(reg["beat_wall_ns"])  # its watcher's last sign of life
            out.append(node)
        return out


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SummaryError("%s is %s, not a whole number" % (what, repr(v)[:40]))
    return v


def checked_registration(r: int, data: bytes) -> Dict[str, Any]:
    """Node r's registration bytes (``node/<r>``, :meth:`Meeting.register`) as a dict whose
    fields have their types (``host`` str or None, ``ranks`` list of int, ``beat_wall_ns``
    int, ns since the epoch). Raises SummaryError naming what is wrong: not JSON, not an
    object, another protocol version, another node's (foreign), a field of another type."""
    try:
        d = orjson.loads(data)
    except ValueError:
        raise SummaryError("not a hangtrace registration (%d bytes, not JSON)" % len(data)) from None
    if not isinstance(d, dict):
        raise SummaryError("not a hangtrace registration (JSON %s)" % type(d).__name__)
    if d.get("version", PROTOCOL) != PROTOCOL:
        raise SummaryError(
            "registration of protocol version %s, this hangtrace reads version %d"
            % (repr(d.get("version"))[:20], PROTOCOL)
        )
    if "node_rank" in d and d["node_rank"] != r:
        raise SummaryError("foreign registration: it says it is node %s's" % repr(d["node_rank"])[:20])
    ranks = d.get("ranks") or []
    if not isinstance(ranks, list):
        raise SummaryError("its ranks are %s, not a list" % repr(ranks)[:40])
    host = d.get("host")
    if host is not None and not isinstance(host, str):
        raise SummaryError("its host is %s, not a name" % repr(host)[:40])
    out = dict(d)
    out["ranks"] = [_int(x, "a rank") for x in ranks]
    out["beat_wall_ns"] = _int(d.get("beat_wall_ns") or 0, "its beat time")
    return out


def checked_trigger(data: bytes) -> Dict[str, Any]:
    """An incident's trigger bytes (:meth:`Meeting.open_incident`) as ``{kind, detail,
    node_rank (int or None), host, wall_ns (int, 0 when unknown)}``; a trigger that is not
    such JSON becomes kind ``unknown`` with a detail saying so. Never raises."""
    try:
        d = orjson.loads(data)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        return {
            "kind": "unknown",
            "detail": "unreadable trigger (%d bytes)" % len(data),
            "node_rank": None,
            "host": None,
            "wall_ns": 0,
        }
    nr, wall = d.get("node_rank"), d.get("wall_ns")
    return {
        "kind": str(d.get("kind") or "unknown"),
        "detail": str(d.get("detail") or ""),
        "node_rank": nr if isinstance(nr, int) and not isinstance(nr, bool) else None,
        "host": d.get("host") if isinstance(d.get("host"), str) else None,
        "wall_ns": wall if isinstance(wall, int) and not isinstance(wall, bool) else 0,
    }
