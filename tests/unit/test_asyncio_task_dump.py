"""Issue 9 item 2: pending asyncio tasks - gathered from another thread than the loop's
(hooks/process/asyncio_tasks.py), and the chain the analysis names (analyze/stuck/asynctasks.py)."""

import asyncio
import json
import threading
import time

from hangtrace.hooks.process import asyncio_tasks, failures
from hangtrace.tracer.analyze.stuck.asynctasks import describe
from hangtrace.tracer.collect.asynciotasks import parse
from hangtrace.tracer.snapshot import LoopTasks, PendingTask, ProcessInfo


def test_gather_from_another_thread(tmp_path):
    failures.hook_asyncio(asyncio.base_events)  # as the failures instrumentor does
    loop = asyncio.new_event_loop()
    started, ev = threading.Event(), None

    async def leaf(e):
        await e.wait()

    async def main():
        nonlocal ev
        ev = asyncio.Event()
        t = asyncio.get_running_loop().create_task(leaf(ev), name="leaf-task")
        started.set()
        await t

    th = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    th.start()
    assert started.wait(10)
    try:
        path = str(tmp_path / "h-1.tasks.json")
        for _ in range(200):  # until both tasks are suspended in their awaits
            assert asyncio_tasks.write(path)
            with open(path) as f:
                loops = parse(json.load(f))
            mine = [lp for lp in loops if any(t.name == "leaf-task" for t in lp.tasks)]
            if mine and all(t.awaits_task or t.awaits_future for t in mine[0].tasks):
                break
            time.sleep(0.02)
        assert mine and mine[0].thread_id == th.ident
        by = {t.name: t for t in mine[0].tasks}
        assert by["leaf-task"].frames[0][0] == "leaf" and by["leaf-task"].frames[-1][0] == "wait"
        assert by["leaf-task"].awaits_future.startswith("<Future pending")
        main_task = [t for t in mine[0].tasks if t.coro == "test_gather_from_another_thread.<locals>.main"]
        assert main_task and main_task[0].awaits_task == "leaf-task"
    finally:
        loop.call_soon_threadsafe(ev.set)
        th.join(10)
        loop.close()
    assert not asyncio_tasks.write(path)  # no loop runs: no file


def test_describe_names_longest_chain():
    lp = LoopTasks(
        thread_id=1,
        tasks=(
            PendingTask("Task-1", "serve", (("serve", "/a/job.py", 20),), awaits_task="fetch"),
            PendingTask(
                "fetch",
                "fetch_weights",
                (("fetch_weights", "/a/job.py", 12), ("get", "/a/q.py", 3)),
                awaits_future="<Future pending>",
            ),
            PendingTask(
                "tick", "heartbeat", (("heartbeat", "/a/job.py", 40),), awaits_future="<Future pending>"
            ),
        ),
    )
    p = ProcessInfo(host="h", pid=1, rank=1, asyncio_loops=(lp,))
    s = describe(p)
    assert s == (
        "asyncio event loop: task 'Task-1' (serve) awaits task 'fetch' in get (q.py:3) <- "
        "fetch_weights (job.py:12), awaiting <Future pending>; also pending (1 of 3 tasks): task 'tick' in "
        "heartbeat (job.py:40)"
    ), s  # (the task that should wake the chain may be the other one: blind helper 52)
    assert describe(ProcessInfo(host="h", pid=2)) is None


def test_the_chain_goes_through_a_cython_coroutine_wrapper():
    """Ray runs an async actor method inside a Cython coroutine whose ``cr_await`` is a
    Cython ``coroutine_wrapper`` with no attribute for the coroutine it wraps (checked on
    Ray 2.60, Cython 3.0.12): the chain stopped at Ray's ``async_func`` and never named the
    user's method. The wrapper's one coroutine referent is followed (a stand-in type with
    the same name and a slot, which ``gc.get_referents`` visits as it does the C field)."""
    from hangtrace.hooks.process import asyncio_tasks as at

    class coroutine_wrapper:  # noqa: N801 (the name is what is recognised)
        __slots__ = ("inner",)

    class Pause:
        def __await__(self):
            yield

    async def user_method():
        await Pause()

    inner = user_method()
    inner.send(None)  # suspended at the await
    w = coroutine_wrapper()
    w.inner = inner

    class Outer:  # a coroutine-like object whose cr_await is the wrapper
        cr_frame = None
        cr_await = w

    try:
        funcs = [f["func"] for f in at.await_chain(Outer())]
        assert funcs[:2] == ["user_method", "__await__"], funcs
    finally:
        inner.close()
