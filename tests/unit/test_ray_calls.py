"""hooks/ray_calls.py without a cluster: what an actor creation reserves (Ray 2.60's
defaults), waits recorded only for actor-call refs and passing results and exceptions
through unchanged, and install/uninstall on the real ray module restoring every attribute."""
import json

import pytest

from hangtrace.hooks import ray_calls
from hangtrace.hooks.recorder import Recorder
from hangtrace.tracer.ring import reader as R


def _log(msg, key=None):
    pass


@pytest.mark.parametrize("options,resources,placement", [
    ({}, {"CPU": 0.0}, {"CPU": 1.0}),                                         # default actor: 1 CPU to place
    ({"num_gpus": 1}, {"GPU": 1.0, "CPU": 1.0}, {"GPU": 1.0, "CPU": 1.0}),    # blind ray_unschedulable
    ({"num_cpus": 0, "resources": {"accel": 2}}, {"CPU": 0.0, "accel": 2.0}, {"CPU": 0.0, "accel": 2.0}),
    ({"memory": 1 << 30}, {"memory": float(1 << 30), "CPU": 0.0}, {"memory": float(1 << 30), "CPU": 1.0}),
])
def test_actor_request_follows_rays_defaults(options, resources, placement):
    assert ray_calls.actor_request(options) == {"resources": resources, "placement": placement}


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
        assert wrapped([_Ref(1)]) == ["value"]              # a task's ref: nothing recorded
        assert wrapped(object_refs=[_Ref(7), _Ref(1)]) == ["value"]
        with pytest.raises(TimeoutError, match="late"):
            wrapped(_Ref(7), timeout=0)
        path = rec.path
    finally:
        ray_calls._rec_fn = None
        ray_calls._refs.clear()
        rec.close()
    waits = [r for r in R.read_ring(path).records if r["kind"] == "ray_wait"]
    assert [(r["state"], r["error"], r["seq"]) for r in waits] == [("completed", None, 2), ("failed", "TimeoutError", 1)]
    assert json.loads(waits[0]["group"])["targets"] == [{"actor_id": "cc03", "class": "Judge", "method": "grade"}]


def test_install_and_uninstall_on_the_real_ray_module():
    ray = pytest.importorskip("ray")
    from ray import actor
    from ray._private import worker
    before = (ray.get, ray.wait, worker.get, worker.wait, actor.ActorHandle._actor_method_call,
              actor.ActorClass._remote)
    assert ray_calls.install(ray, lambda: None, _log) == 6
    try:
        assert ray_calls.install(ray, lambda: None, _log) == 0  # idempotent
        assert all(getattr(f, "__hangtrace_ray__", False) for f in (ray.get, ray.wait, worker.get, worker.wait))
        assert ray.get.__wrapped__ is before[0] and worker.get.__wrapped__ is before[2]
    finally:
        ray_calls.uninstall()
    assert (ray.get, ray.wait, worker.get, worker.wait, actor.ActorHandle._actor_method_call,
            actor.ActorClass._remote) == before
