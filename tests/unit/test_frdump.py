"""Flight Recorder import: restricted unpickler, formats, versions, records, merge (issue 10)."""

import dataclasses
import json
import os
import pickle

import pytest

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.collect.frdump import (
    FlightRecordError,
    UnsafePickleError,
    UnsupportedFrVersionError,
    load_fr_dir,
    parse_fr_bytes,
    read_fr_file,
    split_profiling_name,
)
from hangtrace.tracer.collect.rings import snapshot_with_fr
from hangtrace.tracer.ring.frrecords import fr_records, fr_state, merge_records

T0 = 1_700_000_000_000_000_000


def entry(
    seq,
    name="gloo:all_reduce",
    sizes=((676,),),
    retired=True,
    state="scheduled",
    pg=("0", "default_pg"),
    t=None,
    rid=None,
):
    return {
        "record_id": seq - 1 if rid is None else rid,
        "pg_id": 0,
        "process_group": pg,
        "thread_name": "python",
        "thread_id": "1",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": T0 + seq * 1000 if t is None else t,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"] * len(sizes),
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["Float"] * len(sizes),
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": retired,
        "timeout_ms": 600000,
        "is_p2p": False,
        "a_key_from_the_future": 1,
    }


def dump(entries, version="2.10"):
    return {
        "version": version,
        "comm_lib_version": "",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": 3,
                "last_started_collective": -1,
                "last_completed_collective": 2,
            }
        },
        "entries": entries,
    }


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/hangtrace-pwned",))


def test_malicious_pickle_refused_naming_the_file(tmp_path):
    p = tmp_path / "comm_lib_trace_rank_0"
    p.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Evil()]}))
    with pytest.raises(UnsafePickleError) as ei:
        read_fr_file(str(p))
    assert str(p) in str(ei.value) and "posix.system" in str(ei.value)
    assert not os.path.exists("/tmp/hangtrace-pwned")


def test_torch_list_builders_admitted(tmp_path):
    import torch.jit._pickle as jp  # the globals torch::jit::Pickler writes

    class Built:
        def __reduce__(self):
            return (jp.build_intlist, ([[5, 2]],))

    d = dump([entry(1)])
    d["entries"][0]["input_sizes"] = Built()
    data = pickle.dumps(d)
    assert b"build_intlist" in data
    got = parse_fr_bytes(data, "x")
    assert got.entries[0].input_sizes == ((5, 2),)


def test_pickle_json_and_bare_list_read_alike(tmp_path):
    d = dump([entry(1), entry(2, "nccl:send 1->2")])
    a = parse_fr_bytes(pickle.dumps(d), "a", rank=1)
    js = json.loads(json.dumps(d))
    js["pg_status"]["0"] = {k: str(v) for k, v in js["pg_status"]["0"].items()}
    b = parse_fr_bytes(json.dumps(js).encode(), "b", rank=1)
    c = parse_fr_bytes(pickle.dumps(d["entries"]), "c", rank=1)
    assert a.entries == b.entries == c.entries
    assert a.pg_status == b.pg_status and a.pg_status[0].last_enqueued == 3
    assert a.entries[1].op == "send" and a.entries[1].self_local == 1 and a.entries[1].peer_local == 2


@pytest.mark.parametrize(
    "name,want",
    [
        ("gloo:all_reduce", ("gloo", "all_reduce", None, None)),
        ("nccl:recv 3<-0", ("nccl", "recv", 3, 0)),
        ("ncclx:all_gather", ("ncclx", "all_gather", None, None)),
        ("nccl2:all_reduce", ("nccl2", "all_reduce", None, None)),
        ("barrier", ("", "barrier", None, None)),
    ],
)
def test_profiling_names(name, want):
    assert split_profiling_name(name) == want


def test_bad_files_each_named_others_still_read(tmp_path):
    (tmp_path / "comm_lib_trace_rank_0").write_bytes(pickle.dumps(dump([entry(1)])))
    (tmp_path / "comm_lib_trace_rank_1").write_bytes(pickle.dumps(dump([entry(1)]))[:40])
    (tmp_path / "comm_lib_trace_rank_2").write_bytes(b"GIF89a not a dump")
    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps(dump([entry(1)], version="3.0")))
    errors = []
    dumps = load_fr_dir(str(tmp_path), errors)
    assert [d.rank for d in dumps] == [0]
    assert len(errors) == 3
    assert any("comm_lib_trace_rank_1" in e and "truncated" in e for e in errors)
    assert any("comm_lib_trace_rank_2" in e and "not a Flight Recorder dump" in e for e in errors)
    assert any("nccl_trace_rank_3" in e and "'3.0'" in e and "remedy" in e for e in errors)
    with pytest.raises(UnsupportedFrVersionError):
        read_fr_file(str(tmp_path / "nccl_trace_rank_3"))
    with pytest.raises(FlightRecordError):
        read_fr_file(str(tmp_path / "comm_lib_trace_rank_1"))


def test_states():
    d = parse_fr_bytes(
        pickle.dumps(
            dump(
                [
                    entry(1, retired=True),
                    entry(2, retired=False),
                    entry(3, "nccl:all_reduce", retired=True, state="started"),
                    entry(4, "nccl:all_reduce", retired=True, state="completed"),
                ]
            )
        ),
        "x",
    )
    assert [fr_state(e) for e in d.entries] == ["completed", "issued", "failed", "completed"]
    recs = fr_records(d)
    assert (
        recs[0]["dtype"] == "float32" and recs[0]["numel"] == 676 and recs[0]["source"] == "flight-recorder"
    )
    assert recs[2]["error"] and "timed out" in recs[2]["error"]


def test_fr_only_extra_collective_names_the_rank(tmp_path):
    """3 ranks: 0 and 1 in a barrier at seq 4, rank 2 in a C++ all_reduce at seq 4."""
    for r in range(3):
        es = [entry(s) for s in (1, 2, 3)]
        es.append(
            entry(
                4, "gloo:all_reduce" if r == 2 else "gloo:barrier", ((676,),) if r == 2 else (), retired=False
            )
        )
        (tmp_path / ("comm_lib_trace_rank_%d" % r)).write_bytes(pickle.dumps(dump(es)))
    snap = snapshot_with_fr(str(tmp_path))
    assert [p.rank for p in snap.processes] == [0, 1, 2] and snap.processes[0].world_size == 3
    d = diagnose(snap)
    assert d.kind == "collective-mismatch" and d.culprit_ranks == [2] and d.seq == 4


def test_merge_takes_torch_seq_and_keeps_cpp_issued():
    """Our world barrier (our seq 1) joins FR's barrier at seq 3; FR's 2 DDP all_reduces stay."""
    d = parse_fr_bytes(
        pickle.dumps(
            dump(
                [
                    entry(1, t=T0 + 100),
                    entry(2, t=T0 + 200),
                    entry(3, "gloo:barrier", (), retired=False, t=T0 + 10_000_100),
                ]
            )
        ),
        "x",
    )
    ours = [
        {
            "idx": 1,
            "kind": "collective",
            "op": "barrier",
            "group": "0",
            "seq": 1,
            "state": "issued",
            "t_wall_ns": T0 + 10_000_000,
            "t_mono_ns": 5,
            "t_end_mono_ns": None,
        },
        {
            "idx": 2,
            "kind": "p2p",
            "op": "send",
            "group": "0",
            "seq": 1,
            "peer": 1,
            "state": "completed",
            "t_wall_ns": T0 + 50,
            "t_mono_ns": 1,
            "t_end_mono_ns": 2,
        },
    ]
    m = merge_records(ours, fr_records(d))
    colls = [(r["op"], r["seq"], r.get("seq_ours"), r["source"]) for r in m if r["kind"] == "collective"]
    assert colls == [
        ("all_reduce", 1, None, "flight-recorder"),
        ("all_reduce", 2, None, "flight-recorder"),
        ("barrier", 3, 1, "hangtrace+flight-recorder"),
    ]
    assert [r["op"] for r in m if r["kind"] == "p2p"] == ["send"]


def test_join_renumbers_the_in_flight_record_too():
    """A rank waits in broadcast_object_list (our seq 2; torch launched 2 broadcasts for the
    first one: its seq 3) while its peer's last collective is torch's seq 2: the in-flight
    record takes torch's number (3) like every other record, no false mismatch at seq 2."""
    from hangtrace.tracer.ring.frjoin import join_fr
    from hangtrace.tracer.snapshot import ProcessInfo

    es = [
        entry(1, "gloo:broadcast", t=T0 + 100),
        entry(2, "gloo:broadcast", t=T0 + 200),
        entry(3, "gloo:broadcast", retired=False, t=T0 + 10_000_100),
    ]
    d = parse_fr_bytes(pickle.dumps(dump(es)), "x", rank=1, host="h", pid=7)
    bol = {
        "idx": 2,
        "kind": "collective",
        "op": "broadcast_object_list",
        "group": "0",
        "seq": 2,
        "state": "issued",
        "t_wall_ns": T0 + 10_000_000,
        "t_mono_ns": 5,
        "t_end_mono_ns": None,
        "async_op": False,
    }
    first = {
        "idx": 1,
        "kind": "collective",
        "op": "broadcast_object_list",
        "group": "0",
        "seq": 1,
        "state": "completed",
        "t_wall_ns": T0 + 50,
        "t_mono_ns": 1,
        "t_end_mono_ns": 1 + 400,
    }
    p = ProcessInfo(host="h", pid=7, rank=1, world_size=2, records=[first, bol], inflight=bol)
    (q,) = join_fr([p], [d])
    assert q.inflight is not None and q.inflight["seq"] == 3 and q.inflight["seq_ours"] == 2


def test_our_calls_after_the_end_of_torchs_dump_go_on_one_seq_per_call():
    """A dump's FR file ends at torch's seq 2 while the ring read later holds two more calls:
    they are seq 3 and 4, not both 2 (seen on a healthy 4-rank job: every rank's later calls
    at one seq, read as a collective that completed with mismatched sizes)."""
    es = [entry(1, "gloo:all_reduce", t=T0 + 100), entry(2, "gloo:all_reduce", t=T0 + 200)]
    d = parse_fr_bytes(pickle.dumps(dump(es)), "x", rank=0, host="h", pid=7)

    def ours(seq, t, numel):
        return {
            "idx": seq,
            "kind": "collective",
            "op": "all_reduce",
            "group": "0",
            "seq": seq,
            "numel": numel,
            "state": "completed",
            "t_wall_ns": t,
            "t_mono_ns": seq,
            "t_end_mono_ns": seq + 1,
        }

    m = merge_records(
        [ours(1, T0 + 90, 8), ours(2, T0 + 190, 1), ours(3, T0 + 50_000_000, 8), ours(4, T0 + 60_000_000, 1)],
        fr_records(d),
    )
    got = [(r["seq"], r["seq_ours"], r["numel"]) for r in m if r["kind"] == "collective"]
    assert got == [(1, 1, 8), (2, 2, 1), (3, 3, 8), (4, 4, 1)]


def test_a_dead_ranks_count_and_its_peers_torch_count_are_not_joined_in_one_group():
    """Issue 38: rank 0 alone all-reduces a metric (our seq 1; torch's 4) and gloo aborts it;
    ranks 1-2 answer with dumps whose entries are DDP's C++ launches (torch's 1..4), rank 0
    is dead and has none. Joined, rank 0's seq 1 met its peers' all_gather seq 1: a false
    mismatch in the one snapshot that caught the dumps. The group keeps our records alone."""
    from hangtrace.tracer.ring.frjoin import join_fr, unalignable_groups
    from hangtrace.tracer.snapshot import ProcessInfo

    es = [entry(1, "gloo:all_gather", ((1,),)), entry(2, "gloo:broadcast"), entry(3), entry(4, retired=False)]
    dumps = [parse_fr_bytes(pickle.dumps(dump(es)), "x", rank=r, host="h", pid=10 + r) for r in (1, 2)]
    metric = {
        "idx": 1,
        "kind": "collective",
        "op": "all_reduce",
        "group": "0",
        "seq": 1,
        "state": "issued",
        "numel": 1,
        "t_wall_ns": T0 + 5000,
        "t_mono_ns": 5,
        "t_end_mono_ns": None,
    }
    dead = ProcessInfo(host="h", pid=10, rank=0, world_size=3, records=[metric], state="killed")
    peers = [ProcessInfo(host="h", pid=10 + r, rank=r, world_size=3, records=[]) for r in (1, 2)]
    procs = [dead] + peers
    assert unalignable_groups(procs, [(1, dumps[0]), (2, dumps[1])]) == {"0"}
    joined = join_fr(procs, dumps)
    assert [r["seq"] for r in joined[0].records] == [1]
    assert all(not any(r.get("group") == "0" for r in p.records) for p in joined[1:])
    # every rank answered (a hang): the counts align through the dumps, joined as before
    alive = [dataclasses.replace(dead, state="alive")]
    d0 = parse_fr_bytes(
        pickle.dumps(dump(es[:3] + [entry(4, sizes=((1,),), retired=False)])), "x", rank=0, host="h", pid=10
    )
    assert unalignable_groups(alive + peers, [(0, d0), (1, dumps[0]), (2, dumps[1])]) == set()
    assert len(join_fr(alive + peers, [d0] + dumps)[1].records) == 4
