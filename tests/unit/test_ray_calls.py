"""hooks/rayhooks/ray_calls.py without a cluster: what an actor creation reserves (Ray 2.60's
defaults), waits recorded only for actor-call refs and passing results and exceptions
through unchanged, and install/uninstall on the real ray module restoring every attribute."""

import asyncio
import concurrent.futures
import json
import threading

import pytest

from hangtrace.hooks.rayhooks import ray_calls, ray_create, ray_install
from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.ring import reader as R


def _log(msg, key=None):
    pass


@pytest.mark.parametrize(
    "options,resources,placement",
    [
        ({}, {"CPU": 0.0}, {"CPU": 1.0}),  # default actor: 1 CPU to place
        ({"num_gpus": 1}, {"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0, "CPU": 1.0}),  # blind ray_unschedulable
        ({"num_cpus": 0, "resources": {"accel": 2}}, {"CPU": 0.0, "accel": 2.0}, {"CPU": 0.0, "accel": 2.0}),
        ({"memory": 1 << 30}, {"memory": float(1 << 30), "CPU": 0.0}, {"memory": float(1 << 30), "CPU": 1.0}),
    ],
)
def test_actor_request_follows_rays_defaults(options, resources, placement):
    assert ray_create.actor_request(options) == {"resources": resources, "placement": placement}


class _Id:
    def __init__(self, h):
        self._h = h

    def hex(self):
        return self._h


class _Handle:
    class _Desc:
        class_name = "Judge"

    _ray_actor_creation_function_descriptor = _Desc()

    def __init__(self, aid):
        self._ray_actor_id = _Id(aid)


class _Ref:
    def __init__(self, n):
        self.n = n

    def binary(self):
        return b"r%d" % self.n


def test_waits_pass_results_and_exceptions_through_and_only_actor_refs_are_recorded(tmp_path):
    rec = Recorder(str(tmp_path), "run-rc", 64, _log)
    ray_calls._rec_fn = lambda: rec
    try:
        ray_calls.note_call(_Handle("cc03"), "grade", [_Ref(7)])

        def get(object_refs, *, timeout=None):
            if timeout == 0:
                raise TimeoutError("late")
            return ["value"]

        wrapped = ray_calls._wrap_waiting("get", get)
        assert wrapped.__name__ == "get" and wrapped.__wrapped__ is get
        assert wrapped([_Ref(1)]) == ["value"]  # a task's ref: nothing recorded
        assert wrapped(object_refs=[_Ref(7), _Ref(1)]) == ["value"]
        with pytest.raises(TimeoutError, match="late"):
            wrapped(_Ref(7), timeout=0)
        path = rec.path
    finally:
        ray_calls._rec_fn = None
        ray_calls._refs.clear()
        rec.close()
    waits = [r for r in R.read_ring(path).records if r["kind"] == "ray_wait"]
    assert [(r["state"], r["error"], r["seq"]) for r in waits] == [
        ("completed", None, 2),
        ("failed", "TimeoutError", 1),
    ]
    assert json.loads(waits[0]["group"])["targets"] == [
        {"actor_id": "cc03", "class": "Judge", "method": "grade"}
    ]


class _Fut(concurrent.futures.Future):
    """What ``ObjectRef.future()`` returns: a concurrent future holding its ref."""

    def __init__(self, ref):
        super().__init__()
        self.object_ref = ref


def test_awaits_on_actor_refs_are_waits_of_their_own_from_the_loop_thread(tmp_path):
    """``await ref`` goes through asyncio.wrap_future: each await on an actor-call ref is a
    'ray_wait' record (api 'await') on the thread that runs the loop (not the main thread),
    issued while awaited, completed / failed when the await ends; two concurrent awaits of
    one loop are two open waits in the summary (one per await, not one per thread), and a
    completed await is dropped from it. Exceptions pass through unretrieved."""
    rec = Recorder(str(tmp_path), "run-aw", 64, _log)
    ray_calls._rec_fn = lambda: rec
    wrap = ray_calls._wrap_future(asyncio.wrap_future)
    seen = {}
    try:
        ray_calls.note_call(_Handle("aa01"), "ref_logprobs", [_Ref(1), _Ref(2), _Ref(3)])

        async def main():
            f1, f2, f3, f4 = _Fut(_Ref(1)), _Fut(_Ref(2)), _Fut(_Ref(3)), _Fut(_Ref(9))
            a1, a2, a3 = wrap(f1), wrap(f2), wrap(f3)
            assert wrap(f4) is not None  # not an actor call: no record
            await asyncio.sleep(0)
            seen["open"] = sorted(ray_calls._refs)  # (still remembered)
            f1.set_result([0.5])
            f3.set_exception(ValueError("bad"))
            assert await a1 == [0.5]
            await asyncio.sleep(0.01)
            assert a3.done() and a2.done() is False
            seen["thread"] = threading.current_thread().name
            a3.exception()
            seen["summary"] = sorted(R.read_ring(rec.path, use_numpy=False).summary.waits)
            seen["summary_np"] = sorted(R.read_ring_summary(rec.path, use_numpy=True).summary.waits)
            f2.cancel()
            await asyncio.sleep(0.01)

        t = threading.Thread(target=lambda: asyncio.run(main()), name="AsyncIO Thread: default")
        t.start()
        t.join(10)
        path = rec.path
    finally:
        ray_calls._rec_fn = None
        ray_calls._refs.clear()
        rec.close()
    assert seen["thread"] == "AsyncIO Thread: default"
    ring = R.read_ring(path)
    waits = [r for r in ring.records if r["kind"] == "ray_wait"]
    n0 = waits[0]["numel"]
    assert n0 >= 1 and [(json.loads(r["group"])["api"], r["numel"] - n0, r["thread"]) for r in waits] == [
        ("await", 0, seen["thread"]),
        ("await", 1, seen["thread"]),
        ("await", 2, seen["thread"]),
    ]
    assert [(r["state"], r["error"]) for r in waits] == [
        ("completed", None),
        ("failed", "CancelledError"),
        ("failed", "ValueError"),
    ]
    # while the second await was open, both summaries kept it and the failed one, not the completed one
    keys = ["AsyncIO Thread: default#%d" % (n0 + i) for i in (1, 2)]
    assert seen["summary"] == keys and seen["summary_np"] == keys


def test_summary_keeps_every_open_await_of_one_thread():
    from hangtrace.tracer.ring.summary import wait_key

    base = {"kind": "ray_wait", "thread": "AsyncIO Thread: default"}
    assert wait_key(dict(base, numel=0, state="issued")) == "AsyncIO Thread: default"
    assert wait_key(dict(base, numel=4, state="issued")) == "AsyncIO Thread: default#4"
    assert wait_key(dict(base, numel=4, state="completed")) is None


def test_install_and_uninstall_on_the_real_ray_module():
    ray = pytest.importorskip("ray")
    from ray import actor
    from ray._private import worker
    import asyncio

    before = (
        ray.get,
        ray.wait,
        worker.get,
        worker.wait,
        actor.ActorHandle._actor_method_call,
        actor.ActorClass._remote,
        asyncio.wrap_future,
    )
    assert ray_install.install_calls(ray, lambda: None, _log) == 7
    try:
        assert ray_install.install_calls(ray, lambda: None, _log) == 0  # idempotent
        assert all(
            getattr(f, "__hangtrace_ray__", False) for f in (ray.get, ray.wait, worker.get, worker.wait)
        )
        assert ray.get.__wrapped__ is before[0] and worker.get.__wrapped__ is before[2]
    finally:
        ray_install.uninstall_calls()
    assert (
        ray.get,
        ray.wait,
        worker.get,
        worker.wait,
        actor.ActorHandle._actor_method_call,
        actor.ActorClass._remote,
        asyncio.wrap_future,
    ) == before
