"""Since when, beyond the rings' history (issue 43): the watcher's episodes
(``tracer/stragglerseen.py``, ``watch/stragglerwatch.py``) and their use by the analysis
(``analyze/straggler/seen.py``), on rings recorded from the real 4-rank gloo job
(``tests/integration/scripts/straggler_job.py``: rank 2's compute 4x from step 20).

``data/straggler/long``: that job run to step 139 under ``hangtrace run`` (15 s): the rings'
history holds steps 66-139 only; ``stragglers-vm.json`` is what its watcher wrote then
(first seen at step 46, its first slow step 20). ``data/straggler/slow``: the job stopped at
step ~45 (the start inside the history).
"""

import dataclasses
import glob
import gzip
import json
import os
import shutil

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.analyze.straggler import of_processes, with_seen
from hangtrace.tracer.analyze.straggler.seen import resolve
from hangtrace.tracer.collect.rings import load_run
from hangtrace.tracer.report.stragglertext import straggler_phrase
from hangtrace.tracer.stragglerseen import SeenStraggler, read_seen, seen_path, write_seen
from hangtrace.tracer.watch import stragglerfr as SF
from hangtrace.tracer.watch import stragglerwatch as SW
from hangtrace.tracer.watch.progress import read_headers

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "straggler")
MS = 1_000_000


def unpack(tmp_path, name, with_seen_file=True):
    d = tmp_path / name
    d.mkdir()
    for gz in glob.glob(os.path.join(DATA, name, "*.htr.gz")):
        with gzip.open(gz, "rb") as f:
            (d / os.path.basename(gz)[:-3]).write_bytes(f.read())
    if with_seen_file:
        for js in glob.glob(os.path.join(DATA, name, "stragglers-*.json")):
            shutil.copy(js, d)
    return d


def verdict(snap):
    newest = max(p.progress_wall_ns for p in snap.processes)
    return diagnose(snap, now_wall_ns=newest + 1_000 * MS)


def test_rings_alone_say_since_before_their_oldest_step(tmp_path):
    snap = load_run(str(unpack(tmp_path, "long", with_seen_file=False)))
    assert snap.stragglers_seen == ()
    d = verdict(snap)
    st = d.details["straggler"]
    assert (st["rank"], st["since_step"], st["since_source"]) == (2, None, None)
    assert st["oldest_step"] > 20 and st["before_step"] == st["oldest_step"]
    assert "since before step %d (the oldest step still recorded)" % st["oldest_step"] in d.summary


def test_the_watchers_first_slow_step_is_used_when_the_rings_lost_it(tmp_path):
    snap = load_run(str(unpack(tmp_path, "long")))
    assert len(snap.stragglers_seen) == 1 and not snap.errors
    d = verdict(snap)
    st = d.details["straggler"]
    assert (st["rank"], st["since_step"], st["since_source"]) == (2, 20, "watcher"), st
    assert st["first_seen_wall_ns"] == snap.stragglers_seen[0].first_seen_wall_ns
    assert st["oldest_step"] > 20 and st["before_step"] is None
    assert "in phase 'train', since step 20 (first seen by the watcher at " in d.summary, d.summary
    assert d.summary.startswith("Progressing; %s." % straggler_phrase(st))


def test_the_rings_own_start_wins_over_the_watcher(tmp_path):
    snap = load_run(str(unpack(tmp_path, "slow")))
    st = of_processes({p.rank: p for p in snap.processes})
    e = SeenStraggler(2, "0", since_step=17, before_step=None, first_seen_step=30, first_seen_wall_ns=1)
    got = with_seen(st, [e], at_wall_ns=2)
    assert (got.since_step, got.since_source, got.first_seen_step) == (20, "rings", 30)


def ep(since=None, before=None, seen=100, ended=None, rank=2, group="0"):
    return SeenStraggler(
        rank, group, since, before, first_seen_step=50, first_seen_wall_ns=seen, ended_wall_ns=ended
    )


def test_which_episode_counts():
    at = 1_000
    assert resolve(2, "0", None, 66, [ep(since=20)], at).since_step == 20
    # another rank or group, seen after the records, or ended before them: another episode
    for other in (
        ep(since=20, rank=1),
        ep(since=20, group="1"),
        ep(since=20, seen=2_000),
        ep(since=20, ended=900),
    ):
        got = resolve(2, "0", None, 66, [other], at)
        assert (got.since_step, got.source, got.before_step) == (None, None, 66)
    # of two episodes, the newest under way
    got = resolve(2, "0", None, 66, [ep(since=20, ended=500), ep(since=40, seen=600)], at)
    assert (got.since_step, got.first_seen_wall_ns) == (40, 600)
    # the watcher's start inside the rings' window (by more than MIN_BEFORE): the rings saw none there
    assert resolve(2, "0", None, 66, [ep(since=80)], at).since_step is None
    # the watcher began slow too: the older of the two bounds
    got = resolve(2, "0", None, 66, [ep(before=30)], at)
    assert (got.since_step, got.before_step) == (None, 30)
    assert resolve(2, "0", None, None, [], at) == resolve(2, "0", None, None, [], 0)


def test_phrase_of_each_kind_of_start():
    st = {"rank": 2, "added_ms_per_step": 30.2, "since_step": 20, "since_source": "watcher"}
    st["first_seen_wall_ns"] = 1_796_656_182_458_060_160  # 2026-12-07 15:09:42 UTC
    assert straggler_phrase(st).endswith(", since step 20 (first seen by the watcher at 15:09:42 UTC)")
    st.update(since_step=None, since_source=None, before_step=30, oldest_step=66)
    assert straggler_phrase(st).endswith(
        ", since before step 30 (the oldest step the watcher had when it first saw it at 15:09:42 UTC)"
    )
    st.update(before_step=66, first_seen_wall_ns=None)
    assert straggler_phrase(st).endswith(", since before step 66 (the oldest step still recorded)")


def watcher_on(run, clock):
    lines = []
    w = SW.StragglerWatch(
        lines.append, clock=lambda: clock[0], seen_file=seen_path(str(run), "vm"), host="vm"
    )
    return w, lines


def check(w, run, clock):
    clock[0] += SW.CHECK_S
    w.check(read_headers(str(run), {}), lambda p, h: True)


def test_watcher_on_recorded_rings_writes_one_episode_and_its_end(tmp_path):
    run = unpack(tmp_path, "slow", with_seen_file=False)
    clock = [0.0]
    w, lines = watcher_on(run, clock)
    check(w, run, clock)
    check(w, run, clock)  # the same episode: nothing new
    seen, errors = read_seen(str(run))
    assert not errors and len(seen) == 1 and len(lines) == 1, (seen, lines)
    e = seen[0]
    assert (e.rank, e.group, e.since_step, e.before_step, e.ended_wall_ns) == (2, "0", 20, None, None)
    assert e.first_seen_step is not None and e.first_seen_step > 30 and e.host == "vm"
    w.close("the job ended")
    (e2,) = read_seen(str(run))[0]
    assert e2.ended_wall_ns is not None and e2.ended_wall_ns >= e.first_seen_wall_ns
    assert e2.since_step == 20 and not os.path.exists(seen_path(str(run), "vm") + ".tmp-%d" % os.getpid())
    # a restarted watcher keeps the run's episodes
    w2, _ = watcher_on(run, clock)
    assert w2.episodes == [e2]


def test_watcher_refines_the_start_only_earlier_and_while_its_window_holds_it():
    w = SW.StragglerWatch(lambda line: None, clock=lambda: 0.0)
    st = {
        "rank": 2,
        "group": "0",
        "added_ms_per_step": 30.0,
        "since_step": 22,
        "oldest_step": 5,
        "newest_step": 30,
    }
    w._note(dict(st))
    w._note(dict(st, since_step=20, newest_step=40))  # more slow steps after it: placed earlier
    assert w.episodes[-1].since_step == 20 and len(w.episodes) == 1
    w._note(dict(st, since_step=28, oldest_step=12, newest_step=84))  # its level rose at 28: not the start
    assert w.episodes[-1].since_step == 20
    w._note(dict(st, since_step=14, oldest_step=25, newest_step=100))  # the window moved past step 20
    assert w.episodes[-1].since_step == 20
    w2 = SW.StragglerWatch(lambda line: None, clock=lambda: 0.0)
    w2._note(dict(st, since_step=None, oldest_step=30))  # first seen slow from its window's start
    assert (w2.episodes[-1].since_step, w2.episodes[-1].before_step) == (None, 30)
    w2._note(dict(st, since_step=50, oldest_step=40))
    assert (w2.episodes[-1].since_step, w2.episodes[-1].before_step) == (None, 30)


def test_check_interval_follows_the_history_span_and_its_cost():
    assert SW.interval(3.6, 0.001) == 0.9  # 50 ms steps: a quarter of a 3.6 s history
    assert SW.interval(0.4, 0.001) == SW.MIN_CHECK_S
    assert SW.interval(600.0, 0.001) == SW.CHECK_S
    assert SW.interval(3.6, 0.05) == 2.5  # a check of 50 ms CPU: at most 2 % of a core
    assert SW.interval(0.0, 0.0) == 2 * SW.MIN_CHECK_S  # nothing timed yet: the ranks start
    assert SW.interval(600.0, 0.2) == 10.0  # many ranks: the CPU bound wins over CHECK_S
    hist = {
        0: ({"t_wall_ns": 1_000_000_000}, {"t_wall_ns": 4_000_000_000}),
        1: ({"t_wall_ns": 2_000_000_000},),
    }
    assert SW.span_s(hist) == 0.0 and SW.span_s({0: hist[0]}) == 3.0


def test_unreadable_watcher_file_is_named_and_the_rest_analysed(tmp_path):
    run = unpack(tmp_path, "long", with_seen_file=False)
    (run / "stragglers-a.json").write_text("{not json")
    write_seen(str(run / "stragglers-b.json"), [ep(since=20)])
    with open(run / "stragglers-b.json") as f:
        doc = json.load(f)
    doc["seen"].append({"rank": "two"})
    with open(run / "stragglers-b.json", "w") as f:
        json.dump(doc, f)
    snap = load_run(str(run))
    assert len(snap.stragglers_seen) == 1
    bad = [e for e in snap.errors if "stragglers-" in e]
    assert len(bad) == 2 and "stragglers-a.json: unreadable" in bad[0] and "entry 1 unreadable" in bad[1], bad
    assert "from the rings alone" in bad[0]
    assert verdict(snap).details["straggler"]["rank"] == 2


# --- the watcher's Flight Recorder rounds (watch/stragglerfr.py) ------------------------------
class Ring:
    """What the watcher holds of a rank's ring: its header and summary history."""

    def __init__(self, rank, history):
        self.header = {"pid": 100 + rank, "rank": rank}
        self.summary = type("S", (), {"history": history})()


def ddp_rounds(tmp_path, joined_by_round, clock):
    """A FrLook over a run directory with agents whose rounds answer ``joined_by_round`` in turn."""
    (tmp_path / "fr").mkdir(exist_ok=True)
    answers = iter(joined_by_round)

    class Look(SF.FrLook):
        def _round(self, rings):
            got = next(answers)
            self.entries = 0 if got is None else 2000
            return got

    return Look(str(tmp_path), lambda: clock[0])


def fr_job(slow=True):
    """4 ranks, rank 2 late by 30 ms from step 20 (when ``slow``) in collectives only the
    Flight Recorder has; the rings' own histories hold phases and steps only."""
    late = slow_from_rank2 if slow else (lambda r, k, rng: 10 + rng.uniform(0, 1))
    joined = fr_history(late)
    rings = {r: Ring(r, tuple(x for x in h if x["kind"] != "collective")) for r, h in joined.items()}
    return joined, rings


def slow_from_rank2(r, k, rng):
    return 10 + rng.uniform(0, 1) + (30 if r == 2 and k >= 20 else 0)


def fr_history(late):
    from tests.unit.test_straggler import job

    return job(4, 60, late, fr=True)


def test_flight_recorder_rounds_are_rare_back_off_when_they_add_nothing_and_wait_for_the_start(tmp_path):
    clock = [0.0]
    joined, rings = fr_job()
    python_only = {
        r: tuple(dict(x, source="hangtrace+flight-recorder") for x in h) for r, h in joined.items()
    }
    look = ddp_rounds(tmp_path, [None, joined, python_only, python_only, joined], clock)
    assert look.histories(rings) is None and look.rounds == 0  # the ranks start: no round yet
    clock[0] = SF.FR_FIRST_S
    assert look.histories(rings) is None and look.rounds == 1  # no entry yet: again after FR_FIRST_S
    clock[0] += SF.FR_FIRST_S
    assert look.histories(rings) == joined and look.every == SF.FR_EVERY_S
    clock[0] += SF.FR_EVERY_S - 1
    assert look.histories(rings) is None and look.rounds == 2  # not due
    clock[0] += 1
    assert look.histories(rings) is None and look.every == 2 * SF.FR_EVERY_S  # nothing the rings lack
    clock[0] += look.every
    assert look.histories(rings) is None and look.every == 4 * SF.FR_EVERY_S
    clock[0] += look.every
    assert look.histories(rings) == joined and look.every == SF.FR_EVERY_S  # C++ collectives again
    assert SF.fr_only(joined[0]) == 60 and SF.fr_only(python_only[0]) == 0


def test_no_agents_no_round(tmp_path):
    clock = [1e6]
    look = SF.FrLook(str(tmp_path), lambda: clock[0])
    assert not look.due() and look.histories(fr_job()[1]) is None and look.rounds == 0


def test_watcher_names_a_straggler_only_the_flight_recorder_sees_and_ends_it_only_by_a_round(tmp_path):
    clock = [0.0]
    joined, rings = fr_job()
    healthy, _ = fr_job(slow=False)
    look = ddp_rounds(tmp_path, [joined, healthy, healthy], clock)
    clock[0] = SF.FR_FIRST_S
    lines = []
    w = SW.StragglerWatch(lines.append, clock=lambda: clock[0], fr=look)
    rings_only = {r: ring.summary.history for r, ring in rings.items()}
    w._judge(rings_only, rings)
    assert w.via_fr and len(lines) == 1 and lines[0].startswith("straggler: rank 2 is slow"), lines
    assert w.episodes[-1].since_step == 20
    for _ in range(5):  # checks of the rings alone between rounds: no word on it
        clock[0] += 1
        w._judge(rings_only, rings)
    assert len(lines) == 1 and w.current is not None
    clock[0] += SF.FR_EVERY_S
    w._judge(rings_only, rings)  # a round: nobody (one miss)
    clock[0] += SF.FR_EVERY_S
    w._judge(rings_only, rings)  # another: ended
    assert len(lines) == 2 and lines[1].startswith("straggler ended: rank 2"), lines


def test_a_dump_retokened_by_the_watcher_still_answers_the_dump_that_asked(tmp_path):
    from hangtrace.tracer.collect.frrequest import _answers

    meta = tmp_path / "vm-1.meta.json"
    asked = 5_000_000_000
    for token, wall, ok in (("mine", 0, True), ("watcher", asked - 500_000_000, True), ("watcher", 1, False)):
        meta.write_text(json.dumps({"token": token, "wall_ns": wall}))
        assert _answers(str(meta), "mine", asked) is ok
    assert _answers(str(tmp_path / "absent.json"), "mine", asked) is False


def test_records_too_few_to_judge_take_the_watchers_figures_while_its_episode_was_under_way():
    """A DDP job's snapshot taken after its ranks exited (no Flight Recorder dump: the rings
    hold a barrier): the watcher's episode, under way until the job ended, is its word."""
    from hangtrace.tracer.snapshot import ProcessInfo, Snapshot
    from tests.unit.test_straggler import job

    recs = job(4, 3, slow_from_rank2)  # 3 steps: too few to judge
    newest = max(r["t_wall_ns"] for rs in recs.values() for r in rs)
    procs = [
        ProcessInfo(
            host="h",
            pid=r + 1,
            rank=r,
            world_size=4,
            state="exited",
            exit_code=0,
            records=list(rs),
            progress_wall_ns=newest,
        )
        for r, rs in recs.items()
    ]
    figures = {"rank": 2, "group": "0", "added_ms_per_step": 41.0, "added_pct": 48.0, "since_step": None}
    e = SeenStraggler(2, "0", 20, None, 35, first_seen_wall_ns=newest - 10_000 * MS, last=figures)
    for ended, named in ((newest + MS, True), (newest - MS, False)):
        snap = Snapshot(
            run_dir="/x", processes=procs, stragglers_seen=(dataclasses.replace(e, ended_wall_ns=ended),)
        )
        d = diagnose(snap, now_wall_ns=newest + 1_000 * MS)
        st = d.details.get("straggler")
        if not named:  # it ended before these records: another time
            assert st is None
            continue
        assert st["rank"] == 2 and st["judged_by"] == "watcher" and st["since_step"] == 20, st
        assert any("the node watcher saw rank 2 slow" in line for line in d.evidence), d.evidence


def test_watcher_reads_the_rank_that_joined_a_group_not_its_newer_dataloader_worker(tmp_path):
    run = unpack(tmp_path, "long", with_seen_file=False)
    headers = read_headers(str(run), {})
    (launcher,) = [p for p, h in headers.items() if h["rank"] < 0]
    rank2 = [h for h in headers.values() if h["rank"] == 2][0]
    # a DataLoader worker of rank 2: RANK inherited, started later, joined no group
    headers[launcher] = dict(
        headers[launcher], rank=2, rank_source=0, start_wall_ns=rank2["start_wall_ns"] + 1
    )
    w = SW.StragglerWatch(lambda line: None, clock=lambda: 0.0)
    rings = w._ranks(headers, lambda p, h: True)
    assert sorted(rings) == [0, 1, 2, 3] and rings[2].header["pid"] == rank2["pid"]


#: rank 2's lateness per step (ms) in the dump of a CI run of test_straggler_live's compute job
#: (slow from step 20; its extra time ramps up over the first slow steps)
CI_RAMP_MS = (
    [4, -9, -6, 6, -11, -5, 10, 5, 4, -8, 8, 2, 5, -9, -1, -2, -12, 1, -4, 2]
    + [24, 15, 17, 14, 6, 16, 34, 38, 28, 23, 37, 35, 18, 38, 13, 26, 25, 48, 48, 42]
    + [34, 51, 35, 26, 63, 58, 23, -3, 39, 17]
)


def test_a_slowdown_that_ramps_up_starts_at_its_first_slow_step():
    from hangtrace.tracer.analyze.straggler.when import split

    late = [x * 1e6 for x in CI_RAMP_MS]
    assert split(late, 5e6) == 20  # (the two-level fit alone: 26)
    noisy = list(late)
    noisy[12] = 9e6  # a noise step above the cut, apart from the run: not the start
    assert split(noisy, 5e6) == 20
    assert split([x * 1e6 for x in CI_RAMP_MS[:20]], 5e6) is None  # noise alone: no start
    # noise late by more than the cut just before the start is not taken for it (a run here)
    jump = [3, -12, 3, -3, -7, -7, 6, -5, 0, -1, 8, 6, 14, 5, 3, 26, -12, 7, 12, 12]
    jump += [45, 41, 35, 21, 40, 25, 34, 20, 15, 21, 17, 17, 23, 25, 29, 21, 23, 14, 34, 19]
    assert split([x * 1e6 for x in jump], 5e6) == 20
    one = [-2, 9, -9, 1, 5, 6, 6, 2, 4, -4, 6, -4, -4, -12, 1, 3, -1, -8, -11, 7]
    one += [15, 24, 30, 36, 8, 26, 23, 36, 34, 36, 30, 32, 28, 25, 5, 25, 19, 27, 24, 11]
    assert split([x * 1e6 for x in one], 5e6) == 20  # (one step of 7 ms after noise up to 9)
