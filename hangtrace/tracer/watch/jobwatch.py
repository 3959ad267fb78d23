"""One verdict across the nodes of a torchrun job (issue 39): the node watcher's side.

In: this node's run directory (ranks' ``launch_*`` ring meta: ``collect/nodes/identity``),
the job's torch.distributed store (``collect/nodes/storelink``; ``HANGTRACE_SHARED_DIR`` when
the store cannot be reached), this node's incidents and snapshots. Out: the job-wide
``pipeline.Result`` of an incident, stored in this node's snapshot folder
(``collect/nodes/jobsnap``) and, from node 0, published as the job's verdict.

:class:`JobWatch` runs a daemon thread that finds the node's identity, connects (importing
torch there, never in the detection loop), renews the node's registration every
:data:`BEAT_S` seconds and notices incidents other nodes open. The watcher's own loop calls
:meth:`JobWatch.incident` for an incident it detected and :meth:`JobWatch.requests` for
those of other nodes, then :meth:`JobWatch.answer`: publish this node's summary, gather the
others' (``HANGTRACE_NODE_WAIT_S``), assemble the job-wide snapshot and verdict. Every
store operation is bounded (``HANGTRACE_STORE_TIMEOUT_S``); a store that is gone gives the
node-local verdict naming the nodes and ranks it could not see.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from hangtrace.tracer import config

Log = Callable[[str], None]

#: seconds between two registrations (the node's beat) and two reads of the incident counter
BEAT_S = 2.0
#: seconds between two attempts to find the identity or reach the store
RETRY_S = 3.0
#: :meth:`JobWatch.incident`: the store cannot be reached; this incident was answered already
GONE, ANSWERED = -1, -2
#: seconds within which an incident another node opened is the one this node detects too (a
#: job-wide stall is seen by every node within a poll or two; a death's cascade within seconds)
JOIN_S = 15.0
#: above this many nodes, a node other than node 0 fetches the job's verdict, not every part
FETCH_ALL_MAX = 32


class JobWatch:
    """The meeting of this node's watcher (module docstring). ``log``: one line each."""

    def __init__(self, run_dir: str, log: Log, stall_s: float = 300.0) -> None:
        self.run_dir, self.log, self.stall_s = run_dir, log, stall_s
        self.wait_s = config.get_float(config.NODE_WAIT_S)
        self.timeout_s = config.get_float(config.STORE_TIMEOUT_S)
        self.me: Any = None  # NodeIdentity once found
        self.meeting: Any = None
        self.last_meeting: Any = None  # the meeting before the store went away (its parts read)
        self.gone: Optional[str] = None  # why the store cannot be used now
        self.seen_n = 0
        #: node rank -> its registration as last read by the beat (``beat_wall_ns``: that node's
        #: watcher's last sign of life seen here; host, ranks), for jobs of up to FETCH_ALL_MAX nodes
        self.peers: Dict[int, Dict[str, Any]] = {}
        self.answered: Dict[int, float] = {}  # incident -> monotonic time answered
        self._pending: List[Tuple[int, Dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._retry_s = RETRY_S  # grows while the store cannot be reached (a hung connection keeps a thread)
        self._stop = threading.Event()
        self._tried = threading.Event()  # set after the first attempt to reach the store
        self._thread: Optional[threading.Thread] = None

    @property
    def active(self) -> bool:
        """True once this run is known to be one node of several."""
        return self.me is not None

    def start(self) -> "JobWatch":
        if os.environ.get(config.MULTINODE, config.DEFAULTS[config.MULTINODE]) != "0":
            self._thread = threading.Thread(target=self._run, name="hangtrace-jobwatch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    # --- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        next_identity = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_identity:
                    self._refresh_identity()
                    next_identity = time.monotonic() + (10 * BEAT_S if self.me is not None else RETRY_S)
                if self.me is not None and self.meeting is None:
                    self._connect()
                    self._tried.set()
                if self.meeting is not None:
                    self._beat()
            except Exception as e:  # never let the thread die silently
                self.log("node meeting: %r" % (e,))
            if self.meeting is not None or self.me is None:
                self._retry_s = RETRY_S
            else:
                self._retry_s = min(60.0, self._retry_s * 2)
            self._stop.wait(BEAT_S if self.meeting is not None or self.me is None else self._retry_s)

    def _refresh_identity(self) -> None:
        from hangtrace.tracer.collect.nodes.identity import find_identity

        me = find_identity(self.run_dir)
        if me is not None and (self.me is None or me.ranks != self.me.ranks):
            if self.me is None:
                self.log(
                    "%s of %d nodes of job %s; store %s:%d" % (me.label, me.node_count, me.job, *me.store)
                )
            self.me = me
            if self.meeting is not None:
                self.meeting.me = me

    def _connect(self, why_not_store: Optional[str] = None) -> None:
        """Meet in the job's store; when it cannot be reached (no connection, or an operation
        that fails or hangs: its host stopped or cut off), or ``why_not_store`` says it cannot,
        in ``HANGTRACE_SHARED_DIR`` if given. Raises StoreGone for the shared directory only."""
        from hangtrace.tracer.collect.nodes.storelink import DirLink, StoreGone, StoreLink

        with self._connecting:
            if self.meeting is not None:  # (the other thread met meanwhile)
                return
            try:
                if why_not_store:
                    raise StoreGone(why_not_store)
                m, seen = self._meet(StoreLink(self.me.store[0], self.me.store[1], self.timeout_s))
            except StoreGone as e:
                shared = os.environ.get(config.SHARED_DIR)
                if not shared:
                    if self.gone != str(e):
                        self.log("node meeting: %s" % e)
                    self.gone = str(e)
                    return
                self.log("node meeting: %s; meeting in the shared directory %s instead" % (e, shared))
                m, seen = self._meet(DirLink(os.path.join(shared, "hangtrace-" + self.me.job)))
            self.meeting = self.last_meeting = m
            self.seen_n = seen  # earlier incidents are not ours to answer
            self.gone = None
            self.log("node meeting: registered %s in %s" % (self.me.label, m.link.where))

    def _to_shared_dir(self) -> Any:
        """The meeting in ``HANGTRACE_SHARED_DIR`` once the store failed (:attr:`gone`), or None
        (no shared directory given, or it cannot be used either). Never raises."""
        if self.me is None or not os.environ.get(config.SHARED_DIR):
            return None
        try:
            self._connect(self.gone or "the job's store could not be reached")
        except Exception as e:
            self.log("node meeting: %s" % (e,))
        return self.meeting

    def _meet(self, link: Any) -> Tuple[Any, int]:
        """A Meeting over ``link`` with this node registered, and the incidents opened so far.
        Raises StoreGone."""
        from hangtrace.tracer.collect.nodes.meeting import Meeting

        m = Meeting(link, self.me, self.run_dir)
        m.register(list(self.me.ranks))
        seen = m.incidents()
        if self.me.node_count <= FETCH_ALL_MAX:
            self._read_peers(m)  # (the nodes registered before this one: alive now)
        return m, seen

    def _beat(self) -> None:
        from hangtrace.tracer.collect.nodes.storelink import StoreGone

        m = self.meeting
        try:
            m.register(list(self.me.ranks))
            n = m.incidents()
            new = []
            for i in range(self.seen_n + 1, n + 1):
                trig = m.trigger(i)
                if trig is not None and trig.get("node_rank") != self.me.node_rank:
                    new.append((i, trig))
            self.seen_n = max(self.seen_n, n)
            if self.me.node_count <= FETCH_ALL_MAX:  # the store dies with its host: read early
                for i in range(max(1, n - 2), n + 1):
                    m.prefetch(i)
                self._read_peers(m)
        except StoreGone as e:
            self.gone = str(e)
            self.meeting = None
            self.log("node meeting: %s" % e)
            return
        with self._lock:
            self._pending.extend(new)

    def _read_peers(self, m: Any) -> None:
        """The other nodes' registrations (their watchers' beats), kept when they are newer."""
        for r in range(self.me.node_count):
            if r == self.me.node_rank:
                continue
            reg = m.registration(r)
            if reg is not None and int(reg.get("beat_wall_ns") or 0) >= int(
                self.peers.get(r, {}).get("beat_wall_ns") or 0
            ):
                self.peers[r] = reg

    # --- the watcher's loop ----------------------------------------------------------
    def requests(self) -> List[Tuple[int, Dict[str, Any]]]:
        """Incidents other nodes opened that this node has not answered (non-blocking)."""
        with self._lock:
            out = [(n, t) for n, t in self._pending if n not in self.answered]
            self._pending.clear()
        return out

    def incident(self, kind: str, detail: str) -> Optional[int]:
        """This node detected ``kind``: the incident it belongs to (one opened within
        ``max(JOIN_S, HANGTRACE_NODE_WAIT_S)`` seconds is joined, else a new one is opened); :data:`GONE`
        when the store cannot be reached (the verdict is node-local, naming what it could not
        see); :data:`ANSWERED` when this node answered that incident already (its verdict
        was given); None when this run is not one node of several."""
        if self.me is None:
            return None
        from hangtrace.tracer.collect.nodes.storelink import StoreGone

        if not self._tried.is_set():  # still importing torch or connecting: wait, bounded
            self._tried.wait(self.wait_s)
        for _ in range(2):  # the store, then (when it fails now) the shared directory
            m = self.meeting or self._to_shared_dir()
            if m is None:
                return GONE
            try:
                return self._join_or_open(m, kind, detail)
            except StoreGone as e:
                self.gone, self.meeting = str(e), None
        return GONE

    def _join_or_open(self, m: Any, kind: str, detail: str) -> int:
        """The incident of ``m`` this detection belongs to (:meth:`incident`). Raises StoreGone."""
        n = m.incidents()
        if n >= 1:
            trig = m.trigger(n) or {}
            age = (time.time_ns() - int(trig.get("wall_ns") or 0)) / 1e9
            if age <= max(JOIN_S, self.wait_s):  # the same incident seen from another node
                return ANSWERED if n in self.answered else n
        return int(m.open_incident(kind, detail))

    def answer(self, n: int, res: Any) -> Any:
        """The job-wide Result of incident ``n`` (``-1``: the store is gone) from this node's
        ``res`` (``pipeline.Result`` of its own snapshot): published, gathered, assembled,
        stored in the snapshot folder. Never raises for the store; bounded in time."""
        from hangtrace.tracer.watch.jobverdict import assemble

        self.answered[n] = time.monotonic()
        if n < 0 or self.meeting is None:
            return self._without_store(res)
        from hangtrace.tracer.collect.nodes.storelink import StoreGone
        from hangtrace.tracer.watch.jobverdict import publish_and_gather, with_peers

        try:
            g = publish_and_gather(self.meeting, n, res, self.wait_s, fetch_all=self._fetch_all())
        except StoreGone as e:
            self.gone, self.meeting = str(e), None
            return self._without_store(res)
        job = assemble(self.run_dir, res, self.me, g, with_peers(g.nodes, self.peers) if g else [], self.log)
        return self._share_verdict(n, job)

    def await_takers(self, timeout_s: float = 10.0) -> None:
        """On node 0 of a job of several nodes, before ``--stop-on-stall`` stops its job (and
        the store its agent hosts, torchrun's static rendezvous): wait until every other node
        stored the job's verdict of the newest incident, at most ``timeout_s``. Never raises."""
        m = self.meeting
        if m is None or self.me is None or self.me.node_rank != 0 or not self.answered:
            return
        n = max(self.answered)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and m.verdict_takers(n) < self.me.node_count - 1:
                time.sleep(0.2)
        except Exception:
            return

    def _without_store(self, res: Any) -> Any:
        """The verdict when the store cannot be reached: with the parts of the newest
        incident read before it went away, else node-local, naming what it could not see."""
        from hangtrace.tracer.watch.jobverdict import assemble, unseen_nodes, with_peers

        why = self.gone or "the job's store could not be reached"
        m = self.last_meeting
        if m is not None and m.cache:
            n = max(i for i, _ in m.cache)
            g = m.gather(n, 0.0)
            g.errors.append(
                "the job's store went away (%s): the parts of incident %d read before are used" % (why, n)
            )
            return assemble(self.run_dir, res, self.me, g, with_peers(g.nodes, self.peers), self.log)
        nodes = with_peers(unseen_nodes(self.me, res.snapshot, why), self.peers)
        return assemble(self.run_dir, res, self.me, None, nodes, self.log)

    def _fetch_all(self) -> bool:
        return self.me.node_rank == 0 or self.me.node_count <= FETCH_ALL_MAX

    def _share_verdict(self, n: int, job: Any) -> Any:
        """Node 0 publishes the job's verdict; the others store node 0's beside theirs. Returns
        the job's Result: ``job``, or node 0's verdict when it saw more nodes than this node
        did (above FETCH_ALL_MAX nodes: ``collect/nodes/jobverdictfile``)."""
        from hangtrace.tracer.collect.nodes.storelink import StoreGone
        from hangtrace.tracer.watch.jobverdict import node0_result, store_verdict, verdict_doc

        try:
            if self.me.node_rank == 0:
                self.meeting.publish_verdict(n, verdict_doc(job, self.me, n))
                return job
            deadline = time.monotonic() + (self.wait_s if not self._fetch_all() else min(5.0, self.wait_s))
            while time.monotonic() < deadline:
                v = self.meeting.verdict(n)
                if v is not None:
                    store_verdict(job.snapshot.path, v)
                    self.meeting.verdict_taken(n)
                    return node0_result(job)
                time.sleep(0.2)
        except StoreGone as e:
            self.log("node meeting: the job's verdict was not shared: %s" % e)
        return job


def answer_all(jw: JobWatch, dump: Callable[[str], Any], report: Callable[[Any], None]) -> None:
    """The watcher loop's step for other nodes' incidents: for each, this node's snapshot
    (``dump(kind)``), then the job-wide verdict passed to ``report``. Never raises."""
    for n, trig in jw.requests():
        try:
            jw.log(
                "incident %d from node %s: %s: %s"
                % (n, trig.get("node_rank"), trig.get("kind"), trig.get("detail"))
            )
            kind = trig.get("kind") if trig.get("kind") in ("stall", "death") else "request"
            report(jw.answer(n, dump(str(kind))))
        except Exception as e:
            jw.log("incident %d: job-wide verdict failed: %r" % (n, e))


def local_incident(jw: Optional[JobWatch], kind: str, detail: str, dump: Callable[[str], Any]) -> Any:
    """An incident this node detected: its Result (job-wide when the run is one node of
    several: ``JobWatch.incident`` then ``answer``), or None when it belongs to an incident
    this node answered already (its verdict was given). ``dump(kind)``: this node's
    snapshot, diagnosed (``pipeline.dump_live``)."""
    n = jw.incident(kind, detail) if jw is not None else None
    if n == ANSWERED:
        assert jw is not None
        jw.log("%s: part of the incident this node answered already; its job-wide verdict was given" % kind)
        return None
    res = dump(kind)
    if n is None:
        return res
    assert jw is not None
    return jw.answer(n, res)


def dump_job(run_dir: str, dump: Callable[[str], Any], log: Log, stall_s: float = 300.0) -> Any:
    """``hangtrace dump`` on one node of a multi-node job: opens an incident ('request') in
    the job's store so that every node's watcher sends its summary, and returns the
    job-wide Result assembled here (``dump('request')``: this node's snapshot). A run that
    is one node, or ``HANGTRACE_MULTINODE_MEET=0``: ``dump('request')`` alone. Bounded in
    time like the watcher's meeting."""
    jw = JobWatch(run_dir, log, stall_s)
    if os.environ.get(config.MULTINODE, config.DEFAULTS[config.MULTINODE]) != "0":
        jw._refresh_identity()
    if jw.me is None:
        return dump("request")
    jw._connect()
    jw._tried.set()
    n = (
        GONE
        if jw.meeting is None
        else jw.meeting.open_incident("request", "hangtrace dump on %s" % jw.me.label)
    )
    return jw.answer(n, dump("request"))
