"""A culprit blocked on a local TCP connection: the peer is named by its rank, and its own
threads say why it does not answer (blind helper 54: rank 2 in recv on rank 0's config
service, whose thread waited in queue.get; the verdict named the peer by pid and its
multiprocessing command line only)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from ruleutil import check  # noqa: E402
from synth import COLL_STACK, ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.analyze.stuck.peerwait import name_peers, peer_pids  # noqa: E402

SPAWN = "python from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=15, pipe_handle=17)"
RECV = {
    "syscall": "recvfrom",
    "nr": 45,
    "wchan": "wait_woken",
    "args": ["fd 28 (TCP 127.0.0.1:46160 -> 127.0.0.1:57599, ESTABLISHED, peer pid 1000 (%s))" % SPAWN],
}
ASK = (
    "ask_lr /job/launcher.py:67",
    "worker /job/launcher.py:118",
    "BaseProcess.run multiprocessing/process.py:108",
)
SERVICE = (
    "Condition.wait threading.py:327",
    "Queue.get queue.py:171",
    "config_service /job/launcher.py:58",
    "Thread.run threading.py:982",
    "Thread._bootstrap threading.py:1002",
)


def test_a_peer_command_line_with_parentheses_is_one_peer():
    text = RECV["args"][0]
    assert peer_pids(text) == [1000]
    assert (
        name_peers(text, {1000: "rank 0"})
        == "fd 28 (TCP 127.0.0.1:46160 -> 127.0.0.1:57599, ESTABLISHED, peer pid 1000: rank 0)"
    )
    assert name_peers(text, {999: "rank 1"}) == text


def _job():
    b = ranks(3, steps=40)
    b[0].wait("0", op="broadcast")
    b[1].wait("0", op="broadcast")
    r0 = stack(*COLL_STACK, extra_threads=[("config-service", SERVICE)])
    r0[1].update(active=False, kernel={"syscall": "futex", "args": []})
    r0[1]["frames"][2]["code"] = "step, lr = lr_q.get()"
    b[0].set(stacks=r0, stack_source="py-spy")
    b[1].set(stacks=stack(*COLL_STACK), stack_source="py-spy")
    r2 = stack(*ASK, active=False)
    r2[0].update(kernel=dict(RECV))
    r2[0]["frames"][0]["code"] = "chunk = s.recv(256)"
    b[2].set(stacks=r2, stack_source="py-spy")
    return diagnose(snap(b, reason="stall"))


def test_the_peer_is_named_by_its_rank_and_its_serving_thread_by_what_it_waits_for():
    d = check(_job(), "stuck-outside-collective", [2])
    reason = d.details["culprit_reasons"]["2"]
    assert "ESTABLISHED, peer pid 1000: rank 0)" in reason and "spawn_main" not in reason, reason
    assert d.details["peer_wait"] == (
        "The other end, rank 0 (pid 1000): its thread 'config-service' in config_service (launcher.py:58): "
        "`step, lr = lr_q.get()`: queue.get/put (waiting for a producer/consumer) in Queue.get (queue.py:171)"
    )
    assert d.details["peer_wait"] in d.evidence and d.details["peer_wait"] in d.summary, d.summary
    assert "Next: the rank waits on a connection to the process named above" in d.summary, d.summary


def test_a_peer_that_is_not_a_process_of_the_snapshot_stays_as_the_kernel_named_it():
    b = ranks(2, steps=5)
    b[0].wait("0")
    b[0].set(stacks=stack(*COLL_STACK), stack_source="py-spy")
    r1 = stack(*ASK, active=False)
    r1[0].update(kernel=dict(RECV, args=["fd 3 (TCP a -> b, ESTABLISHED, peer pid 77 (python3 server.py))"]))
    b[1].set(stacks=r1, stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "stuck-outside-collective", [1])
    assert "peer pid 77 (python3 server.py)" in d.details["culprit_reasons"]["1"]
    assert "peer_wait" not in d.details


def test_a_peer_whose_server_waits_for_the_lock_its_main_thread_holds_in_a_collective_is_a_cycle():
    """Rank 1 waits for rank 0's HTTP handler; the handler waits at `with state_lock:`, which
    rank 0's main thread holds while in the all_reduce that waits for rank 1."""
    b = ranks(2, steps=8)
    b[0].wait("0")
    handler = (
        "Handler.do_GET /job/job.py:30",
        "BaseHTTPRequestHandler.handle_one_request http/server.py:424",
        "Thread.run threading.py:982",
        "Thread._bootstrap threading.py:1002",
    )
    r0 = stack(*COLL_STACK, active=False, extra_threads=[("Thread-1 (process_request_thread)", handler)])
    r0[0]["frames"][2]["with"] = [[39, "with state_lock:"]]  # train_step's line is inside the block
    r0[1].update(active=False, kernel={"syscall": "futex", "args": []})
    r0[1]["frames"][0]["code"] = "with state_lock:"
    b[0].set(stacks=r0, stack_source="py-spy")
    r1 = stack(*ASK, active=False)
    r1[0].update(kernel=dict(RECV, args=["fd 5 (TCP a -> b, ESTABLISHED, peer pid 1000 (python job.py))"]))
    b[1].set(stacks=r1, stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "stuck-outside-collective", [1])
    assert d.details["peer_wait"] == (
        "The other end, rank 0 (pid 1000): its thread 'Thread-1 (process_request_thread)': waiting for a lock at "
        "Handler.do_GET (job.py:30): `with state_lock:`; its main thread most likely holds that lock (it is inside "
        "`with state_lock:` at train.py:39) while in all_reduce (distributed_c10d.py:2500): a cycle across the two "
        "processes"
    ), d.details["peer_wait"]
    assert "Next: do not hold the lock named above across a collective" in d.summary, d.summary


def test_a_file_lock_holder_is_read_from_proc_locks_and_named_by_rank(tmp_path):
    """Rank 1 blocked in flock on a file rank 0 holds while rank 0 waits in a barrier for it:
    the holder from /proc/locks (collect), named by rank with what its main thread does."""
    import os
    from hangtrace.tracer.collect.filelocks import lock_holders

    f = tmp_path / "cache.lock"
    f.write_text("")
    st = os.stat(f)
    dev = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    table = (
        "1: FLOCK  ADVISORY  WRITE 1000 %s 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 1001 %s 0 EOF\n"
        "2: POSIX  ADVISORY  WRITE 77 00:00:1 0 EOF\n" % (dev, dev)
    )
    assert lock_holders(str(f), 1001, table) == [1000]  # the waiter's own line is no holder
    assert lock_holders(str(f), 1000, table) == []
    assert lock_holders(str(tmp_path / "gone"), 1001, table) == []

    b = ranks(2, steps=5)
    b[0].wait("0", op="barrier")
    barrier = ("barrier /site-packages/torch/distributed/distributed_c10d.py:5356", "<module> /job/job.py:13")
    b[0].set(stacks=stack(*barrier, active=False), stack_source="py-spy")
    r1 = stack("<module> /job/job.py:17", active=False)
    r1[0].update(
        kernel={
            "syscall": "flock",
            "args": ["fd 23 (/data/cache.lock, held by pid 1000 (python job.py))"],
            "wchan": "locks_lock_inode_wait",
        }
    )
    b[1].set(stacks=r1, stack_source="py-spy")
    d = check(diagnose(snap(b, reason="stall")), "stuck-outside-collective", [1])
    assert "flock(fd 23 (/data/cache.lock, held by pid 1000: rank 0))" in d.details["culprit_reasons"]["1"]
    assert d.details["peer_wait"] == (
        "The lock's holder, rank 0 (pid 1000): its main thread is in barrier "
        "(distributed_c10d.py:5356), at <module> (job.py:13)"
    ), d.details["peer_wait"]
    assert "Next: release the file lock before any wait for another rank" in d.summary, d.summary


def test_a_ranks_child_server_with_two_threads_in_a_lock_order_deadlock():
    """Blind helper 94: rank 0 waits in recv for its reward-server child (started with
    subprocess, RANK inherited), whose two threads each hold the lock the other waits for.
    The child is "rank 0's child process reward_server.py" (not "rank 0"), and the deadlock
    is named, with advice about the lock order."""
    from hangtrace.tracer.snapshot import ProcessInfo

    b = ranks(3, steps=20)
    b[1].wait("0", op="broadcast")
    b[2].wait("0", op="broadcast")
    for r in (1, 2):
        b[r].set(stacks=stack(*COLL_STACK), stack_source="py-spy")
    r0 = stack("recv_line /job/job.py:49", "get_rewards /job/job.py:58", "main /job/job.py:84", active=False)
    r0[0].update(
        kernel=dict(
            RECV,
            args=[
                "fd 24 (TCP 127.0.0.1:1 -> 127.0.0.1:2, ESTABLISHED, peer pid 2000 "
                "(python3 /job/reward_server.py 46569))"
            ],
        )
    )
    r0[0]["frames"][0]["code"] = "chunk = sock.recv(4096)"
    b[0].set(stacks=r0, stack_source="py-spy")
    request = (
        "score_responses /job/reward_server.py:24",
        "serve /job/reward_server.py:60",
        "Thread.run threading.py:982",
    )
    refresh = ("refresh_cache /job/reward_server.py:40", "Thread.run threading.py:982")
    threads = stack(
        "<module> /job/reward_server.py:80",
        active=False,
        extra_threads=[("request", request), ("cache-refresher", refresh)],
    )
    for t, (code, held) in zip(
        threads[1:],
        (
            ("with lock_model:", [21, "with lock_cache:   # A: holds lock_cache"]),
            ("with lock_cache:", [36, "with  lock_model :"]),
        ),
    ):
        t.update(active=False, kernel={"syscall": "futex", "args": []})
        t["frames"][0]["code"] = code
        t["frames"][0]["with"] = [held]
    server = ProcessInfo(
        host="h0",
        pid=2000,
        rank=0,
        world_size=3,
        state="alive",
        stacks=threads,
        stack_source="py-spy",
        meta={"ppid": b[0].pid},
        events=[{"event": "start", "argv": ["python3", "/job/reward_server.py", "46569"]}],
    )
    d = check(diagnose(snap(b + [server], reason="stall")), "stuck-outside-collective", [0])
    reason = d.details["culprit_reasons"]["0"]
    assert "peer pid 2000: rank 0's child process reward_server.py)" in reason, reason
    pw = d.details["peer_wait"]
    assert pw.startswith("The other end, rank 0's child process reward_server.py (pid 2000): "), pw
    assert pw.endswith(
        "threads 'request' and 'cache-refresher' are deadlocked: each waits for a lock the other "
        "holds (`with lock_model:` inside `with lock_cache:`, and the other way round): a lock-order "
        "deadlock"
    ), pw
    assert d.details["peer_role"] == "socket-peer-deadlock"
    assert "Next: make the threads of the process named above take their locks in one order" in d.summary, (
        d.summary
    )
