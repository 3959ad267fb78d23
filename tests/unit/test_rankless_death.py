"""No process has a rank, but a traced process died: a launcher script that failed before
it started its ranks (blind job of 2026-12-02: ``int(os.environ["WORLD_SIZE"])`` raised
KeyError in the parent of ``torch.multiprocessing.spawn``). The verdict stays 'unknown'
(no rank to name) and says which process died of what."""

from synth import R, snap

from hangtrace.tracer.analyze.diagnose import diagnose


def launcher(events, state="exited", exit_code=1):
    b = R(0, 1, groups=[])
    b.set(
        rank=-1,
        state=state,
        exit_code=exit_code,
        events=[{"event": "start", "argv": ["train.py", "--lr", "3e-4"], "wall_ns": b.t}] + events,
    )
    return b.build()


def test_a_launcher_that_raised_before_its_ranks_is_named_with_its_exception():
    p = launcher([{"event": "exception", "type": "KeyError", "message": "'WORLD_SIZE'", "wall_ns": 0}])
    d = diagnose(snap([p]))
    assert (d.kind, d.cause) == ("unknown", "no-data"), d.summary
    assert d.details["rankless_death"]["cause_text"] == "KeyError: 'WORLD_SIZE'"
    assert (
        "(train.py --lr 3e-4) died before any process joined a process group: KeyError: 'WORLD_SIZE'"
        in d.summary
    ), d.summary
    assert "fix what stopped the process" in d.summary


def test_a_clean_exit_without_ranks_names_no_death():
    d = diagnose(snap([launcher([], exit_code=0)]))
    assert d.kind == "unknown" and "rankless_death" not in d.details and "died" not in d.summary, d.summary
