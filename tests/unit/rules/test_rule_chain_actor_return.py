"""Rule chain: a Ray actor rank whose method returned after its last collective, idle in Ray's
task loop, while its peers wait in the next one (analyze/actors/actorreturn.py).

Blind helper 95 (2026-12-04, verl-style trainers): a node agent SIGTERMed one of three trainer
actors; its handler set a flag, ``train()`` saved a checkpoint and returned; the actor lived
on (Ray's task loop, epoll_wait) and its peers hung in all_reduce seq 361. The verdict was
"stuck outside collectives ... blocked in the system call epoll_wait" with advice to look for
a queue, lock or IO."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import COLL_STACK, MS, R, S, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.collect.ringprocs import signal_sender  # noqa: E402
from hangtrace.tracer.process_model import name_senders  # noqa: E402
from hangtrace.tracer.report.advice import DEPARTED_NEXT, PREEMPTED_NEXT  # noqa: E402

RAY_IDLE = (
    "main_loop /usr/lib/python3.11/site-packages/ray/_private/worker.py:1069",
    "<module> /usr/lib/python3.11/site-packages/ray/_private/workers/default_worker.py:323",
)
AGENT = "hangtrace: SIGTERM from pid 5377 uid 0: python (exited)\n"
IN_TRAIN = (
    "Current thread 0x00007f39ffbd56c0 (most recent call first):\n"
    '  File "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125 in forward\n'
    '  File "/job/driver.py", line 48 in train\n'
    '  File "/usr/lib/python3.11/site-packages/ray/_private/worker.py", line 1069 in main_loop\n'
)


def _job(sigterm=True, returned_ok=True, idle=True):
    """Three TrainActor ranks in method phase 'train', 5 all_reduces each; rank 1's 'train'
    returns (``returned_ok``; else it raised) 90 ms after a SIGTERM (``sigterm``) and its
    stack is Ray's task loop (``idle``; else still in the user's code); ranks 0 and 2 wait in seq 6."""
    b = [R(r, 3) for r in range(3)]
    for r in b:
        r.set(meta={"rank_source": 1, "ray_actor_class": "TrainActor", "ray_actor_id": "%032x" % r.rank})
        r.mark("phase_enter", phase="train")
        r.coll("0", n=5)
    for r in (0, 2):
        b[r].wait("0")
        b[r].set(stacks=stack(*COLL_STACK, active=False))
    t_sig = b[1].t + 10 * MS
    b[1].t += 100 * MS
    ex = b[1].mark("phase_exit")
    if not returned_ok:
        ex["state"], ex["error"] = "failed", "ValueError: bad batch"
    b[1].phase = None
    b[1].set(stacks=stack(*(RAY_IDLE if idle else ("train /job/driver.py:52",) + RAY_IDLE), active=False))
    if sigterm:
        b[1].set(
            signals={"sigterm": {"wall_ns": t_sig, "text": AGENT + IN_TRAIN, "sender": signal_sender(AGENT)}}
        )
    return b


def test_an_actor_whose_method_returned_after_a_sigterm_skipped_the_collective():
    d = check(diagnose(snap(_job())), "skipped-collective", [1])
    ret = d.details["returned"]
    assert (ret["rank"], ret["method"], d.seq, d.waiting_ranks) == (1, "TrainActor.train", 6, [0, 2])
    assert ret["after"] == "all_reduce seq 5 on group '0'"
    assert "had received SIGTERM from pid 5377 (python (exited))" in ret["sigterm"]
    assert "in train (driver.py:48), and returned 0.1 s later" in ret["sigterm"]
    assert (
        "its actor method TrainActor.train returned" in d.summary and "idle in Ray's task loop" in d.summary
    )
    assert "Next: " + PREEMPTED_NEXT in d.summary


def test_without_a_sigterm_the_advice_is_to_find_what_ended_its_loop():
    d = check(diagnose(snap(_job(sigterm=False))), "skipped-collective", [1])
    assert d.details["returned"]["sigterm"] == "" and "Next: " + DEPARTED_NEXT in d.summary


def test_a_method_that_raised_or_an_actor_still_in_the_users_code_is_not_a_return():
    for job in (_job(returned_ok=False), _job(idle=False)):
        d = diagnose(snap(job))
        assert "returned" not in d.details, d.summary


def test_an_exited_sender_is_named_by_its_own_record_when_it_was_traced():
    b = _job()
    agent = R(-1, 3, groups=[], pid=5377, phase=None)
    agent.set(
        events=[{"event": "start", "argv": ["/job/node_agent.py", "1001", "10.0"]}],
        state="exited",
        exit_code=0,
        exit_wall_ns=b[1].t,
    )
    procs = name_senders([p.build() for p in b] + [agent.build()])
    assert procs[1].signals["sigterm"]["sender"]["cmdline"] == "/job/node_agent.py 1001 10.0 (exited)"
    d = diagnose(snap(procs))
    assert "SIGTERM from pid 5377 (/job/node_agent.py 1001 10.0 (exited))" in d.details["returned"]["sigterm"]
    late = dict(procs[-1].__dict__, pid=5377, start_wall_ns=b[1].t + S)  # (a later process with that pid)
    assert (
        name_senders([b[1].build(), type(procs[-1])(**late)])[0].signals["sigterm"]["sender"]["cmdline"]
        == "python (exited)"
    )
