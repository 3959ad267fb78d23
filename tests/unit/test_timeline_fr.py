"""Timeline with torch's Flight Recorder entries (issue 41): the clock alignment, C++-issued
collectives on the run's clock with their state and duration, windows over every source,
helpers never culprits, ``-o -`` on stdout.

Entries go through the real path: ``FrEntry`` -> ``ring.frjoin.join_fr`` (what a snapshot
with dumps holds) -> ``build_timeline``."""

import dataclasses
import json

import pytest

from hangtrace import cli
from hangtrace.tracer.report.timeline import TimelineOptions
from hangtrace.tracer.report.timeline.frclock import END_UNKNOWN, process_offset, to_mono
from hangtrace.tracer.ring.frentries import FrDump, FrEntry, FrGroup
from hangtrace.tracer.ring.frjoin import fr_processes, join_fr
from hangtrace.tracer.ring.layout import RANK_FROM_ENV, RANK_FROM_GROUP
from hangtrace.tracer.snapshot import Snapshot
from test_pipeline import _rank
from test_timeline import DIAG, MS, S, WALL0, Proc, build_timeline, by, names, two_ranks

import orjson

TAKEN = WALL0 + 2 * S


def entry(rid, seq, created, retired=True, started=None, completed=None, duration_ms=None, backend="gloo"):
    """One all_reduce of DDP's gradient bucket (2177 floats) as torch records it."""
    return FrEntry(
        record_id=rid,
        pg_id=0,
        group="0",
        group_desc="default_pg",
        collective_seq_id=seq,
        p2p_seq_id=0,
        op_id=seq,
        profiling_name="%s:all_reduce" % backend,
        backend=backend,
        op="all_reduce",
        self_local=None,
        peer_local=None,
        is_p2p=False,
        input_sizes=((2177,),),
        input_dtypes=("Float",),
        output_sizes=((2177,),),
        output_dtypes=("Float",),
        state="completed" if completed else "scheduled",
        retired=retired,
        timeout_ms=600_000,
        time_created_ns=created,
        time_discovered_started_ns=started,
        time_discovered_completed_ns=completed,
        duration_ms=duration_ms,
        thread_name="python3",
        thread_id="140000",
        frames=(),
    )


def dump(rank, pid, host, entries):
    return FrDump(
        path="/r/fr/%s-%d.pkl" % (host, pid),
        rank=rank,
        version="2.10",
        comm_lib_version="",
        pg_config={"0": FrGroup("0", "default_pg", (0, 1))},
        pg_status={},
        entries=tuple(entries),
        host=host,
        pid=pid,
        world_size=2,
    )


def ddp_dumps(clock=lambda p, w: w, rank1_inflight=False):
    """Both ranks' C++ all_reduces #1-#3 (gloo: retired, no time) at +100/+200/+300 ms; rank
    0's #4 in flight at +400 ms (rank 1 never issued it: it hangs outside collectives).
    ``clock(proc, wall ns)``: the clock torch read (wall by default)."""
    p0, p1 = two_ranks()
    out = []
    for p in (p0, p1):
        es = [entry(i, i + 1, clock(p, WALL0 + (i + 1) * 100 * MS)) for i in range(3)]
        if p.rank == 0 or rank1_inflight:
            es.append(entry(3, 4, clock(p, WALL0 + 400 * MS), retired=False))
        out.append(dump(p.rank, p.pid, p.host, es))
    return (p0, p1), out


def trace(procs, diag=DIAG, **opts):
    snap = Snapshot(run_dir="/r", taken_wall_ns=TAKEN, reason="stall", processes=procs)
    return json.loads(orjson.dumps(build_timeline(snap, diag, options=TimelineOptions(**opts))))


def cpp(t):
    return [e for e in t["traceEvents"] if e["ph"] == "X" and e["args"].get("source") == "flight-recorder"]


def rank_pid(t, r):
    return [k for k, v in names(t).items() if v.replace("CULPRIT ", "").startswith("rank %d " % r)][0]


# --- the clock alignment --------------------------------------------------------------------


def test_to_mono_tells_torchs_wall_times_from_monotonic_ones():
    off = WALL0 - 100 * S  # wall - mono of the process (mono = 100 s since boot at WALL0)
    wall = WALL0 + 5 * S
    assert to_mono(wall, off, WALL0) == 105 * S  # CLOCK_REALTIME (Linux): moved onto the process's mono
    assert to_mono(105 * S, off, WALL0) == 105 * S  # steady clock (macOS, Windows): already mono
    assert to_mono(wall, off, None) == 105 * S  # the offset alone is a wall reference too
    assert to_mono(wall, None, None) == wall  # no reading of ours: placed by its own wall time
    assert to_mono(105 * S, None, None) is None  # a monotonic time with nothing to align it


def test_process_offset_is_the_median_of_its_own_pairs():
    p0, _ = two_ranks()
    assert process_offset(p0.build()) == WALL0 - 100 * S
    fr_only = fr_processes([dump(3, 0, "", [entry(0, 1, WALL0)])])[0]
    assert process_offset(fr_only) is None  # its records carry no monotonic reading


@pytest.mark.parametrize("torch_clock", ["wall", "monotonic"])
def test_cpp_collectives_placed_at_their_wall_time_on_every_host(torch_clock):
    """Hosts a and b have monotonic clocks 900 s apart; torch's times (wall on Linux, the
    process's monotonic clock elsewhere) land where they happened, on both ranks."""
    clock = (lambda p, w: w) if torch_clock == "wall" else (lambda p, w: p.mono(w - WALL0))
    (p0, p1), dumps = ddp_dumps(clock)
    t = trace(join_fr([p0.build(), p1.build()], dumps))
    evs = [e for e in t["traceEvents"] if e["ph"] != "M"]
    span_us = (TAKEN - t["otherData"]["t0_wall_ns"]) / 1000.0
    assert all(0 <= e["ts"] and e["ts"] + e.get("dur", 0) <= span_us for e in evs)  # inside the run
    c = cpp(t)
    assert len(c) == 7
    for e in c:
        assert e["ts"] == e["args"]["seq"] * 100_000.0  # µs since t0 = WALL0 (the processes' start)
        assert e["name"].startswith("all_reduce default_pg #%d [C++]" % e["args"]["seq"])
        assert e["args"]["numel"] == 2177 and e["args"]["issued_by"].startswith("C++")
    # C++ slices go on their own thread track, named after torch's thread
    tids = {e["tid"] for e in c}
    assert {by(t, ph="M", name="thread_name", tid=x)[0]["args"]["name"] for x in tids} == {
        "C++ collectives (python3)"
    }
    # arrows link the ranks' C++ all_reduces #1-#3 (#4: rank 0 alone)
    flows = {e["name"] for e in t["traceEvents"] if e.get("cat") == "flow"}
    assert {"coll 0 #1", "coll 0 #2", "coll 0 #3"} <= flows and "coll 0 #4" not in flows


def test_cpp_collectives_carry_their_real_state_and_duration():
    (p0, p1), dumps = ddp_dumps()
    t = trace(join_fr([p0.build(), p1.build()], dumps))
    done = [e for e in cpp(t) if e["args"]["seq"] <= 3]
    assert len(done) == 6
    for e in done:  # gloo: completed (retired), no completion time in the dump
        assert e["args"]["state"] == "completed" and not e["args"].get("open") and e["dur"] == 0.0
        assert e["args"]["end_unknown"] == END_UNKNOWN and "in flight" not in e["name"]
    (live,) = [e for e in cpp(t) if e["args"]["seq"] == 4]
    assert live["pid"] == rank_pid(t, 0) and live["args"]["state"] == "issued" and live["args"]["open"]
    assert live["name"] == "all_reduce default_pg #4 [C++] (in flight)"
    assert live["ts"] + live["dur"] == by(t, ph="i", name="stall detected")[0]["ts"]  # open until then


def test_nccl_entries_keep_their_completion_time_or_duration():
    p0, p1 = two_ranks()
    t100, t200 = WALL0 + 100 * MS, WALL0 + 200 * MS
    d = dump(
        0,
        p0.pid,
        p0.host,
        [
            entry(0, 1, t100, started=t100 + 1 * MS, completed=t100 + 7 * MS, backend="nccl"),
            entry(1, 2, t200, started=t200 + 2 * MS, duration_ms=3.5, backend="nccl", retired=True),
        ],
    )
    t = trace(join_fr([p0.build(), p1.build()], [d]))
    c = {e["args"]["seq"]: e for e in cpp(t)}
    assert (c[1]["ts"], c[1]["dur"], c[1]["args"]["state"]) == (100_000.0, 7000.0, "completed")
    assert (c[2]["ts"], c[2]["dur"]) == (200_000.0, 2000.0 + 3500.0)  # from its start, its duration
    assert c[2]["args"]["state"] == "failed"  # nccl: retired and never seen complete


def test_rank_known_from_its_dump_alone_is_placed_by_its_own_wall_time():
    p0, _ = two_ranks()
    alone = dump(1, 0, "", [entry(i, i + 1, WALL0 + (i + 1) * 100 * MS) for i in range(3)])
    t = trace(join_fr([p0.build()], [alone]))
    c = [e for e in cpp(t) if e["pid"] == rank_pid(t, 1)]
    assert [e["ts"] for e in c] == [100_000.0, 200_000.0, 300_000.0]
    # torch's monotonic clock with no reading of ours: left out, said so
    mono = dump(1, 0, "", [entry(0, 1, 100 * S)])
    t = trace(join_fr([p0.build()], [mono]))
    assert not [e for e in cpp(t) if e["pid"] == rank_pid(t, 1)]
    assert any("left out of the timeline" in n for n in t["otherData"]["errors"])


def test_since_and_until_cut_every_source():
    """--since -1.5 (the README's example, shorter): records, C++ entries, counters,
    instants and flows all inside the window; what began before and goes on is cut at it."""
    (p0, p1), dumps = ddp_dumps()
    procs = join_fr([p0.build(), p1.build()], dumps)
    t = trace(procs, since_s=-1.5)
    lo = TAKEN - 1_500 * MS
    assert t["otherData"]["t0_wall_ns"] == lo and t["otherData"]["window_wall_ns"] == [lo, TAKEN]
    evs = [e for e in t["traceEvents"] if e["ph"] != "M"]
    assert all(0 <= e["ts"] and e["ts"] + e.get("dur", 0) <= 1_500_000.0 for e in evs)
    (live,) = cpp(t)  # #1-#3 ended before the window; #4 (from +400 ms) goes on: cut at lo
    assert live["args"]["seq"] == 4 and live["ts"] == 0.0 and live["dur"] == 1_500_000.0
    assert not by(t, ph="C") and by(t, ph="i", name="stall detected")  # samples at +12, +50 ms: out
    t = trace(procs, until_s=0.25)
    assert sorted(e["args"]["seq"] for e in cpp(t)) == [1, 1, 2, 2]
    assert all(e["ts"] + e.get("dur", 0) <= 250_000.0 for e in t["traceEvents"] if e["ph"] != "M")


def test_a_window_outside_the_run_or_ending_before_it_starts_is_named():
    """A window that can hold nothing says why (the CLI makes it an error with a remedy); a
    quiet window inside the run is no such thing; NaN and infinity are refused."""
    (p0, p1), dumps = ddp_dumps()
    procs = join_fr([p0.build(), p1.build()], dumps)
    first, last = trace(procs, since_s=0)["otherData"]["run_wall_ns"]
    assert last == TAKEN and first < last
    run_s = "(the run spans %.1f s)" % ((last - first) / 1e9)
    for opts, why in (
        (
            {"since_s": 0.5, "until_s": 0.2},
            "the window --since 0.5 --until 0.2 holds nothing: it ends 0.3 s ",
        ),
        ({"since_s": 100}, "the window --since 100 holds nothing: it starts 9"),
        ({"until_s": -100}, "the window --until -100 holds nothing: it ends 9"),
    ):
        other = trace(procs, **opts)["otherData"]
        assert other["window_empty"].startswith(why) and other["window_empty"].endswith(run_s), other
    assert not {"window_empty", "window_note"} & set(trace(procs, since_s=0.5, until_s=0.6)["otherData"])
    quiet = trace(procs, diag=None, since_s=0.001, until_s=0.002)  # before the first record
    assert quiet["otherData"]["window_note"].startswith("no event in this window (0.001-0.002 s of the run")
    assert "window_empty" not in trace(procs)["otherData"]
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="since_s must be a finite number"):
            TimelineOptions(since_s=bad)


def test_cli_refuses_an_empty_window_with_a_remedy(tmp_path, capsys):
    for r in range(2):
        _rank(tmp_path, r, 2, 20, blocked=r == 0)
    out = str(tmp_path / "t.json")
    assert cli.main(["timeline", str(tmp_path), "--since", "5", "--until", "1", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "error: the window --since 5 --until 1 holds nothing: it starts " in err  # (a short run)
    assert "remedy: pass --since/--until inside the run" in err and not (tmp_path / "t.json").exists()
    assert cli.main(["timeline", str(tmp_path), "--since=-1e9", "-o", out]) == 0  # the whole run
    assert cli.main(["timeline", str(tmp_path), "--until=-1e9", "-o", out]) == 2
    assert "holds nothing: it ends " in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["timeline", str(tmp_path), "--since", "nan"])
    assert e.value.code == 2 and "must be a finite number of seconds, got 'nan'" in capsys.readouterr().err


def test_ranks_no_process_holds_are_named(tmp_path, capsys):
    """Bad input: ``--ranks`` of ranks the run does not have is an error naming them and
    the run's ranks; some of them missing: the others drawn, the missing ones noted."""
    t = trace(list(join_fr([p.build() for p in two_ranks()], ())), ranks=frozenset({1, 5, 6}))
    assert (t["otherData"]["ranks_missing"], t["otherData"]["ranks_held"]) == ([5, 6], [0, 1])
    assert "ranks_missing" not in trace([p.build() for p in two_ranks()], ranks=frozenset({1}))["otherData"]
    for r in range(2):
        _rank(tmp_path, r, 2, 20, blocked=r == 0)
    out = str(tmp_path / "t.json")
    assert cli.main(["timeline", str(tmp_path), "--ranks", "5-7,9", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "error: rank(s) 5-7,9: no process of the run holds them (its ranks: 0-1)" in err, err
    assert "remedy: pass --ranks among its ranks" in err and not (tmp_path / "t.json").exists()
    assert cli.main(["timeline", str(tmp_path), "--ranks", "1,5", "-o", out]) == 0
    assert (
        "note: rank(s) 5: no process of the run holds them (its ranks: 0-1); left out"
        in capsys.readouterr().out
    )
    with open(out) as f:
        assert [n.split(" ·")[0] for n in names(json.load(f)).values()] == ["rank 1"]


def test_async_slices_and_flows_cut_as_wholes():
    p0, p1 = two_ranks()
    for p in (p0, p1):
        p.add("collective", 60 * MS, op="all_gather", group="0", seq=7, end_rel=90 * MS, async_op=True)
    snap_procs = [p0.build(), p1.build()]
    t = trace(snap_procs, diag=None, since_s=0.08)
    b = [e for e in t["traceEvents"] if e["ph"] in ("b", "e")]
    assert sorted(e["ph"] for e in b) == ["b", "b", "e", "e"] and {e["ts"] for e in b if e["ph"] == "b"} == {
        0
    }
    flows = [e for e in t["traceEvents"] if e.get("cat") == "flow"]
    assert not flows  # cp0 #1's slices both began before the window: no arrow into nothing


def test_helpers_inheriting_rank_are_never_culprits():
    """DataLoader workers inherit RANK (rank hint 1) without joining a group: they go under
    rank 1's track, which alone is the culprit; a leftover with rank hint 1 and no traced
    parent is a helper of rank 1 too."""
    p0, p1 = two_ranks()
    p1.meta["rank_source"] = RANK_FROM_GROUP
    worker = Proc(
        1, host="b", pid=3001, offset=p1.offset, ppid=p1.pid, groups=[], meta={"rank_source": RANK_FROM_ENV}
    )
    worker.add("memory", 5 * MS, op="timer", group="host", a=(5 << 20, -1, -1, -1, -1))
    stray = Proc(
        1, host="b", pid=3002, offset=p1.offset, ppid=77, groups=[], meta={"rank_source": RANK_FROM_ENV}
    )
    stray.add("memory", 6 * MS, op="timer", group="host", a=(6 << 20, -1, -1, -1, -1))
    t = trace([p.build() for p in (p0, p1, worker, stray)])
    n = sorted(names(t).values())
    assert n == ["CULPRIT rank 1 · b:1001 · trainer-1 (+2 helper processes)", "rank 0 · a:1000"], n
    assert by(t, ph="C", name="helper 3001: memory [bytes]") and by(
        t, ph="C", name="helper 3002: memory [bytes]"
    )
    assert [e["args"]["labels"] for e in by(t, ph="M", name="process_labels")] == ["culprit"]


def test_dash_o_writes_the_trace_to_stdout(tmp_path, capsys):
    for r in range(2):
        _rank(tmp_path, r, 2, 20, blocked=r == 0)
    assert cli.main(["timeline", str(tmp_path), "-o", "-", "--since", "-30"]) == 0
    cap = capsys.readouterr()
    t = json.loads(cap.out)  # stdout holds the trace alone
    assert len(names(t)) == 2 and by(t, ph="X", cat="collective")
    assert "timeline: stdout (%d events" % len(t["traceEvents"]) in cap.err
    assert not (tmp_path / "-").exists()
    assert cli.main(["timeline", str(tmp_path), "-o", "-", "--until", "-0.5", "--open"]) != 0


def test_further_launches_of_a_python_call_are_named_after_it():
    """all_gather_object launches two all_gathers: the first is joined with our record (our
    times), the second is torch's alone, drawn at its launch and named after the call."""
    p0, p1 = two_ranks()
    p0.add("collective", 100 * MS, op="all_gather_object", group="0", seq=1, end_rel=150 * MS)
    es = []
    for i, t in enumerate((101 * MS, 120 * MS)):
        e = entry(i, i + 1, WALL0 + t)
        es.append(FrEntry(**dict(e.__dict__, op="all_gather", profiling_name="gloo:all_gather")))
    t = trace(join_fr([p0.build(), p1.build()], [dump(0, p0.pid, p0.host, es)]), diag=None)
    (ours,) = [e for e in by(t, ph="X") if e["args"].get("op") == "all_gather_object"]
    assert (ours["ts"], ours["dur"], ours["args"]["source"]) == (
        100_000.0,
        50_000.0,
        "hangtrace+flight-recorder",
    )
    (inner,) = cpp(t)
    assert inner["name"] == "all_gather default_pg #2 [in all_gather_object]" and inner["ts"] == 120_000.0
    assert inner["args"]["issued_by"].startswith("inside all_gather_object")


def test_earlier_generation_of_a_restarted_rank_is_no_culprit():
    p0, p1 = two_ranks()
    old = Proc(1, host="b", pid=900, offset=p1.offset, state="killed", meta={"rank_source": RANK_FROM_GROUP})
    old.add("collective", 1 * MS, op="all_reduce", group="1", seq=2, state="issued")
    t = trace([p0.build(), p1.build(), dataclasses.replace(old.build(), start_wall_ns=WALL0 - 5 * S)])
    n = sorted(names(t).values())
    assert n == [
        "CULPRIT rank 1 · b:1001 · trainer-1",
        "rank 0 · a:1000",
        "rank 1 (another process holds it) · b:900",
    ]
    assert len([e for e in by(t, ph="X") if "verdict" in e["args"]]) == 1  # the holder's only
