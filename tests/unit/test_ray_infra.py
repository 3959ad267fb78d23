"""hooks/rayhooks/ray_infra.py: methods of Ray's own infrastructure actors (the actor behind
ray.util.queue.Queue) record no phase - a consumer's timed polls are no progress and the
Empty of a timed get no failed method - while a user's actor methods still do."""

import asyncio

import pytest

from hangtrace.hooks.rayhooks import ray_hooks
from hangtrace.tracer import config


class _Rec:
    def __init__(self):
        self.calls = []
        self.grows = []

    def phase_enter(self, name, step=None, grow=True):
        self.calls.append(("enter", name))
        self.grows.append(grow)

    def phase_exit(self, name, error=None):
        self.calls.append(("exit", name, error))


def _method(module, qualname, coro=False, exc=None):
    if coro:

        async def f(self, *a):
            if exc:
                raise exc
            return "ok"
    else:

        def f(self, *a):
            if exc:
                raise exc
            return "ok"

    f.__module__, f.__qualname__, f.__name__ = module, qualname, qualname.split(".")[-1]
    return f


@pytest.fixture
def rec(monkeypatch):
    r = _Rec()
    monkeypatch.setattr(ray_hooks, "_rec", r)
    monkeypatch.setattr(ray_hooks, "_log", lambda *a: None)
    monkeypatch.setattr(ray_hooks, "_identity_done", {"actor", "worker"})
    monkeypatch.setattr(ray_hooks.api, "_recorder", None, raising=False)
    return r


def test_queue_actor_methods_record_no_phase_and_pass_results_and_errors(rec):
    assert config.ray_infra_actor("ray.util.queue", "_QueueActor")
    get = ray_hooks.wrap_method(
        "get", _method("ray.util.queue", "_QueueActor.get", coro=True, exc=KeyError("e"))
    )
    put = ray_hooks.wrap_method("put", _method("ray.util.queue", "_QueueActor.put", coro=True))
    qsize = ray_hooks.wrap_method("qsize", _method("ray.util.queue", "_QueueActor.qsize"))
    assert asyncio.run(put(object(), 1)) == "ok" and qsize(object()) == "ok"
    with pytest.raises(KeyError):
        asyncio.run(get(object(), 2))
    assert rec.calls == []


def test_a_users_method_still_records_its_phase(rec):
    score = ray_hooks.wrap_method("score", _method("jobs.rl", "RewardModel.score"))
    assert score(object()) == "ok"
    assert rec.calls == [("enter", "score"), ("exit", "score", None)]


def _instance_of(module):
    return type("Actor", (), {"__module__": module})()


def test_methods_of_rays_library_actors_keep_a_small_ring_small(rec):
    """Ray Train's SynchronizationActor (module ray.train...) records its calls without
    growing its ring; a user's actor grows it (hooks/record/ringsize.grows_as_actor)."""
    from hangtrace.hooks.record.ringsize import grows_as_actor

    m = ray_hooks.wrap_method("broadcast", _method("x", "SynchronizationActor.broadcast"))
    assert m(_instance_of("ray.train.v2._internal.execution.checkpoint.sync_actor")) == "ok"
    assert m(_instance_of("verl.workers.fsdp_workers")) == "ok"
    assert rec.grows == [False, True] and [c[0] for c in rec.calls] == ["enter", "exit", "enter", "exit"]
    aid = {"ray_actor_id": "ab" * 16}
    assert not grows_as_actor(aid)  # the worker-level identity: the class comes with the first method
    assert not grows_as_actor(dict(aid, ray_actor_module="ray.train.v2._internal.execution.controller"))
    assert grows_as_actor(dict(aid, ray_actor_module="__main__"))


def test_a_library_actor_that_creates_actors_keeps_its_small_ring(tmp_path, monkeypatch):
    """Ray Train's TrainController creates the worker actors and waits on them (issue 40: its
    ring was one of the four full ones, 2 MiB on disk of a 10.2 MiB run directory); a driver
    doing the same grows its ring (a user's actor has the full ring from its first method)."""
    from types import SimpleNamespace

    from hangtrace.hooks.rayhooks import ray_calls as RC
    from hangtrace.hooks.rayhooks import ray_create
    from hangtrace.hooks.record import recorder as R

    handle = SimpleNamespace(_ray_actor_id=SimpleNamespace(hex=lambda: "cd" * 16))
    actor_class = type("Worker", (), {})
    monkeypatch.setattr(ray_create, "_cluster_nodes", lambda ray, placement: None)
    for module, grows in (("ray.train.v2._internal.execution.controller.controller", False), (None, True)):
        d = tmp_path / ("library" if module else "driver")
        d.mkdir()
        rec = R.Recorder(str(d), "run", 256, lambda *a, **k: None, full_slots=4096)
        if module:
            rec.set_meta(ray_actor_id="ab" * 16, ray_actor_module=module)
        assert rec.nslots == 256
        monkeypatch.setattr(RC, "_recorder", lambda: rec)
        monkeypatch.setattr(ray_create, "_creates", 0)
        ray_create.note_create(None, actor_class, handle, {})
        assert rec.nslots == (4096 if grows else 256), module
