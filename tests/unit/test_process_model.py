"""The process model (issue 9): a rank is a process that joined a group; RANK in the
environment is only a hint that helpers inherit."""

import dataclasses

from hangtrace.tracer.process_model import assign_roles
from hangtrace.tracer.snapshot import Role
from hangtrace.tracer.snapshot import ProcessInfo

S = 1_700_000_000_000_000_000


def proc(pid, rank, ppid=1, joined=False, start=0, state="alive", meta=None, **kw):
    m = dict(meta or {}, ppid=ppid, rank_source=1 if joined else 0)
    return ProcessInfo(
        host="h", pid=pid, rank=rank, world_size=2, start_wall_ns=S + start * 10**9, state=state, meta=m, **kw
    )


def test_dataloader_workers_started_later_never_stand_for_their_rank():
    launcher = proc(10, -1, ppid=1)
    r0, r1 = proc(11, 0, ppid=10, joined=True), proc(12, 1, ppid=10, joined=True, start=1)
    workers = [proc(20 + i, i % 2, ppid=11 + i % 2, start=5 + i) for i in range(4)]
    out = assign_roles([launcher, r0, r1] + workers)
    assert out.ranks == {0: r0, 1: r1}
    assert out.role(launcher) == Role.LAUNCHER
    for w in workers:
        assert out.role(w) == Role.RANK_HELPER
        assert out.helper_of[w.key] == w.rank
    assert not out.claims


def test_resource_tracker_with_the_launchers_rank_hint_is_the_launchers_not_a_ranks():
    # spawn with RANK set in the parent: the resource tracker (child of the launcher,
    # started last) carries RANK=1 without being rank 1, nor a helper of it (a blind
    # job's `records` listed it as rank 0's helper)
    launcher = proc(10, -1)
    r0, r1 = proc(11, 0, ppid=10, joined=True), proc(12, 1, ppid=10, joined=True, start=1)
    tracker = proc(13, 1, ppid=10, start=2)
    out = assign_roles([launcher, r0, r1, tracker])
    assert out.ranks[1] is r1 and out.role(tracker) == Role.OTHER and tracker.key not in out.helper_of
    orphan = proc(14, 1, ppid=99, start=3)  # a process with the hint and no traced parent: still a helper
    out = assign_roles([launcher, r0, r1, tracker, orphan])
    assert out.role(orphan) == Role.RANK_HELPER and out.helper_of[orphan.key] == 1


def test_before_anyone_joined_the_rootmost_live_candidate_holds_the_rank():
    r0 = proc(11, 0, ppid=10)
    child = proc(21, 0, ppid=11, start=3)  # forked before init (e.g. a compile worker)
    dead_earlier = proc(9, 0, ppid=10, start=-5, state="killed")
    out = assign_roles([child, r0, dead_earlier])
    assert out.ranks[0] is r0
    assert out.role(child) == Role.RANK_HELPER


def test_restart_keeps_the_new_generation_and_notes_it():
    old = proc(11, 0, joined=True, start=0, state="killed", progress_wall_ns=S + 3 * 10**9)
    new = proc(31, 0, joined=True, start=10)
    out = assign_roles([new, old])
    assert out.ranks[0] is new
    assert [(c.kind, c.kept, c.others) for c in out.claims] == [("restart", new.key, (old.key,))]


def test_two_live_processes_joined_as_one_rank_is_a_conflict():
    a, b = proc(11, 0, joined=True), proc(12, 0, joined=True, start=1)
    out = assign_roles([a, b])
    assert out.claims[0].kind == "conflict" and out.claims[0].kept == b.key


def test_ray_actors_and_task_workers():
    actor = proc(40, -1, meta={"ray_actor_id": "ab", "ray_actor_class": "Producer"})
    ranked_actor = proc(41, 0, joined=True, meta={"ray_actor_id": "cd", "ray_actor_class": "Trainer"})
    worker = proc(
        42,
        -1,
        meta={"ray_job_id": "01", "ray_worker_id": "ff"},
        events=[{"event": "start", "argv": [".../ray/_private/workers/default_worker.py"]}],
    )
    driver = proc(43, -1, meta={"ray_job_id": "01"}, events=[{"event": "start", "argv": ["train.py"]}])
    out = assign_roles([actor, ranked_actor, worker, driver])
    assert out.role(actor) == Role.RAY_ACTOR and out.role(ranked_actor) == Role.RAY_ACTOR
    assert out.ranks == {0: ranked_actor}
    assert out.role(worker) == Role.RAY_TASK_WORKER and out.role(driver) == Role.LAUNCHER


def test_rings_from_before_rank_source_count_group_definitions_as_joining():
    rank = ProcessInfo(
        host="h", pid=11, rank=0, world_size=1, start_wall_ns=S, groups=[{"name": "0", "ranks": [0]}]
    )
    helper = ProcessInfo(host="h", pid=12, rank=0, world_size=1, start_wall_ns=S + 10**9)
    out = assign_roles([rank, helper])
    assert out.ranks[0] is rank and out.role(helper) == Role.RANK_HELPER


def _requesting(pid, rank, ppid=10, start=0, state="alive"):
    """A process inside init_process_group that asked to be ``rank`` (ring header
    rank_source 2, RANK_FROM_JOIN): not joined yet."""
    return ProcessInfo(
        host="h",
        pid=pid,
        rank=rank,
        world_size=2,
        start_wall_ns=S + start * 10**9,
        state=state,
        meta={"ppid": ppid, "rank_source": 2},
    )


def test_a_rank_asked_for_at_init_process_group_beats_the_inherited_hint():
    """torch.multiprocessing.spawn with RANK=0 set in the parent (found by a blind job): both
    children inherit RANK=0; stuck in the rendezvous, each asked for its own rank. The
    spawn parent and its resource tracker keep the hint and are not ranks."""
    launcher = proc(10, 0, ppid=1)
    w0, w1 = _requesting(11, 0), _requesting(12, 1, start=1)
    tracker = proc(13, 0, ppid=10, start=2)
    out = assign_roles([launcher, w0, w1, tracker])
    assert out.ranks == {0: w0, 1: w1} and not out.claims
    assert out.role(launcher) == Role.LAUNCHER and out.role(tracker) == Role.OTHER


def test_two_live_processes_asking_for_one_rank_are_a_conflict():
    a, b = _requesting(11, 0), _requesting(12, 0, start=1)
    out = assign_roles([a, b])
    assert out.ranks[0] is b and [(c.rank, c.kind) for c in out.claims] == [(0, "conflict")]


def test_a_duplicate_that_died_while_the_other_ran_is_a_conflict_not_a_restart():
    """A launcher gives both workers RANK=0 (found by a blind job): the first to start fails
    to bind the store and exits 1 ms after the second started. Overlapping lifetimes: a
    conflict. A rank whose old process ended before the new one started stays a restart."""
    a = ProcessInfo(
        host="h",
        pid=11,
        rank=0,
        world_size=2,
        start_wall_ns=S,
        state="exited",
        exit_wall_ns=S + 2 * 10**6,
        meta={"ppid": 10, "rank_source": 2},
    )
    b = dataclasses.replace(_requesting(12, 0), start_wall_ns=S + 10**6)
    out = assign_roles([a, b])
    assert [(c.rank, c.kind) for c in out.claims] == [(0, "conflict")]
    old = ProcessInfo(
        host="h",
        pid=11,
        rank=0,
        world_size=2,
        start_wall_ns=S,
        state="exited",
        exit_wall_ns=S + 10**6,
        meta={"ppid": 10, "rank_source": 2},
    )
    new = _requesting(12, 0, start=1)
    assert [(c.rank, c.kind) for c in assign_roles([old, new]).claims] == [(0, "restart")]


def test_records_labels_processes_by_the_model_not_by_the_rank_they_inherited():
    # spawn with RANK=0 set in the parent: rank 1's DataLoader worker inherits RANK=0, and
    # so do the launcher and its resource tracker (a blind job's `records` called them all rank 0)
    from hangtrace.cli_records import who

    start = [
        {"event": "start", "argv": ["python", "-c", "from multiprocessing.resource_tracker import main"]}
    ]
    launcher = proc(10, 0, ppid=1)
    r0, r1 = proc(11, 0, ppid=10, joined=True), proc(12, 1, ppid=10, joined=True, start=1)
    worker = proc(21, 0, ppid=12, start=5)
    tracker = proc(13, 0, ppid=10, start=2, events=start)
    roles = assign_roles([launcher, r0, r1, worker, tracker])
    assert [who(p, roles) for p in (launcher, r0, r1, worker)] == [
        ("launcher", None),
        ("rank 0", None),
        ("rank 1", None),
        ("helper of rank 1", 1),
    ]
    assert who(tracker, roles) == (
        "other  [python -c from multiprocessing.resource_tracker import main]",
        None,
    )


def test_records_labels_a_ray_actor_by_its_class_and_ray_daemons_as_other():
    """Blind helper 60: which ray-actor pid is the RewardServer; helper 55: Ray's own daemons
    were labelled launcher."""
    from hangtrace.cli_records import who

    actor = ProcessInfo(
        host="h",
        pid=44,
        rank=-1,
        world_size=-1,
        state="alive",
        meta={"ray_actor_id": "ab" * 16, "ray_actor_class": "RewardServer", "ray_actor_name": "rm"},
    )
    daemon = ProcessInfo(
        host="h",
        pid=45,
        rank=-1,
        world_size=-1,
        state="alive",
        meta={"ray_job_id": "01"},
        events=[{"event": "start", "argv": ["/py/lib/python3.11/site-packages/ray/_private/log_monitor.py"]}],
    )
    roles = assign_roles([actor, daemon])
    assert who(actor, roles) == ("ray-actor RewardServer 'rm'", None)
    assert who(daemon, roles)[0].startswith("other  [")


def test_a_ranks_child_that_joined_as_its_rank_never_stands_for_it():
    """Blind helper 66: rank 0 runs an eval script with subprocess.run; the child inherits
    RANK=0, WORLD_SIZE, MASTER_PORT and joins (or asks to join) the job's group as rank 0.
    The newer process used to be analysed as rank 0 ("conflicting launches")."""
    r0, r1 = proc(11, 0, joined=True), proc(12, 1, joined=True)
    child = proc(30, 0, ppid=11, joined=True, start=40)
    out = assign_roles([r0, r1, child])
    assert out.ranks[0].key == r0.key and out.roles[child.key] == Role.RANK_HELPER
    assert out.helper_of[child.key] == 0
    assert (out.claims[0].kind, out.claims[0].kept, out.claims[0].others) == (
        "inherited",
        r0.key,
        (child.key,),
    )
    # a restart is no child: the new generation (a sibling, the old one dead) still takes the rank
    old = proc(13, 1, joined=True, state="killed")
    new = proc(14, 1, joined=True, start=50)
    out = assign_roles([r0, old, new])
    assert out.ranks[1].key == new.key and out.claims[0].kind == "restart"
