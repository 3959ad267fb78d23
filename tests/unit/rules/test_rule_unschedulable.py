"""Rule unschedulable: a Ray actor that never got a process, waited on, asking for more
than any node has (issue 9; verl #7656) - named with what it asks for and what the
cluster offers, from the creating process's own records; Ray's state text beside it."""

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, T0, snap  # noqa: E402
from test_rule_actor_waits import actor, aid, driver, enter, ray_get  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.report.paragraph import verdict_paragraph  # noqa: E402

NODE = {
    "node_id": "ab" * 28,
    "host": "vm",
    "resources": {
        "CPU": 4.0,
        "memory": 16.0 * (1 << 30),
        "object_store_memory": 2.0 * (1 << 30),
        "node:192.0.2.2": 1.0,
    },
}


def created(b, target_pid, cls, name="", placement=None, wall=T0):
    """The ray_actor_create event hooks/rayhooks/ray_calls.py writes in the creating process."""
    ev = {
        "event": "ray_actor_create",
        "actor_id": aid(target_pid),
        "cls": cls,
        "name": name,
        "namespace": "",
        "resources": dict(placement or {}),
        "placement": dict(placement or {}),
        "placement_group": None,
        "bundle_index": None,
        "wall_ns": wall,
        "mono_ns": 0,
        "thread": "MainThread",
    }
    b.kw.setdefault("events", []).append(ev)
    meta = dict(b.kw["meta"])
    meta.update(ray_cluster_nodes=[NODE], ray_cluster_wall_ns=wall + MS)
    b.set(meta=meta)


class Ghost:
    """An actor that never got a process: only its id and class exist (for ray_get)."""

    def __init__(self, pid, cls):
        self.pid = pid
        self.kw = {"meta": {"ray_actor_class": cls}}


def gpu_job():
    """The blind job ray_unschedulable.py: a Trainer up and idle, RolloutEngine asked
    {GPU: 1} on a GPU-less node, the driver in ray.get on its get_address."""
    drv, tr = driver(), actor("Trainer", 21)
    enter(tr, "ready")
    tr.mark("phase_exit")
    tr.phase = None
    eng = Ghost(22, "RolloutEngine")
    created(drv, 22, "RolloutEngine", name="rollout-engine", placement={"GPU": 1.0, "CPU": 1.0})
    ray_get(drv, [(eng, "get_address")], dt=10 * MS)
    return drv, tr


def test_pending_gpu_actor_is_named_with_what_it_asks_for():
    drv, tr = gpu_job()
    d = check(diagnose(snap([drv, tr], reason="stall")), "unschedulable-actor", [])
    assert d.culprit_actors == ["RolloutEngine 'rollout-engine'"] and d.cause is None
    req = d.details["actor_request"]
    assert req["resources"] == {"GPU": 1.0, "CPU": 1.0} and req["short_of"] == ["GPU"]
    assert req["created_by"] == "h0:5"
    assert d.details["cluster_nodes"][0]["resources"]["CPU"] == 4.0
    assert d.details["actor_waiters"][0]["actor"] == "driver"
    p = verdict_paragraph(d)
    assert p.startswith(
        "Unschedulable Ray actor: RolloutEngine 'rollout-engine' asks for {CPU: 1, GPU: 1} and no "
        "node of the cluster (1) offers GPU; it never got a process."
    ), p
    assert "Waiting for it: driver, in ray.get on its get_address." in p
    assert any("has {CPU: 4, memory: 16.0 GiB, object_store_memory: 2.0 GiB}" in e for e in d.evidence), (
        d.evidence
    )


def test_ray_state_text_beside_ours_and_standing_in_for_a_missing_request():
    """dump --ray reached the cluster: Ray's row (PENDING_CREATION, required_resources) is
    quoted; with no creation record of ours (creator untraced), Ray's request and cluster
    totals are used."""
    drv, tr = gpu_job()
    s = snap([drv, tr], reason="stall")
    state = {
        "source": "gcs",
        "actors": [
            {
                "actor_id": aid(22),
                "class_name": "RolloutEngine",
                "name": "rollout-engine",
                "state": "PENDING_CREATION",
                "required_resources": {"GPU": 1.0, "CPU": 1.0},
            }
        ],
        "cluster_resources": {"CPU": 4.0, "memory": 1e10},
    }
    d = check(diagnose(dataclasses.replace(s, ray_state=state)), "unschedulable-actor", [])
    assert (
        "Ray says: actor RolloutEngine 'rollout-engine' is PENDING_CREATION, required resources {CPU: 1, GPU: 1}"
        in verdict_paragraph(d)
    )
    bare = [
        dataclasses.replace(
            p, events=[], meta={k: v for k, v in p.meta.items() if not k.startswith("ray_cluster")}
        )
        for p in s.processes
    ]
    d = check(diagnose(dataclasses.replace(s, processes=bare, ray_state=state)), "unschedulable-actor", [])
    assert d.culprit_actors == ["RolloutEngine 'rollout-engine'"]
    assert d.details["cluster_nodes"] == [
        {"node_id": "(all nodes)", "host": None, "resources": {"CPU": 4.0, "memory": 1e10}}
    ]


def test_actor_that_fits_a_node_is_not_unschedulable():
    """Asks {CPU: 2} of a 4-CPU node: no verdict of this rule (it may be starting, or
    waiting for CPUs other actors hold)."""
    drv = driver()
    created(drv, 31, "Worker", placement={"CPU": 2.0})
    ray_get(drv, [(Ghost(31, "Worker"), "run")])
    d = diagnose(snap([drv], reason="stall"))
    assert d.kind != "unschedulable-actor", d.summary


def test_custom_resource_and_no_waiter():
    """A custom resource no node has is unschedulable once someone waits on the actor;
    created but never waited on, it is not the hang."""
    drv = driver()
    created(drv, 41, "Judge", placement={"CPU": 1.0, "tpu_v5": 8.0})
    drv.mark("heartbeat")
    d = diagnose(snap([drv], reason="stall"))
    assert d.kind != "unschedulable-actor", d.summary
    ray_get(drv, [(Ghost(41, "Judge"), "grade")])
    d = check(diagnose(snap([drv], reason="stall", taken=drv.t + 30 * S)), "unschedulable-actor", [])
    assert d.details["actor_request"]["short_of"] == ["tpu_v5"] and d.culprit_actors == ["Judge"]
