"""Ray's record of a worker's death from its session logs on disk (collect/ray/raylogs.py,
issue 9): the memory monitor's decision (raylet.out) and the worker's exit type
(gcs_server.out), read after the cluster is gone. The data files are an excerpt of the
real Ray 2.60 logs of the blind job ray_openrlhf_memmon on this machine (other jobs'
processes in the top list renamed)."""

import os
import shutil

from hangtrace.tracer.collect.ray import raylogs as L
from hangtrace.tracer.snapshot import ProcessInfo

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REWARD = "dbba4f0437675875ae32e306d1b418fab7037e724c3b4d8b58fe7794"
ROLLOUT = "aea3d66d8c7aeedca337a0f513c0040f70941d989b280ecd7a43eda2"
GIB = 1 << 30


def _text(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def test_raylet_kill_decisions_name_the_killed_and_the_considered_workers():
    kills = L.parse_oom_kills(_text("ray260_raylet_oom.out"))
    assert len(kills) == 2
    first = kills[0]
    assert (
        first.details.startswith("Memory on the node (IP: 192.0.2.2")
        and "4.61GB used / 23.54GB limit" in first.details
    )
    assert (
        first.reason
        == "Memory usage 4925448192B exceeded threshold of 4868155392B (19.3% of 25275990016B limit)"
    )
    sel = [w for w in first.workers if w.selected]
    assert [(w.pid, w.worker_id, w.task_name) for w in sel] == [
        (22794, REWARD, "reward-model:RewardModel.__init__")
    ]
    other = [w for w in first.workers if not w.selected]
    assert [(w.pid, round(w.memory / GIB, 2)) for w in other] == [(22740, 2.43)]
    assert first.top[0][0] == 22740 and first.top[0][2] == "ray::Rollout.generate"
    assert first.selected(REWARD, 22794) and not first.selected(ROLLOUT, 22740)
    assert kills[1].selected(ROLLOUT, 22740)
    assert L.RayOomKill.from_dict(first.to_dict()) == first


def test_gcs_worker_exits_carry_the_exit_type():
    ex = L.parse_worker_exits(_text("ray260_gcs_server_oom.out"))
    assert ex[REWARD].exit_type == L.NODE_OUT_OF_MEMORY
    assert ex[REWARD].exit_detail.startswith("1 worker(s) were killed due to the node running low on memory.")
    assert L.RayWorkerExit.from_dict(ex[REWARD].to_dict()) == ex[REWARD]


def _worker(pid, wid, temp, state="killed"):
    argv = [
        "/x/ray/_private/workers/default_worker.py",
        "--temp-dir=%s" % temp,
        "--session-name=session_2026-12-01_22-35-50_886858_22444",
        "--worker-id=%s" % wid,
    ]
    return ProcessInfo(
        host="h",
        pid=pid,
        state=state,
        events=[{"event": "start", "argv": argv}],
        meta={"ray_worker_id": wid, "ray_actor_class": "RewardModel"},
    )


def test_facts_for_dead_workers_from_their_session_logs(tmp_path):
    logs = tmp_path / "session_2026-12-01_22-35-50_886858_22444" / "logs"
    logs.mkdir(parents=True)
    shutil.copy(os.path.join(DATA, "ray260_raylet_oom.out"), str(logs / "raylet.out"))
    shutil.copy(os.path.join(DATA, "ray260_gcs_server_oom.out"), str(logs / "gcs_server.out"))
    procs = [
        _worker(22794, REWARD, str(tmp_path)),
        _worker(22740, ROLLOUT, str(tmp_path), state="alive"),
        ProcessInfo(host="h", pid=5, state="killed"),
    ]
    facts = L.ray_log_facts(procs)
    assert list(facts) == ["h:22794"]  # the live one and the non-Ray one are not looked up
    f = facts["h:22794"]
    assert f["ray_worker_exit"]["exit_type"] == "NODE_OUT_OF_MEMORY"
    assert [w["pid"] for w in f["ray_oom_kill"]["workers"] if w["selected"]] == [22794]
    # logs gone (another node, cleaned /tmp/ray): nothing, no error
    shutil.rmtree(str(logs))
    assert L.ray_log_facts([_worker(22794, REWARD, str(tmp_path))]) == {}
