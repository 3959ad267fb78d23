"""Builders of synthetic snapshots for the analysis/report unit tests.

``R(rank, world)`` builds one ``ProcessInfo``: ``.coll(group, op=...)`` appends a
collective with the next per-group seq, ``.p2p(group, peer, op)`` a p2p op with the next
per-(group, peer) seq; records get increasing ``idx`` and ``t_wall_ns`` (1 ms apart from
``T0`` plus the rank's offset). ``.build()`` returns the ProcessInfo. Times are ns.
"""

from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

T0 = 1_700_000_000_000_000_000  # ns since the epoch
MS = 1_000_000
S = 1_000_000_000


def group(name, ranks, desc=None, order=0, backend="gloo"):
    return {"name": name, "desc": desc or name, "backend": backend, "ranks": list(ranks), "order": order}


def world(n):
    return group("0", range(n), desc="default_pg")


def frames(*fr):
    """frames('get queue.py:171', 'worker x.py:10') innermost first -> py-spy frame dicts."""
    out = []
    for f in fr:
        name, loc = f.split(" ", 1)
        fn, line = loc.rsplit(":", 1)
        out.append(
            {
                "name": name,
                "filename": "/usr/lib/python3.11/" + fn if "/" not in fn else fn,
                "line": int(line),
            }
        )
    return out


def stack(*fr, active=True, extra_threads=()):
    threads = [{"thread_name": "MainThread", "thread_id": 1, "active": active, "frames": frames(*fr)}]
    for name, fr2 in extra_threads:
        threads.append({"thread_name": name, "thread_id": 2, "active": True, "frames": frames(*fr2)})
    return threads


COLL_STACK = (
    "all_reduce /site-packages/torch/distributed/distributed_c10d.py:2500",
    "wrapper /site-packages/torch/distributed/c10d_logger.py:80",
    "train_step train.py:40",
    "main train.py:90",
    "<module> train.py:100",
)


class R:
    def __init__(self, rank, world_size, groups=None, host="h0", pid=None, t0=T0, phase="train", step=0):
        self.rank = rank
        self.world = world_size
        self.groups = list(groups) if groups is not None else [world(world_size)]
        self.host = host
        self.pid = pid if pid is not None else 1000 + rank
        self.t = t0 + rank * 10  # keep ranks' clocks a little apart
        self.idx = 0
        self.records = []
        self.seqs = {}
        self.phase = phase
        self.step = step
        self.kw = {}

    def _rec(
        self,
        kind,
        op,
        grp,
        seq,
        peer=-1,
        dtype="float32",
        numel=1,
        shape=None,
        state="completed",
        error=None,
        async_op=False,
        dt=MS,
    ):
        self.idx += 1
        self.t += dt
        r = {
            "idx": self.idx,
            "kind": kind,
            "op": op,
            "group": grp,
            "seq": seq,
            "dtype": dtype,
            "numel": numel,
            "shape": shape or ("[%d]" % numel if numel is not None else None),
            "peer": peer,
            "async_op": async_op,
            "batch": False,
            "thread": "MainThread",
            "phase": self.phase,
            "step": self.step,
            "t_mono_ns": self.t - T0,
            "t_wall_ns": self.t,
            "t_end_mono_ns": (self.t - T0 + 100_000) if state != "issued" else None,
            "state": state,
            "error": error,
            "a": (0, 0, 0, 0, 0),
        }
        self.records.append(r)
        return r

    def coll(self, grp="0", op="all_reduce", n=1, seq=None, **kw):
        for _ in range(n):
            s = seq if seq is not None else self.seqs.get(grp, 0) + 1
            self.seqs[grp] = s
            last = self._rec("collective", op, grp, s, **kw)
        return last

    def p2p(self, grp, peer, op, seq=None, **kw):
        key = (grp, peer)
        s = seq if seq is not None else self.seqs.get(key, 0) + 1
        self.seqs[key] = s
        return self._rec("p2p", op, grp, s, peer=peer, **kw)

    def mark(self, kind="step", **kw):
        """A non-collective record (step/phase/heartbeat)."""
        if "step" in kw:
            self.step = kw["step"]
        if "phase" in kw:
            self.phase = kw["phase"]
        return self._rec(kind, "", None, 0, dtype="", numel=0, dt=kw.get("dt", MS))

    def wait(self, grp="0", op="all_reduce", **kw):
        """Issue a collective that does not complete (the rank blocks in it)."""
        return self.coll(grp, op, state="issued", **kw)

    def set(self, **kw):
        self.kw.update(kw)
        return self

    def build(self, keep_last=None):
        recs = self.records[-keep_last:] if keep_last else list(self.records)
        kw = dict(
            host=self.host,
            pid=self.pid,
            rank=self.rank,
            local_rank=self.rank % 8,
            world_size=self.world,
            state="alive",
            start_wall_ns=T0,
            phase=self.phase,
            step=self.step,
            progress_wall_ns=self.t,
            records=recs,
            groups=list(self.groups),
        )
        kw.update(self.kw)
        return ProcessInfo(**kw)


def snap(procs, reason="stall", taken=None, errors=()):
    procs = [p.build() if isinstance(p, R) else p for p in procs]
    last = max((p.progress_wall_ns for p in procs), default=T0)
    return Snapshot(
        run_dir="/tmp/run",
        taken_wall_ns=taken if taken is not None else last + 600 * S,
        reason=reason,
        processes=procs,
        errors=list(errors),
    )


def ranks(n, steps=3, world_size=None, groups=None, grp="0"):
    """n rank builders that all completed ``steps`` all_reduces on ``grp``."""
    ws = world_size or n
    out = [R(r, ws, groups=groups) for r in range(n)]
    for b in out:
        b.coll(grp, n=steps)
    return out
