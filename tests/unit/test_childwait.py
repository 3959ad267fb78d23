"""A culprit stuck outside collectives that waits for a child process: the verdict names the
child and what it does (blind job: rank 0's evaluator, started with subprocess.run and
capture_output, hung in a socket recv; the verdict said "select() on sockets/files")."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from ruleutil import check  # noqa: E402
from synth import R, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason  # noqa: E402
from hangtrace.tracer.report.advice import CHILD_PIPE_NEXT  # noqa: E402

RANK_RUNS = (
    "_PollLikeSelector.select /usr/lib/python3.11/selectors.py:415",
    "Popen._communicate /usr/lib/python3.11/subprocess.py:2115",
    "Popen.communicate /usr/lib/python3.11/subprocess.py:1209",
    "run /usr/lib/python3.11/subprocess.py:550",
    "evaluate /job/train.py:60",
    "main /job/train.py:99",
    "<module> /job/train.py:120",
)
CHILD = ("ask_reward_server /job/evaluate.py:12", "main /job/evaluate.py:20", "<module> /job/evaluate.py:24")
RECV = {
    "syscall": "recvfrom",
    "nr": 45,
    "wchan": "wait_woken",
    "args": ["fd 3 (TCP 127.0.0.1:40786 -> 127.0.0.1:9999, ESTABLISHED)"],
}


def _start(argv, ppid):
    return [{"event": "start", "argv": list(argv), "ppid": ppid}]


def _job(child_kernel=RECV, children=True, rank_kernel=None, fork_worker=True):
    r0, r1, r2 = R(0, 3), R(1, 3), R(2, 3)
    for b in (r0, r1, r2):
        b.coll("0", n=10)
    r1.wait("0", op="broadcast")
    r2.wait("0", op="broadcast")
    main = stack(*RANK_RUNS, active=False)
    if rank_kernel:
        main[0]["kernel"] = rank_kernel
    argv = ["/usr/bin/python3", "train.py"]
    r0.set(stacks=main, stack_source="py-spy", events=_start(argv, 1))
    procs = [r0, r1, r2]
    if children:
        th = stack(*CHILD, active=False)
        th[0]["kernel"] = child_kernel
        procs.append(
            R(0, 3, groups=[], pid=3001, phase=None).set(
                stacks=th,
                stack_source="py-spy",
                meta={"rank_source": 0, "ppid": r0.pid},
                events=_start(["/usr/bin/python3", "evaluate.py", "--ckpt", "step10"], r0.pid),
            )
        )
    if fork_worker:  # a DataLoader worker of rank 0: the same command line, idle at its queue
        procs.append(
            R(0, 3, groups=[], pid=3002, phase=None).set(
                stacks=stack(
                    "Queue.get /usr/lib/python3.11/multiprocessing/queues.py:113",
                    "_worker_loop /site-packages/torch/utils/data/_utils/worker.py:334",
                    active=False,
                ),
                stack_source="py-spy",
                meta={"rank_source": 0, "ppid": r0.pid},
                events=_start(argv, r0.pid),
            )
        )
    return diagnose(snap(procs))


def test_the_rank_waiting_in_subprocess_run_names_its_child_and_what_it_does():
    d = check(_job(), "stuck-outside-collective", [0])
    text = d.details["child_wait"]
    assert text.startswith(
        "rank 0 waits for its child process (run (subprocess.py:550)): pid 3001 "
        "(/usr/bin/python3 evaluate.py --ckpt step10): blocked in the system call recvfrom("
    ), text
    # the innermost frame once (the reason names it), then its callers
    assert text.endswith(
        "in ask_reward_server (evaluate.py:12), called from main (evaluate.py:20) < <module> (evaluate.py:24)"
    ), text
    assert "recvfrom(fd 3 (TCP 127.0.0.1:40786 -> 127.0.0.1:9999, ESTABLISHED))" in text, text
    assert "3002" not in text  # the DataLoader worker is not the child waited for
    # one sentence in the paragraph: the wait, where the user's code called it, the child
    assert (
        "rank 0 is not in any collective at phase 'train', step 0: it waits for its child process "
        "(run (subprocess.py:550), called at evaluate (train.py:60)): pid 3001 "
        in d.summary
        and "ask_reward_server" in d.summary
    ), d.summary
    assert d.summary.count("child process") == 2 and "Rank 0 waits for its child" not in d.summary, d.summary
    assert "kernel: poll" not in d.summary and "Popen" not in d.summary, d.summary
    assert text in d.evidence
    assert "waiting for a subprocess in run (subprocess.py:550)" in d.details["culprit_reasons"]["0"]
    assert "select() on sockets" not in d.summary  # the select is on the child's pipes
    assert "Next: the rank waits for the child process named above" in d.summary


def test_the_kernels_wait4_pid_picks_that_child():
    d = check(
        _job(rank_kernel={"syscall": "wait4", "nr": 61, "args": ["pid 3002"]}),
        "stuck-outside-collective",
        [0],
    )
    assert "pid 3002" in d.details["child_wait"] and "3001" not in d.details["child_wait"], d.details[
        "child_wait"
    ]


def test_no_traced_child_says_so_and_how_to_find_it():
    d = check(_job(children=False, fork_worker=False), "stuck-outside-collective", [0])
    text = d.details["child_wait"]
    assert "no live traced child of it" in text and "ps --ppid 1000" in text, text


def test_a_rank_not_waiting_for_a_child_gets_no_child_sentence():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll("0", n=5)
    r1.wait("0")
    r0.set(stacks=stack("get /usr/lib/python3.11/queue.py:171", "main job.py:50"), stack_source="py-spy")
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [0])
    assert "child_wait" not in d.details


def test_blocking_reason_adds_the_kernels_word_and_the_gil():
    fr = [
        {"name": "_open_zipfile_writer_file.__init__", "filename": "/t/serialization.py", "line": 828},
        {"name": "save_shard", "filename": "/job/train.py", "line": 37},
    ]
    th = {
        "active": False,
        "owns_gil": True,
        "frames": fr,
        "kernel": {"syscall": "openat", "args": ["'/ckpt/shard1.pt'"], "wchan": "wait_for_partner"},
    }
    why = blocking_reason(fr, thread=th)
    assert why == (
        "blocked in the system call openat('/ckpt/shard1.pt'), kernel wait wait_for_partner (a FIFO "
        "open waits until another process opens its other end), in "
        "_open_zipfile_writer_file.__init__ (serialization.py:828); it holds the GIL, so no other "
        "Python thread of the process runs"
    ), why
    th2 = dict(th, owns_gil=False, kernel=None)
    assert blocking_reason(fr, thread=th2) == (
        "idle in a system call (py-spy: thread not active) in "
        "_open_zipfile_writer_file.__init__ (serialization.py:828)"
    )
    q = [{"name": "Queue.get", "filename": "/usr/lib/python3.11/queue.py", "line": 171}]
    # a futex says nothing more of a named Python-level wait; another system call does
    assert (
        blocking_reason(q, thread={"active": False, "kernel": {"syscall": "futex", "args": []}})
        == "queue.get/put (waiting for a producer/consumer) in Queue.get (queue.py:171)"
    )
    s = [{"name": "socket.recv", "filename": "/usr/lib/python3.11/socket.py", "line": 1}]
    assert (
        blocking_reason(s, thread={"active": False, "kernel": {"syscall": "recvfrom", "args": ["fd 3"]}})
        == "socket IO in socket.recv (socket.py:1); kernel: recvfrom(fd 3)"
    )


def test_an_untraced_child_seen_at_stack_time_is_named_with_its_system_call():
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll("0", n=5)
    r1.wait("0")
    argv = ["/usr/bin/python3", "job.py"]
    main = stack(
        "Popen._try_wait /usr/lib/python3.11/subprocess.py:1959",
        "Popen._wait /usr/lib/python3.11/subprocess.py:2001",
        "Popen.wait /usr/lib/python3.11/subprocess.py:1264",
        "call /usr/lib/python3.11/subprocess.py:391",
        "check_call /usr/lib/python3.11/subprocess.py:408",
        "pack_outputs job.py:41",
        "main job.py:80",
        active=False,
    )
    main[0]["kernel"] = {"syscall": "wait4", "args": ["pid 4242"], "wchan": "do_wait"}
    tool = {
        "pid": 4242,
        "argv": ["tar", "-cf", "/out/e1.tar", "/out/e1"],
        "state": "S",
        "kernel": {"syscall": "read", "args": ["fd 3 (/out/e1/metrics.fifo)"], "wchan": "pipe_read"},
    }
    worker = {"pid": 4241, "argv": argv, "state": "S"}
    r0.set(stacks=main, stack_source="py-spy", events=_start(argv, 1), children=(worker, tool))
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [0])
    assert d.details["child_wait"] == (
        "rank 0 waits for its child process (check_call (subprocess.py:408)): pid 4242 (tar -cf /out/e1.tar "
        "/out/e1), not traced, state S: blocked in the system call read(fd 3 (/out/e1/metrics.fifo)), kernel wait "
        "pipe_read (reading a pipe or FIFO no process writes to)"
    ), d.details["child_wait"]
    # without the kernel's wait4: every untraced child with a command line of its own (not the worker)
    del main[0]["kernel"]
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [0])
    assert "pid 4242 (tar" in d.details["child_wait"] and "4241" not in d.details["child_wait"]


def test_popen_wait_on_a_child_that_fills_its_stdout_pipe_is_the_documented_deadlock():
    """Popen(..., stdout=PIPE).wait(): the child blocks writing a full pipe nobody reads (the
    subprocess docs' warning); a job of ours, 2026-12-04."""
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll("0", n=5)
    r1.wait("0")
    main = stack(
        "Popen._try_wait /usr/lib/python3.11/subprocess.py:1959",
        "Popen._wait /usr/lib/python3.11/subprocess.py:2001",
        "Popen.wait /usr/lib/python3.11/subprocess.py:1264",
        "main /job/job.py:11",
        active=False,
    )
    main[0]["kernel"] = {"syscall": "wait4", "args": ["pid 4242"], "wchan": "do_wait"}
    tool = {
        "pid": 4242,
        "argv": ["seq", "1", "2000000"],
        "state": "S",
        "kernel": {"syscall": "write", "args": ["fd 1 (pipe:[190018])"], "wchan": "anon_pipe_write"},
    }
    r0.set(stacks=main, stack_source="py-spy", events=_start(["python", "job.py"], 1), children=(tool,))
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [0])
    text = d.details["child_wait"]
    assert "kernel wait anon_pipe_write (writing a full pipe no process reads)" in text, text
    assert text.endswith(
        "Popen.wait() never reads the child's pipes: with stdout=PIPE or stderr=PIPE the child "
        "blocks once a pipe is full (64 KiB) - use communicate()"
    ), text
    # the advice: the rank must read while the child runs, not "fix what that child waits for" (blind helper 100)
    assert d.details["child_pipe_full"] is True and "Next: " + CHILD_PIPE_NEXT in d.summary, d.summary


def test_a_socket_peer_that_is_a_rank_is_named_as_that_rank():
    """The evaluator's socket leads back to rank 0 itself (its reward-server thread): the
    collector names the peer's pid (collect/kernelwait.py); the verdict says which rank."""
    kern = dict(
        RECV,
        args=["fd 3 (TCP 127.0.0.1:40786 -> 127.0.0.1:9999, ESTABLISHED, peer pid 1000 (python3 train.py))"],
    )
    d = check(_job(child_kernel=kern), "stuck-outside-collective", [0])
    assert "ESTABLISHED, peer pid 1000: rank 0)" in d.details["child_wait"], d.details["child_wait"]
    kern = dict(
        RECV, args=["fd 3 (TCP 127.0.0.1:40786 -> 127.0.0.1:9999, ESTABLISHED, peer pid 4321 (redis-server))"]
    )
    d = check(_job(child_kernel=kern), "stuck-outside-collective", [0])
    assert "peer pid 4321 (redis-server)" in d.details["child_wait"], d.details[
        "child_wait"
    ]  # no rank: as collected
