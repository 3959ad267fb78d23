"""Ray's memory monitor as a cause (issue 9; OpenRLHF #936, blind job ray_openrlhf_memmon):
the worker Ray killed is named with cause 'ray-memory-monitor' from Ray's session logs
(collect/ray/raylogs.py facts in memory_facts; they outlive the cluster) with Ray's own text,
and beside it the process(es) that held the memory (our samples, Ray's record). Without
Ray's word a SIGTERM at low memory stays 'sigterm-external' ("not an OOM")."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from synth import MS, S, R, ranks, snap  # noqa: E402
from test_memory import host, mem  # noqa: E402
from test_raylogs import _text  # noqa: E402
from test_rule_actors import actor  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.collect.ray import raylogs as L  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
REWARD_WID = "dbba4f0437675875ae32e306d1b418fab7037e724c3b4d8b58fe7794"


def _ray_facts(decision=True):
    f = {"ray_worker_exit": L.parse_worker_exits(_text("ray260_gcs_server_oom.out"))[REWARD_WID].to_dict()}
    if decision:
        f["ray_oom_kill"] = L.parse_oom_kills(_text("ray260_raylet_oom.out"))[0].to_dict()
    return f


def memmon_job(facts):
    """The blind job's shape: Rollout 'rollout' (pid 22740) fills a 2.5 GiB cache, the newer
    RewardModel 'reward-model' (pid 22794, 400 MiB) is inside score() when it gets a SIGTERM."""
    ro, rm = actor("Rollout", 22740, name="rollout"), actor("RewardModel", 22794, name="reward-model")
    for b, m in ((ro, "generate"), (rm, "score")):
        b.phase = m
        b.mark("phase_enter", dt=MS)
    for i in range(5):
        ro.t = rm.t = ro.t + S
        mem(ro, "timer", "host", host((1 + i // 2) * GIB if i < 4 else 2500 * MIB), phase="generate")
        mem(rm, "timer", "host", host(400 * MIB), phase="score")
    rm.set(state="killed", signals={"sigterm": {"wall_ns": rm.t + 200 * MS, "text": ""}}, memory_facts=facts)
    return diagnose(snap([ro, rm], reason="death"))


def test_memory_monitor_kill_from_rays_logs_names_the_killed_actor_and_the_holder():
    d = memmon_job(_ray_facts())
    assert (d.kind, d.culprit_ranks, d.culprit_actors, d.cause) == (
        "dead-rank",
        [],
        ["RewardModel 'reward-model'"],
        "ray-memory-monitor",
    ), d.evidence
    assert (
        "OOM kill reason: Memory usage 4925448192B exceeded threshold of 4868155392B"
        in d.details["cause_text"]
    )
    mh = d.details["memory_holders"]
    assert mh["killed"] == {"label": "RewardModel 'reward-model'", "pid": 22794, "rss": 400 * MIB}
    assert mh["holders"][0] == {
        "process": "h0:22740",
        "pid": 22740,
        "label": "Rollout 'rollout'",
        "rss": 2500 * MIB,
        "source": "samples",
    }
    assert (
        "Ray's memory monitor killed RewardModel 'reward-model' (RSS 400.0 MiB), not the largest holder: "
        "the memory was held by Rollout 'rollout' (pid 22740, 2.4 GiB)"
    ) in d.summary, d.summary


def test_worker_exit_type_alone_is_enough():
    """Only the GCS log's exit type NODE_OUT_OF_MEMORY (the raylet's log is on another node):
    still the memory monitor; the holder from our samples."""
    d = memmon_job(_ray_facts(decision=False))
    assert d.cause == "ray-memory-monitor" and "NODE_OUT_OF_MEMORY" in d.details["cause_text"]
    assert d.details["memory_holders"]["holders"][0]["label"] == "Rollout 'rollout'"


def test_sigterm_without_rays_word_at_low_memory_stays_external():
    """The same SIGTERM with nothing from Ray (no state, no logs): not an OOM."""
    d = memmon_job({})
    assert d.cause == "sigterm-external" and "not an OOM" in d.summary, d.summary
    assert "memory_holders" not in d.details


def test_ranked_trainer_killed_by_the_memory_monitor_names_the_holder():
    """A trainer rank killed by the monitor while a rank-less rollout actor holds 3 GiB."""
    b = ranks(2)
    ro = actor("Rollout", 22740, name="rollout")
    ro.t = b[1].t
    mem(ro, "timer", "host", host(3 * GIB))
    mem(b[1], "timer", "host", host(500 * MIB), phase="train", step=3)
    b[1].set(
        state="killed",
        meta={"ray_actor_class": "Trainer", "ray_actor_name": "trainer-1", "ray_worker_id": REWARD_WID},
        memory_facts=_ray_facts(decision=False),
    )
    b[0].t += 20 * S
    b[0].wait()
    d = diagnose(snap([ro] + b))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "ray-memory-monitor"), d.evidence
    assert d.details["memory_holders"]["holders"][0]["label"] == "Rollout 'rollout'"
    assert "the memory was held by Rollout 'rollout' (pid 22740, 3.0 GiB)" in d.summary, d.summary
    assert R  # synth's builder is the one used above
