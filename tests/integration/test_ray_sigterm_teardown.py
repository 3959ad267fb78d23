"""Ray's own teardown is never a root (issue 38, item 5), on a real local Ray cluster.

``scripts/ray_sigterm_trainer.py`` under ``hangtrace run``: trainer rank 1 is SIGTERMed from
outside (between two ``train`` calls, or during one); the driver's ``ray.get`` fails and its
``ray.shutdown()`` makes the raylet SIGTERM the rank-less Rollout actor and rank 0. The
verdict names rank 1 (dead-rank, SIGTERM from the driver's pid), never the Rollout. Other
sessions' Ray clusters are never touched (no ``ray stop``): the job's session is killed and
its processes reaped (``jobs.run_under_hangtrace``).

With ``HANGTRACE_LONG=1``, the same job beside two CPU burners (load >= 4) under
``--stall-s 5``: a clean run, the idle SIGTERM and a SIGKILL during ``train`` (item 4's
start-up grace for a Ray job whose only processes at first are Ray's and pooled workers
importing torch; item 5's teardown after a SIGKILL): no start-up stall, the right root.
"""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import long_only, run_under_hangtrace  # noqa: E402

pytest.importorskip("ray")
pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "ray_sigterm_trainer.py")


@pytest.mark.parametrize(
    "when",
    [
        "idle",
        pytest.param(
            "train",
            marks=pytest.mark.skipif(
                os.environ.get("HANGTRACE_LONG") != "1",
                reason="with HANGTRACE_LONG=1 (CI's 25-minute budget; the idle variant runs)",
            ),
        ),
    ],
)
def test_a_trainer_sigtermed_from_outside_is_the_root_not_rays_teardown(tmp_path, when):
    diags, why = run_under_hangtrace(
        [sys.executable, SCRIPT, when], tmp_path / "run", tmp_path, stall_s=60, timeout_s=420, reap_s=60
    )
    assert "[driver] SIGTERM to rank 1" in why and "[driver] failed: ActorDiedError" in why, why
    assert diags, why
    d = diags[0]
    assert (d["kind"], d["culprit_ranks"]) == ("dead-rank", [1]), (d["summary"], why)
    assert d["cause"] in ("sigterm", "sigterm-external"), d["summary"]
    assert not any("Rollout" in a for a in d["culprit_actors"]), d["summary"]
    assert "Rollout" not in d["summary"].split(".")[0], d["summary"]
    # the cluster is gone now: Ray's own account of the death still comes from its session
    # logs, which outlive it (analyze/actors/raysays.py), quoted beside our cause
    out = subprocess.run(
        [sys.executable, "-m", "hangtrace.cli", "analyze", "--json", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    a = json.loads(out.stdout)
    says = (a["details"].get("ray_says") or {}).get("1") or {}
    assert "session log" in str(says.get("source")) and "SIGTERM" in str(says.get("text")), (
        a["summary"],
        out.stderr,
    )
    assert 'Ray says (rank 1, its session log): "worker exit' in a["summary"], a["summary"]


@long_only("the idle SIGTERM above; a SIGKILLed trainer with Ray holding: test_ray.py::test_kill_trainer_*")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("when", ["none", "idle", "kill"])
def test_under_load_with_stall_s_5_no_startup_stall_and_the_right_root(tmp_path, when):
    from ddp_jobs import burner, stop

    hot = [burner() for _ in range(2)]
    try:
        time.sleep(3)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        diags, why = run_under_hangtrace(
            [sys.executable, SCRIPT, when], tmp_path / "run", tmp_path, stall_s=5, timeout_s=600, reap_s=60
        )
        took, load1 = time.monotonic() - t0, os.getloadavg()[0]
    finally:
        stop(*hot)
    reasons = []
    for f in sorted(glob.glob(str(tmp_path / "run" / "snapshots" / "*" / "processes.json"))):
        with open(f) as fh:
            reasons.append(json.load(fh).get("reason"))
    print(
        "\n%s: load %.1f -> %.1f, %.0f s, snapshots %s: %s"
        % (
            when,
            load0,
            load1,
            took,
            reasons,
            [(d["kind"], d["culprit_ranks"], d["summary"][:200]) for d in diags],
        )
    )
    assert "stall" not in reasons, (reasons, why)
    if when == "none":
        assert "[driver] step 7" in why and "[driver] shut down" in why, why
        assert diags == [], (diags[0]["summary"] if diags else None, why)
    else:
        assert "[driver] %s to rank 1" % ("SIGKILL" if when == "kill" else "SIGTERM") in why, why
        d = diags[0]
        assert (d["kind"], d["culprit_ranks"]) == ("dead-rank", [1]), (d["summary"], why)
        if when == "kill":
            assert d["cause"] in ("killed-without-record", "host-oom-kill"), d["summary"]
        assert not any("Rollout" in a for a in d["culprit_actors"]), d["summary"]
    assert max(load0, load1) >= 4, "the machine was not loaded (load %.1f, %.1f)" % (load0, load1)
