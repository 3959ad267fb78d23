"""Rule idle: nobody waits for a broken rank (progressing, or unknown when stalled)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import S, T0, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402


def test_progressing_no_rank_waiting():
    b = ranks(4, steps=10)
    d = check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + S)), "progressing", [])
    assert d.details["last_progress_age_s"] == pytest.approx(1.0, abs=0.01)


def test_progressing_everybody_inside_collective_recently():
    b = ranks(4)
    for x in b:
        x.wait()
    check(diagnose(snap(b, reason="request", taken=max(x.t for x in b) + 2 * S)), "progressing", [])


def test_stalled_everybody_inside_collective_is_unknown():
    b = ranks(4)
    for x in b:
        x.wait()
    d = check(diagnose(snap(b, reason="stall")), "unknown", [])
    assert d.cause == "stalled-inside-collective"


def _rendezvous_rank(r, world, stack_frames):
    from synth import R, stack

    b = R(r, world, groups=[])
    return b.set(stacks=stack(*stack_frames), stack_source="py-spy", progress_wall_ns=0)


RDZV = (
    "_create_c10d_store /site-packages/torch/distributed/rendezvous.py:199",
    "_env_rendezvous_handler /site-packages/torch/distributed/rendezvous.py:265",
    "init_process_group /site-packages/torch/distributed/distributed_c10d.py:1892",
    "main job.py:12",
    "<module> job.py:20",
)


def test_stalled_in_the_rendezvous_is_its_own_cause():
    """No group was ever created and every rank is inside init_process_group (a rank given
    the wrong MASTER_PORT: both wait, found by a blind job): 'stalled-in-rendezvous', and
    the advice points at the rendezvous variables, not at more stacks."""
    from hangtrace.tracer.report.text import verdict_paragraph

    procs = [_rendezvous_rank(r, 2, RDZV) for r in range(2)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [])
    assert d.cause == "stalled-in-rendezvous" and d.details["rendezvous_ranks"] == [0, 1]
    assert "last progress anywhere 120.0 s before the snapshot" in d.evidence  # (from the ranks' start)
    text = verdict_paragraph(d)
    assert "rendezvous" in text and "MASTER_PORT" in text, text
    # one rank of three never started: named as without a record file
    procs = [_rendezvous_rank(r, 3, RDZV) for r in range(2)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [])
    assert d.cause == "stalled-in-rendezvous"
    assert any(e.startswith("rank 2: no record file") for e in d.evidence), d.evidence


def _env(rank, **environ):
    from hangtrace.tracer.envfacts import ProcessEnv

    return ProcessEnv(host="h0", pid=1000 + rank, rank=rank, environ=tuple(sorted(environ.items())))


def test_the_rank_whose_rendezvous_port_differs_from_rank_0s_is_named():
    """Two ranks, rank 1 given another MASTER_PORT: a tie of values, but rank 0 hosts the
    store, so rank 1 is the one that cannot reach it (the blind job's case)."""
    from hangtrace.tracer.report.text import verdict_paragraph

    procs = [_rendezvous_rank(r, 2, RDZV) for r in range(2)]
    envs = [
        _env(0, MASTER_ADDR="127.0.0.1", MASTER_PORT="29611"),
        _env(1, MASTER_ADDR="127.0.0.1", MASTER_PORT="29612"),
    ]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S), envs=envs), "unknown", [1])
    assert d.cause == "stalled-in-rendezvous"
    assert any(
        "MASTER_PORT=29612 on rank 1, 29611 on rank 0 (it hosts the store)" in e for e in d.evidence
    ), d.evidence
    assert "suspects: rank 1" in verdict_paragraph(d)
    # the same environment everywhere: nobody is named; without records: nobody either
    same = [_env(r, MASTER_ADDR="127.0.0.1", MASTER_PORT="29611") for r in range(2)]
    check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S), envs=same), "unknown", [])
    check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [])


def test_without_rank_0s_record_the_majority_decides_and_a_tie_names_no_one():
    procs = [_rendezvous_rank(r, 4, RDZV) for r in range(1, 4)]
    envs = [_env(1, WORLD_SIZE="4"), _env(2, WORLD_SIZE="4"), _env(3, WORLD_SIZE="3")]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S), envs=envs), "unknown", [3])
    assert any("WORLD_SIZE=3 on rank 3, 4 on the other ranks" in e for e in d.evidence), d.evidence
    envs = [_env(1, WORLD_SIZE="4"), _env(2, WORLD_SIZE="3")]
    check(diagnose(snap(procs[:2], reason="stall", taken=T0 + 120 * S), envs=envs), "unknown", [])


def _joining(r, world, **req):
    """A rank inside the rendezvous whose init_process_group call asked for ``req`` (the
    'join' event the torch.distributed hooks write before the rendezvous)."""
    ev = dict(
        {
            "event": "join",
            "rank": r,
            "world_size": world,
            "master": "127.0.0.1:29611",
            "init": "env",
            "backend": "gloo",
            "env_world_size": world,
        },
        **req,
    )
    return _rendezvous_rank(r, world, RDZV).set(events=[ev], meta={"rank_source": 2})


def test_the_rank_that_asks_for_another_store_is_named_from_its_join_request():
    """Rank 1 calls init_process_group with MASTER_PORT changed after its start (its
    environment record, written at start, may not show it): the join request does."""
    from hangtrace.tracer.report.text import verdict_paragraph

    procs = [_joining(0, 2), _joining(1, 2, master="127.0.0.1:29877")]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [1])
    assert d.cause == "stalled-in-rendezvous"
    assert (
        "init_process_group on rank 1 asks for the store at 127.0.0.1:29877; 127.0.0.1:29611 on rank 0 "
        "(it hosts the store)"
    ) in d.evidence, d.evidence
    assert "suspects: rank 1" in verdict_paragraph(d)


def test_a_world_size_larger_than_the_ranks_there_are_is_explained():
    """torchrun starts 2 ranks (WORLD_SIZE=2) and the script passes world_size=3: both wait
    for a rank 2 that never comes; their own call is at fault."""
    procs = [_joining(r, 3, env_world_size=2) for r in range(2)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [0, 1])
    assert (
        "init_process_group on ranks 0-1 asks for world size 3, but WORLD_SIZE=2 in their environment and "
        "no process is rank 2: the rendezvous waits for ranks that will never come"
    ) in d.evidence, d.evidence
    # WORLD_SIZE says 3 too: rank 2 is missing (not started, not traced)
    procs = [_joining(r, 3) for r in range(2)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [2])
    assert any(
        e.startswith("init_process_group on ranks 0-1 asks for world size 3; no traced process is rank 2")
        for e in d.evidence
    ), d.evidence
    # ranks asking for different world sizes: the odd one out
    procs = [_joining(0, 2), _joining(1, 3)]
    d = check(diagnose(snap(procs, reason="stall", taken=T0 + 120 * S)), "unknown", [1])
    assert any("asks for world size 3; 2 on rank 0" in e for e in d.evidence), d.evidence


def test_two_processes_asking_for_one_rank_are_named_not_the_missing_rank():
    """A home-made launcher gives RANK=0 to both workers (found by a blind job): one fails to
    bind the store (EADDRINUSE) and exits, the other waits for a rank 1 that never comes.
    The culprit is the doubled rank 0, not the missing rank 1."""
    import dataclasses

    dead = dataclasses.replace(_joining(0, 2).build(), pid=999, state="exited", exit_wall_ns=T0 + 2 * S)
    alive = dataclasses.replace(_joining(0, 2).build(), start_wall_ns=T0 + S)
    d = check(diagnose(snap([dead, alive], reason="stall", taken=T0 + 120 * S)), "unknown", [0])
    assert d.cause == "stalled-in-rendezvous"
    assert (
        "init_process_group was called as rank 0 by 2 processes at the same time (h0:999, h0:1000); no "
        "process is rank 1: the launcher gives one RANK twice"
    ) in d.evidence, d.evidence


IMPORTING = (
    "_prepare_class_assumptions /site-packages/sympy/core/assumptions.py:666",
    "<module> /site-packages/sympy/polys/polynomials.py:687",
    "_call_with_frames_removed <frozen importlib._bootstrap>:241",
    "_load_unlocked <frozen importlib._bootstrap>:690",
    "_find_and_load_unlocked <frozen importlib._bootstrap>:1147",
    "_find_and_load <frozen importlib._bootstrap>:1176",
    "train_step rl_loop.py:180",
    "actor_method_executor function_manager.py:740",
)


def test_ranks_caught_importing_are_working_not_waiting():
    """CI (a loaded machine, a 6 s threshold): the ranks' first optimizer step imported
    sympy lazily; the stall verdict said they 'wait outside collectives'. It says they are
    inside an import, and where."""
    from synth import stack

    b = ranks(4)
    b[0].set(stacks=stack(*IMPORTING), stack_source="py-spy")
    b[2].set(stacks=stack(*IMPORTING), stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "unknown", [])
    assert d.cause == "stalled-outside-collectives"
    line = next(e for e in d.evidence if "inside an import" in e)
    assert line.startswith("ranks 0,2 are inside an import (<module> (polynomials.py:687))"), line
    assert not any("every rank waits outside collectives" in e for e in d.evidence), d.evidence
    # nobody importing: the wait wording stays
    d = check(diagnose(snap(ranks(4), reason="stall")), "unknown", [])
    assert any("every rank waits outside collectives" in e for e in d.evidence), d.evidence


def test_the_rendezvous_names_rankless_actors_still_importing():
    """Ray actors join the group in their first method after importing torch; on a loaded
    machine two of them were still importing when the others' rendezvous was snapshotted
    (the verdict said 'no traced process is rank 1': not started?). The importing actors
    are named as the likely missing ranks; a process that is not importing is not."""
    from synth import R, stack

    procs = [_joining(0, 3), _joining(1, 3)]
    actor = R(-1, -1, groups=[], pid=4242, phase="setup").set(
        stacks=stack(*IMPORTING[:2], *IMPORTING[2:6], "setup rl_loop.py:109"),
        stack_source="py-spy",
        meta={"ray_actor_id": "ab12", "ray_actor_class": "Trainer", "ray_actor_name": "trainer-2"},
    )
    idle = R(-1, -1, groups=[], pid=4343).set(stacks=stack("main_loop worker.py:1069"), stack_source="py-spy")
    d = check(diagnose(snap(procs + [actor, idle], reason="stall", taken=T0 + 120 * S)), "unknown", [2])
    assert d.cause == "stalled-in-rendezvous"
    line = next(e for e in d.evidence if "inside an import" in e)
    assert (
        "1 traced process(es) without a rank yet" in line and "Trainer 'trainer-2' (phase 'setup')" in line
    ), line
    assert "4343" not in line
