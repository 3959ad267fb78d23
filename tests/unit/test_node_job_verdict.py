"""Issue 39: above FETCH_ALL_MAX (32) nodes a node other than node 0 gathers nobody's summary;
node 0's verdict, stored in that node's snapshot folder (``nodes/job_verdict.json``), is what
``hangtrace analyze`` of the node's run directory gives, saying where it came from.

40 simulated nodes of 2 ranks meet through one real torch TCPStore (in this process): node 5
has a real run directory (real ring files of ranks 10-11, with the launcher's facts as ring
meta) and a real JobWatch; the other nodes publish real node summaries of synthetic ranks
(``summaryformat.encode``, as ``benchmarks/bench_multinode.py`` makes them); node 0 gathers
every part, diagnoses the job (rank 79 on node 39 asleep outside collectives) and publishes
its verdict. A node lost whole is named as such (``analyze/nodes.lost_nodes``)."""

import dataclasses
import datetime
import json
import os
import threading

import pytest

from synth import R, S, frames, snap
from hangtrace import cli
from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer import pipeline
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.collect.nodes.identity import NodeIdentity
from hangtrace.tracer.collect.nodes.meeting import Meeting
from hangtrace.tracer.collect.nodes.storelink import StoreLink
from hangtrace.tracer.collect.nodes.summaryformat import encode
from hangtrace.tracer.report.text import verdict_paragraph
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch import jobwatch
from hangtrace.tracer.watch.jobverdict import verdict_doc

dist = pytest.importorskip("torch.distributed")

NODES, PER, JOB, ME = 40, 2, "j.0", 5
WORLD = NODES * PER
SLEEPER = WORLD - 1  # on the last node
SLEEP = ("sleep time.py:1", "load_batch train.py:26", "main train.py:45")


def synth_rank(r):
    b = R(r, WORLD, host="node%d" % (r // PER), pid=100 + r)
    b.coll(n=5, numel=8, shape=None)
    fr = SLEEP if r == SLEEPER else ("all_reduce distributed_c10d.py:2500", "main train.py:48")
    if r != SLEEPER:
        b.wait(numel=8, shape=None)
    b.set(stacks=[{"thread_name": "MainThread", "thread_id": 1, "active": False, "frames": frames(*fr)}])
    b.set(meta={"launch_node_rank": str(r // PER), "launch_node_count": str(NODES)})
    return b.build()


def real_ring(run_dir, rank, port):
    """Rank ``rank``'s real ring: 5 all_reduce done, the 6th issued; the launcher's facts."""
    rec = Recorder(str(run_dir), "run-p", 64, lambda *a: None)
    try:
        rec.set_rank(rank, rank, WORLD)
        rec.set_meta(
            launch_node_rank=str(ME),
            launch_node_count=str(NODES),
            launch_store_addr="127.0.0.1",
            launch_store_port=str(port),
            launch_elastic_run_id="j",
            launch_elastic_restart="0",
        )
        g = rec.intern("0")
        rec.group_created(
            {"op": "init_process_group", "name": "0", "desc": "default_pg", "backend": "gloo"}
            | {"ranks": list(range(WORLD)), "order": 0, "member": True}
        )
        for i in range(1, 7):
            c = rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, i, 8, 0, F.DTYPE_IDS["float32"], -1, 0)
            if i < 6:
                rec.complete(c)
    finally:
        rec.close()
    host, pid = "node%d" % ME, 50000 + rank  # (another host: its liveness is 'unknown')
    with open(rec.path, "r+b") as f:
        ident = list(F.IDENT.unpack(f.read(F.HEADER_SIZE)[F.IDENT_OFF : F.IDENT_OFF + F.IDENT.size]))
        ident[0] = pid
        f.seek(F.IDENT_OFF)
        f.write(F.IDENT.pack(*ident))
        f.seek(F.HOST_OFF)
        f.write(host.encode().ljust(F.HOST_LEN, b"\0"))
    os.rename(rec.path, os.path.join(str(run_dir), "ring-%s-%d.htr" % (host, pid)))


def ident(node, port):
    return NodeIdentity(node, NODES, "node%d" % node, ("127.0.0.1", port), JOB, (PER * node, PER * node + 1))


def node0(port, n, whole, done):
    """Node 0: gathers every part of incident ``n``, diagnoses the job, publishes its verdict."""
    me0 = ident(0, port)
    m0 = Meeting(StoreLink("127.0.0.1", port, 5.0), me0, "/r0")
    g = m0.gather(n, 20.0)
    procs = [p for p in whole.processes if p.rank < PER] + [q for p in g.parts.values() for q in p.processes]
    job = dataclasses.replace(whole, processes=procs, nodes=g.nodes, path="/r0/snapshots/t0")
    diag = diagnose(job)
    res = pipeline.Result(job, diag, verdict_paragraph(diag))
    m0.publish_verdict(n, verdict_doc(res, me0, n))
    done.append(res)


@pytest.fixture
def store():
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5)
    )
    yield server
    del server


def test_analyze_of_a_node_above_32_nodes_gives_node_0s_job_verdict(tmp_path, store, capsys):
    port = store.port
    run = tmp_path / "node5"
    run.mkdir()
    for r in (PER * ME, PER * ME + 1):
        real_ring(run, r, port)
    whole = snap([synth_rank(r) for r in range(WORLD)])
    me = ident(ME, port)
    link = StoreLink("127.0.0.1", port, 5.0)
    n = Meeting(link, ident(0, port), "/r0").open_incident("stall", "no progress")
    for node in range(1, NODES):  # every other node's real summary of its (synthetic) ranks
        if node != ME:
            part = dataclasses.replace(whole, processes=[p for p in whole.processes if p.rank // PER == node])
            doc = {
                "node_rank": node,
                "node_count": NODES,
                "host": "node%d" % node,
                "run_dir": "/r",
                "job": JOB,
            }
            Meeting(link, ident(node, port), "/r").publish_part(n, encode(part, doc, n))
    done = []
    t = threading.Thread(target=node0, args=(port, n, whole, done))
    t.start()
    # node 5: its own snapshot (the real rings), then the meeting as its watcher answers
    local = pipeline.dump_live(str(run), "stall", with_stacks=False, stall_s=60.0)
    jw = jobwatch.JobWatch(str(run), lambda line: None)
    jw.me, jw.meeting, jw.wait_s = me, Meeting(StoreLink("127.0.0.1", port, 5.0), me, str(run)), 20.0
    assert not jw._fetch_all()  # 40 > FETCH_ALL_MAX: node 5 gathers nobody's part
    got = jw.answer(n, local)
    t.join(30)
    assert done, "node 0 published no verdict"
    want = done[0].diagnosis
    assert (want.kind, want.culprit_ranks) == ("stuck-outside-collective", [SLEEPER])
    assert want.details["nodes"]["culprits"] == {str(SLEEPER): "node 39 (node39)"}
    sdir = local.snapshot.path
    stored = os.path.join(sdir, "nodes", "job_verdict.json")
    for res in (got, pipeline.diagnose_path(str(run))):  # the watcher's verdict and analyze's
        d = res.diagnosis
        assert (d.kind, d.culprit_ranks) == ("stuck-outside-collective", [SLEEPER]), res.paragraph
        assert d.details["nodes"]["culprits"] == {str(SLEEPER): "node 39 (node39)"}
        assert d.details["nodes"]["from"]["file"] == stored and d.details["nodes"]["from"]["node_rank"] == 0
        assert res.paragraph.startswith(done[0].paragraph), res.paragraph
        assert "assembled by node 0 (node0) from 40 nodes' summaries (incident %d" % n in res.paragraph
        assert stored in res.paragraph and "only its own node (ranks 10-11)" in res.paragraph
        assert len(res.snapshot.nodes) == NODES
    assert cli.main(["analyze", "--json", str(run)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["culprit_ranks"] == [SLEEPER] and out["details"]["nodes"]["from"]["file"] == stored
    assert out["evidence"][0].startswith("The job's verdict, assembled by node 0")
    # without node 0's verdict the node's own analysis stands: node-local, the other nodes not seen
    os.rename(stored, stored + ".away")
    own = pipeline.diagnose_path(str(run))
    assert "from" not in own.diagnosis.details["nodes"] and own.diagnosis.kind == "unknown"
    assert len(own.diagnosis.details["nodes"]["unseen"]) == NODES - 1
    # a stored verdict that cannot be used is named (file and remedy); the rest analysed
    with open(stored, "w") as f:
        f.write('{"nodes": [{"seen": true}, {"seen": true}], "kind": "no-such-kind"}')
    bad = pipeline.diagnose_path(str(run))
    assert any(
        e.startswith(stored) and "no-such-kind" in e and "remedy:" in e for e in bad.snapshot.errors
    ), bad.snapshot.errors
    assert bad.diagnosis.kind == own.diagnosis.kind
    with open(stored, "w") as f:
        f.write("[1, 2")
    assert any("unreadable" in e for e in pipeline.diagnose_path(str(run)).snapshot.errors)


def test_a_node_that_saw_every_node_keeps_its_own_analysis(tmp_path):
    """Up to 32 nodes every node gathers every part: node 0's stored verdict is not used."""
    from hangtrace.tracer.collect.nodes.jobverdictfile import stored_job_verdict

    sdir = tmp_path / "s"
    (sdir / "nodes").mkdir(parents=True)
    both = [{"node_rank": i, "seen": True} for i in range(2)]
    (sdir / "nodes" / "job_verdict.json").write_text(json.dumps({"nodes": both, "kind": "unknown"}))
    s = dataclasses.replace(snap([synth_rank(0)]), path=str(sdir), nodes=both)
    assert stored_job_verdict(s) == (s, None)


def lost_snapshot(beat):
    """Node 0's view after node 1 (ranks 2-3) and its watcher were killed: ranks 0-1 failed
    with 'Connection reset by peer' in the all_reduce; node 1 not seen, its watcher's last
    beat ``beat``."""
    bs = []
    for r in (0, 1):
        b = R(r, 4, host="h0", pid=100 + r)
        b.coll(n=5)
        msg = "[pair.cc:537] Read error [127.0.0.1]:48824: Connection reset by peer"
        ev = {
            "event": "exception",
            "type": "RuntimeError",
            "message": msg,
            "traceback": "",
            "wall_ns": b.t + r * S,
        }
        b.set(state="exited", exit_code=1, events=[ev])  # rank 0 raised first, rank 1 a second later
        b.set(meta={"launch_node_rank": "0", "launch_node_count": "2"})
        bs.append(b.build())
    s = snap(bs, reason="death")
    why = "add failed on the job's store at 127.0.0.1:1: Broken pipe"
    nodes = [
        {"node_rank": 0, "host": "h0", "ranks": [0, 1], "seen": True, "why": ""},
        {"node_rank": 1, "host": "h1", "ranks": [2, 3], "seen": False, "why": why, "last_beat_wall_ns": beat},
    ]
    return dataclasses.replace(s, nodes=nodes)


def test_a_node_lost_whole_is_the_root_not_a_transport_error_without_a_dead_rank():
    s = lost_snapshot(0)
    s = dataclasses.replace(
        s, nodes=[dict(n, last_beat_wall_ns=s.taken_wall_ns - 7 * 10**9) for n in s.nodes]
    )
    d = diagnose(s)
    text = verdict_paragraph(d)
    assert (d.kind, d.cause, d.culprit_ranks) == ("dead-rank", "killed-without-record", [2, 3]), text
    assert [n["node_rank"] for n in d.details["nodes"]["lost"]] == [1]
    assert "node 1 (h1; ranks 2-3) went away whole" in text and "7 s before this snapshot" in text
    assert "no rank is dead" not in text and "check the kernel log (dmesg)" not in text, text
    assert "Next: look at node 1 (h1) itself" in text
    assert "its watcher's last sign of life" in d.details["nodes"]["unseen"][0]
    assert sorted(c["rank"] for c in d.cascade) == [0, 1]
    # its watcher never seen alive here (no beat): the ranks are lost with their node, said hedged
    plain = diagnose(dataclasses.replace(s, nodes=[dict(n, last_beat_wall_ns=None) for n in s.nodes]))
    text = verdict_paragraph(plain)
    assert (plain.kind, plain.culprit_ranks) == ("dead-rank", [2, 3]) and "no rank is dead" not in text
    assert "node 1 (h1; ranks 2-3) is gone from this node's view, perhaps whole" in text, text
    assert "its watcher was never seen here (add failed on the job's store" in text, text
    assert plain.details["nodes"]["lost"][0]["seen_alive"] is False
    # the ranks seen wait in their collective (no transport failure): no node is called lost
    waiting = []
    for r in (0, 1):
        b = R(r, 4, host="h0", pid=100 + r)
        b.coll(n=5)
        b.wait()
        waiting.append(b.set(meta={"launch_node_rank": "0", "launch_node_count": "2"}).build())
    hung = diagnose(dataclasses.replace(snap(waiting), nodes=s.nodes))
    assert hung.kind != "dead-rank" and "lost" not in hung.details["nodes"], verdict_paragraph(hung)
    assert "its watcher's last sign of life" in hung.details["nodes"]["unseen"][0]
