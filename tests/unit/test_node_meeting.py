"""Issue 39: node summaries, the meeting over a real TCPStore (and a shared directory), bad
input (garbage, another version, stale and foreign parts, a node that never answers, a
store that is gone) and the job-wide verdict of parts joined. Real torch TCPStore servers
in this process; no mock."""

import dataclasses
import datetime
import subprocess
import sys
import time

import pytest

from synth import R, S, T0, frames, snap
from jobs import base_env
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.collect.nodes import jobsnap
from hangtrace.tracer.collect.nodes.identity import NodeIdentity, identity_of
from hangtrace.tracer.collect.nodes.meeting import Meeting, checked_registration, checked_trigger
from hangtrace.tracer.collect.nodes.storelink import DirLink, StoreGone, StoreLink
from hangtrace.tracer.collect.nodes.summaryformat import VERSION, SummaryError, decode, encode

dist = pytest.importorskip("torch.distributed")

SLEEP = ("sleep time.py:1", "load_batch mn_ddp.py:26", "main mn_ddp.py:45")


def job_snapshot():
    """4 ranks, 2 per node: rank 3 (node 1) asleep outside collectives, 0-2 in all_reduce seq 6."""
    bs = []
    for r in range(4):
        b = R(r, 4, host="h%d" % (r // 2), pid=100 + r)
        b.coll(n=5)
        if r != 3:
            b.wait()
            b.set(
                stacks=[
                    {
                        "thread_name": "MainThread",
                        "thread_id": 1,
                        "active": False,
                        "frames": frames("all_reduce distributed_c10d.py:2500", "main mn_ddp.py:48"),
                    }
                ]
            )
        else:
            b.set(
                stacks=[
                    {"thread_name": "MainThread", "thread_id": 1, "active": False, "frames": frames(*SLEEP)}
                ]
            )
        b.set(meta={"launch_node_rank": str(r // 2), "launch_node_count": "2"})
        bs.append(b.build())
    return snap(bs)


def node_part(whole, node, incident=1, job="j.0"):
    procs = [p for p in whole.processes if p.rank // 2 == node]
    s = dataclasses.replace(whole, processes=procs)
    return encode(
        s, {"node_rank": node, "node_count": 2, "host": "h%d" % node, "run_dir": "/r", "job": job}, incident
    )


def me(node, count=2):
    return NodeIdentity(node, count, "h%d" % node, ("127.0.0.1", 0), "j.0", (2 * node, 2 * node + 1))


@pytest.fixture
def store():
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5)
    )
    yield server
    del server


def test_summary_roundtrip_gives_the_whole_job_verdict():
    whole = job_snapshot()
    want = diagnose(whole)
    assert (want.kind.value, want.culprit_ranks) == ("stuck-outside-collective", [3])
    part = decode(node_part(whole, 1))
    assert part.node_rank == 1 and [p.rank for p in part.processes] == [2, 3]
    assert part.processes[1].meta["node_rank"] == 1 and part.processes[1].stacks[0]["frames"][1]["line"] == 26
    local = dataclasses.replace(whole, processes=[p for p in whole.processes if p.rank < 2])
    joined = jobsnap.combine([local, dataclasses.replace(whole, processes=list(part.processes))])
    got = diagnose(joined)
    assert (got.kind.value, got.culprit_ranks) == ("stuck-outside-collective", [3])
    assert got.details["nodes"]["culprits"] == {"3": "node 1 (h1)"}
    assert "Rank 3 is on node 1 (h1)" in got.summary
    # node 0 alone: it cannot tell, and says which node it did not see
    alone = dataclasses.replace(
        local,
        nodes=[
            {"node_rank": 0, "host": "h0", "ranks": [0, 1], "seen": True, "why": ""},
            {"node_rank": 1, "host": None, "ranks": [2, 3], "seen": False, "why": "the store is gone"},
        ],
    )
    d0 = diagnose(alone)
    assert d0.culprit_ranks != [3] or d0.kind.value != "stuck-outside-collective"
    assert (
        "Not seen (the verdict is without them): node 1 (host unknown; ranks 2-3): the store is gone"
        in d0.summary
    )


def _as_joined(p):
    """``p`` as a rank whose collectives came from torch's Flight Recorder (DDP's C++
    all-reduce: ``source='flight-recorder'``, ``idx`` = torch's record id + 1) beside our
    own ring records (timer samples) of the same numbers: the two numberings overlap."""
    fr = [dict(r, source="flight-recorder") for r in p.records if r["kind"] == "collective"]
    ours = [  # a memory sample after each collective, numbered like it: the newest record is ours
        dict(r, t_wall_ns=r["t_wall_ns"] + 1, kind="memory", source="timer", op=None, group=None, seq=None)
        for r in fr
    ]
    recs = sorted(ours + fr, key=lambda r: (r["t_wall_ns"], r["source"] == "flight-recorder"))
    return dataclasses.replace(p, records=recs, summary=None)


def test_summary_keeps_flight_recorder_collectives_beside_ring_records_of_the_same_index():
    """A node summary keeps a joined rank's Flight Recorder collectives although their ids
    are the numbers of its ring records too (CI 2026-12-07: node 1's summary kept DDP's
    startup broadcast and dropped the all-reduce its ranks waited in; the job-wide verdict
    named ranks 0, 1 and 3)."""
    whole = job_snapshot()
    whole = dataclasses.replace(whole, processes=[_as_joined(p) for p in whole.processes])
    part = decode(node_part(whole, 1))
    got = {
        p.rank: [(r["op"], r["seq"], r["state"]) for r in p.records if r["kind"] == "collective"]
        for p in part.processes
    }
    assert got[2][-1] == ("all_reduce", 6, "issued") and got[3][-1] == ("all_reduce", 5, "completed"), got
    local = dataclasses.replace(whole, processes=[p for p in whole.processes if p.rank < 2])
    d = diagnose(jobsnap.combine([local, dataclasses.replace(whole, processes=list(part.processes))]))
    assert (d.kind.value, d.culprit_ranks) == ("stuck-outside-collective", [3]), d.summary


def test_summary_is_kilobytes_per_rank():
    whole = job_snapshot()
    assert len(node_part(whole, 1)) < 4096 * 2


@pytest.mark.parametrize(
    "data,why",
    [
        (b"\x00garbage", "garbage"),
        (__import__("zlib").compress(b'{"format": "other"}'), "not a hangtrace node summary"),
        (
            __import__("zlib").compress(b'{"format": "hangtrace-node-summary", "version": 99, "node": {}}'),
            "version 99, this hangtrace reads version %d" % VERSION,
        ),
    ],
)
def test_bad_summaries_are_named(data, why):
    with pytest.raises(SummaryError, match=why):
        decode(data)


def test_identity_from_launch_meta():
    m = {
        "launch_node_rank": "1",
        "launch_node_count": "4",
        "launch_store_addr": "a",
        "launch_store_port": "29500",
        "launch_elastic_run_id": "none",
        "launch_elastic_restart": "0",
    }
    ident = identity_of([(4, m), (5, m), (-1, {})], host="h")
    assert (ident.node_rank, ident.node_count, ident.store, ident.job, ident.ranks) == (
        1,
        4,
        ("a", 29500),
        "none.0",
        (4, 5),
    )
    assert identity_of([(0, dict(m, launch_node_count="1"))]) is None  # one node: no meeting
    assert identity_of([(0, {"launch_node_rank": "x"})]) is None


def test_meeting_names_every_bad_part_and_the_silent_node(store):
    port = store.port
    ident = NodeIdentity(0, 5, "h0", ("127.0.0.1", port), "j.0", (0, 1))
    m0 = Meeting(StoreLink("127.0.0.1", port, 2.0), ident, "/r0")
    m0.register([0, 1])
    n = m0.open_incident("stall", "no progress")
    whole = job_snapshot()
    m1 = Meeting(
        StoreLink("127.0.0.1", port, 2.0), dataclasses.replace(ident, node_rank=1, ranks=(2, 3)), "/r1"
    )
    m1.register([2, 3])
    assert m1.trigger(n)["node_rank"] == 0
    m1.publish_part(n, node_part(whole, 1, incident=n))
    raw = StoreLink("127.0.0.1", port, 2.0)
    raw.set("hangtrace/j.0/incident/%d/part/2" % n, b"garbage")  # a node that publishes garbage
    raw.set("hangtrace/j.0/incident/%d/part/3" % n, node_part(whole, 1, incident=n))  # node 1's, as node 3's
    raw.set("hangtrace/j.0/incident/%d/part/4" % n, node_part(whole, 4, incident=n + 7))  # stale
    raw.set("hangtrace/j.0/node/4", b'{"host": "h4", "ranks": [8, 9], "beat_wall_ns": %d}' % time.time_ns())
    t0 = time.monotonic()
    g = m0.gather(n, 1.0)
    assert time.monotonic() - t0 < 3.0
    assert sorted(g.parts) == [1]
    text = "\n".join(g.errors)
    assert "node 2's summary of incident %d: not a node summary" % n in text
    assert "node 3's summary of incident %d: foreign part: it says it is node 1's" % n in text
    assert "node 4's summary of incident %d: stale part: it answers incident %d" % (n, n + 7) in text
    by = {x["node_rank"]: x for x in g.nodes}
    assert by[1]["seen"] and by[1]["ranks"] == [2, 3]
    assert not by[2]["seen"] and "could not be used: not a node summary" in by[2]["why"]
    # a node that never answers: no part within the deadline, named with its last sign of life
    ident6 = dataclasses.replace(ident, node_count=2)
    m = Meeting(StoreLink("127.0.0.1", port, 2.0), ident6, "/r0")
    n2 = m.open_incident("stall", "x")
    g2 = m.gather(n2, 0.5)
    assert (
        not g2.parts
        and "no summary within" in g2.nodes[1]["why"]
        and "last sign of life" in g2.nodes[1]["why"]
    )


def test_garbled_registrations_and_triggers_are_named_not_fatal(store, tmp_path):
    """Keys under the prefix that parse as JSON of another shape (a registration whose beat
    is a string or whose ranks are a number, another node's registration under this node's
    key, another protocol version, a trigger without numbers): each registration named in
    the gather's errors and the node's why, the triggers read as unknown; the watcher's beat
    still sees the next incident; nothing raises."""
    from hangtrace.tracer.watch.jobwatch import JobWatch

    port = store.port
    ident = NodeIdentity(0, 5, "h0", ("127.0.0.1", port), "j.0", (0, 1))
    m0 = Meeting(StoreLink("127.0.0.1", port, 2.0), ident, "/r0")
    raw = StoreLink("127.0.0.1", port, 2.0)
    raw.set("hangtrace/j.0/node/1", b'{"host": "h1", "ranks": [2, 3], "beat_wall_ns": "yesterday"}')
    raw.set("hangtrace/j.0/node/2", b'{"host": "h2", "ranks": 5, "beat_wall_ns": 1}')
    raw.set("hangtrace/j.0/node/3", b'{"node_rank": 1, "host": "h1", "ranks": [2, 3]}')
    raw.set("hangtrace/j.0/node/4", b'{"version": 7, "host": "h4"}')
    n = m0.open_incident("stall", "x")
    g = m0.gather(n, 0.3)  # (raised TypeError/ValueError on node 1's and 2's before)
    by = {x["node_rank"]: x for x in g.nodes}
    text = "\n".join(g.errors)
    assert "node 1's registration (hangtrace/j.0/node/1): its beat time is 'yesterday'" in text, text
    assert "node 2's registration (hangtrace/j.0/node/2): its ranks are 5, not a list" in text, text
    assert (
        "node 3's registration (hangtrace/j.0/node/3): foreign registration: it says it is node 1's" in text
    )
    assert "registration of protocol version 7, this hangtrace reads version 1" in by[4]["why"], by[4]
    assert all(
        not by[r]["seen"] and "registration in the job's store could not be used" in by[r]["why"]
        for r in (1, 2, 3, 4)
    )
    assert "never registered" not in by[1]["why"] and by[1]["why"].startswith("no summary within")
    # a trigger of the wrong shape: read as unknown, its numbers as unknown
    raw.add("hangtrace/j.0/incidents", 1)
    raw.set("hangtrace/j.0/incident/%d" % (n + 1), b'{"kind": 3, "node_rank": "one", "wall_ns": "now"}')
    assert m0.trigger(n + 1) == {"kind": "3", "detail": "", "node_rank": None, "host": None, "wall_ns": 0}
    assert m0.trigger(n + 1) is not None and m0.trigger(99) is None
    assert checked_trigger(b"[1]")["kind"] == "unknown"
    # the watcher's beat over these keys: it renews, reads the peers it can, and queues node 1's incident
    jw = JobWatch(str(tmp_path), log=lambda s: None)
    jw.me, jw.meeting, jw.seen_n = ident, Meeting(StoreLink("127.0.0.1", port, 2.0), ident, "/r0"), n + 1
    m1 = Meeting(
        StoreLink("127.0.0.1", port, 2.0), dataclasses.replace(ident, node_rank=1, ranks=(2, 3)), "/r1"
    )
    n3 = m1.open_incident("death", "rank 2 died")
    jw._beat()
    assert [i for i, _ in jw.requests()] == [n3] and jw.meeting is not None
    assert sorted(jw.peers) == [] and sorted(jw.meeting.bad_regs) == [1, 2, 3, 4]
    m1.register([2, 3])  # node 1 writes a good registration again: read, no longer named
    jw._beat()
    assert sorted(jw.peers) == [1] and sorted(jw.meeting.bad_regs) == [2, 3, 4]
    with pytest.raises(SummaryError, match="not JSON"):
        checked_registration(1, b"\x00")


def test_gather_reads_parts_that_trickle_in_without_a_pass_per_round(store):
    """20 nodes' parts arrive one per 0.2 s round (a clock and sleep of the test's own; the
    store is real): every part is read, with a pass over the nodes not read yet once a
    second, not in every round the counter moved (that was 20 checks of pending nodes per
    round here: 270 operations; now 82)."""
    port, nodes = store.port, 21
    ident = NodeIdentity(0, nodes, "h0", ("127.0.0.1", port), "j.0", (0, 1))
    m0 = Meeting(StoreLink("127.0.0.1", port, 2.0), ident, "/r0")
    n = m0.open_incident("stall", "x")
    m0.publish_part(n, b"own")
    whole, now, left = job_snapshot(), [0.0], list(range(1, nodes))
    pub = Meeting(StoreLink("127.0.0.1", port, 2.0), dataclasses.replace(ident, node_rank=1), "/r1")

    def sleep(dt):
        now[0] += dt
        if left:
            r = left.pop(0)
            pub.me = dataclasses.replace(ident, node_rank=r)
            pub.publish_part(
                n, encode(dataclasses.replace(whole, processes=[]), {"node_rank": r, "job": "j.0"}, n)
            )

    ops0 = m0.link.ops
    g = m0.gather(n, 30.0, sleep=sleep, clock=lambda: now[0])
    assert sorted(g.parts) == list(range(1, nodes)) and not g.errors, g.errors
    assert m0.link.ops - ops0 < 100, m0.link.ops - ops0


def test_no_store_and_a_store_gone_are_bounded(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(StoreGone, match="cannot connect to the job's store at 127.0.0.1"):
        StoreLink("127.0.0.1", 1, 1.0)  # nothing listens on port 1
    assert time.monotonic() - t0 < 10
    # the store's host dies (node 0's agent): parts read before are kept, the rest named
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=base_env(traced=False)
    )
    try:
        port = int(server.stdout.readline())
        ident = NodeIdentity(0, 3, "h0", ("127.0.0.1", port), "j.0", (0, 1))
        m0 = Meeting(StoreLink("127.0.0.1", port, 1.0), ident, "/r0")
        n = m0.open_incident("death", "x")
        m1 = Meeting(StoreLink("127.0.0.1", port, 1.0), dataclasses.replace(ident, node_rank=1), "/r1")
        m1.publish_part(n, node_part(job_snapshot(), 1, incident=n))
        m0.prefetch(n)  # read while the store lived (the watcher's beat does it)
    finally:
        server.kill()
        server.wait()
    t0 = time.monotonic()
    g = m0.gather(n, 5.0)
    assert time.monotonic() - t0 < 5.0
    assert sorted(g.parts) == [1]
    assert "before the store went away" in g.nodes[2]["why"], g.nodes
    with pytest.raises(StoreGone):
        m0.incidents()
    assert time.monotonic() - t0 < 10


SERVER = """
import datetime, sys, time
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))
print(s.port, flush=True)
time.sleep(600)
"""


def test_meeting_over_a_shared_directory(tmp_path):
    ident = NodeIdentity(0, 2, "h0", ("x", 0), "j.0", (0, 1))
    m0 = Meeting(DirLink(str(tmp_path / "shared")), ident, "/r0")
    m1 = Meeting(DirLink(str(tmp_path / "shared")), dataclasses.replace(ident, node_rank=1), "/r1")
    m1.register([2, 3])
    n = m1.open_incident("stall", "x")
    assert m0.incidents() == n == 1 and m0.trigger(n)["node_rank"] == 1
    m1.publish_part(n, node_part(job_snapshot(), 1, incident=n))
    g = m0.gather(n, 1.0)
    assert sorted(g.parts) == [1] and not g.errors


def test_job_snapshot_folder_is_read_back(tmp_path):
    """Parts stored in a snapshot folder come back as processes of the job (analyze)."""
    whole = job_snapshot()
    sdir = tmp_path / "snap"
    sdir.mkdir()
    data = node_part(whole, 1)
    jobsnap.write_parts(
        str(sdir),
        str(tmp_path),
        0,
        {1: data},
        [decode(data)],
        [{"node_rank": 0, "host": "h0", "ranks": [0, 1], "seen": True, "why": ""}],
        ["e1"],
    )
    (sdir / "nodes" / "node-7.summary").write_bytes(b"junk")
    local = dataclasses.replace(whole, processes=[p for p in whole.processes if p.rank < 2])
    got = jobsnap.with_parts(local, str(sdir))
    assert sorted(p.rank for p in got.processes) == [0, 1, 2, 3]
    assert "e1" in got.errors and any("node-7.summary: not a node summary" in e for e in got.errors)
    assert diagnose(got).culprit_ranks == [3]
    assert T0 and S


def test_a_store_whose_host_stopped_answering_is_bounded_too():
    """torch's timeout does not bound an operation on a store's server that is stopped (SIGSTOP:
    a hung or cut-off host keeps the connection open and never answers; measured: check, add
    and a new client's connection still blocked after 15 s). Every operation gives up after
    the timeout; the link is broken for good; a new connection is bounded likewise."""
    import os
    import signal

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True, env=base_env(traced=False)
    )
    try:
        port = int(server.stdout.readline())
        link = StoreLink("127.0.0.1", port, 1.0)
        assert link.add("k", 1) == 1
        os.kill(server.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5  # (the signal is delivered asynchronously: the server
        while time.monotonic() < deadline:  # answered one more add before it stopped, CI mimic)
            with open("/proc/%d/stat" % server.pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            time.sleep(0.01)
        t0 = time.monotonic()
        with pytest.raises(StoreGone, match="add failed on the job.s store at .*its host stopped answering"):
            link.add("k", 0)
        assert 1.0 <= time.monotonic() - t0 < 4.0
        t0 = time.monotonic()
        with pytest.raises(StoreGone, match="its host stopped answering"):
            link.check("k")  # at once: the link is broken
        assert time.monotonic() - t0 < 0.5
        t0 = time.monotonic()
        with pytest.raises(StoreGone, match="cannot connect to the job's store"):
            StoreLink("127.0.0.1", port, 1.0)
        assert time.monotonic() - t0 < 4.0
    finally:
        server.kill()
        server.wait()
