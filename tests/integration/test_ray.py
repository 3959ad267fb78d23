"""Ray-native tracing on a real local two-node Ray cluster (ray.cluster_utils.Cluster).

One cluster for the whole module (starting it costs ~9 s here). Every job is a separate
driver process (its own Ray job, runtime env and HANGTRACE_DIR); hangtrace reaches its
actors only through the runtime env's env_vars. Verdicts come from
``hangtrace dump RUN_DIR --ray --address ADDR --json``: collector tasks pinned to both
nodes, one local snapshot, Ray's actor/worker tables joined in.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import REPO, base_env, wait_until
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as R
from hangtrace.tracer.collect.rings import load_run

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

RL_LOOP = os.path.join(REPO, "examples", "rl_loop.py")
TIMEOUT_S = 90  # gloo and ray.get timeout inside the example; the tests end it earlier


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    env_backup = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HANGTRACE")}
    c = None
    try:
        try:
            c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
            c.add_node(num_cpus=2)
            c.wait_for_nodes()
        except Exception as e:  # pragma: no cover - machine without Ray support
            pytest.skip("cannot start a local Ray cluster: %s" % e)
        yield c
    finally:
        if c is not None:
            try:
                c.shutdown()
            except Exception:
                pass
        os.environ.update(env_backup)


def _runtime_env(run_dir, **extra):
    env = {"HANGTRACE": "1", "HANGTRACE_DIR": str(run_dir), "HANGTRACE_AUTO_WATCH": "0"}
    env.update({k: str(v) for k, v in extra.items()})
    return {"env_vars": env}


def _driver_env():
    env = base_env(traced=False)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_JOB_CONFIG_JSON_ENV_VAR", None)
    return env


class Driver:
    """A driver subprocess whose stdout goes to a file we can wait on."""

    def __init__(self, argv, env, log_path):
        self.log_path = log_path
        self.f = open(log_path, "w")
        self.p = subprocess.Popen(
            argv, env=env, stdout=self.f, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_line(self, needle, timeout=90):
        def seen():
            if needle in self.text():
                return True
            if self.p.poll() is not None:
                raise AssertionError(
                    "driver exited (%s) before %r:\n%s" % (self.p.returncode, needle, self.text()[-4000:])
                )
            return False

        wait_until(seen, timeout=timeout, period=0.1)

    def stop(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except OSError:
                    pass
                self.p.wait()
        self.f.close()


def _headers(run_dir):
    out = {}
    for name in os.listdir(run_dir):
        if name.startswith("ring-"):
            try:
                with open(os.path.join(run_dir, name), "rb") as f:
                    out[name] = R.read_header(f.read(F.HEADER_SIZE))
            except Exception:
                pass
    return out


def _progress(run_dir):
    return {k: h["progress_count"] for k, h in _headers(run_dir).items()}


def wait_blocked(run_dir, n, timeout=60):
    """Wait until ``n`` traced processes are blocked inside a collective (header in-flight)."""
    wait_until(
        lambda: sum(1 for h in _headers(run_dir).values() if h["inflight_idx"]) >= n,
        timeout=timeout,
        period=0.2,
    )


def wait_quiet(run_dir, quiet_s=1.5, timeout=45):
    """Wait until no ring's progress counter moves for ``quiet_s`` (the job is hung)."""
    last = [None, time.time()]

    def quiet():
        cur = _progress(run_dir)
        if cur != last[0]:
            last[0], last[1] = cur, time.time()
            return False
        return time.time() - last[1] >= quiet_s

    wait_until(quiet, timeout=timeout, period=0.25)


def dump_ray(run_dir, address):
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "dump", str(run_dir), "--ray", "--address", address, "--json"],
        env=_driver_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    d = json.loads(r.stdout)
    d["_took_s"] = time.time() - t0
    return d


def run_fault(cluster, tmp_path, fault, wait_for, hold=False, blocked=4):
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        RL_LOOP,
        "--fault",
        fault,
        "--address",
        cluster.address,
        "--spread",
        "--timeout-s",
        str(TIMEOUT_S),
        "--runtime-env-json",
        json.dumps(_runtime_env(run_dir)),
    ]
    if hold:
        argv += ["--hold-s", "120"]
    drv = Driver(argv, _driver_env(), str(tmp_path / "driver.log"))
    try:
        drv.wait_line(wait_for, timeout=120)
        if blocked:
            wait_blocked(str(run_dir), blocked)
        wait_quiet(str(run_dir))
        d = dump_ray(run_dir, cluster.address)
        print("%s: %s %s in %.1f s: %s" % (fault, d["kind"], d["culprit_ranks"], d["_took_s"], d["summary"]))
        return d, drv.text(), run_dir
    finally:
        drv.stop()


def check_verdict(d, kind, culprit, actor_name, actor_class="Trainer"):
    assert d["kind"] == kind, json.dumps(
        {k: d[k] for k in ("kind", "culprit_ranks", "summary", "evidence")}, indent=1
    )
    assert d["culprit_ranks"] == [culprit], d["summary"]
    acts = d["details"]["culprit_actors"]
    assert [(a["rank"], a["class"], a["name"]) for a in acts] == [(culprit, actor_class, actor_name)], acts
    assert "%s '%s'" % (actor_class, actor_name) in d["summary"]
    # every rank is a named actor, collected from both nodes
    assert sorted(d["details"]["ray_actors"]) == ["0", "1", "2", "3", "4"]
    with open(os.path.join(d["snapshot"], "ray_nodes.json")) as f:
        nodes = json.load(f)
    assert len(nodes) == 2 and all(n["rings"] for n in nodes), nodes
    nodes_of_actors = {a["node_id"] for a in d["details"]["ray_actors"].values()}
    assert nodes_of_actors == {n["node_id"] for n in nodes}


# --- activation, identity, method phases -------------------------------------------------------

PLAIN_DRIVER = r"""
import asyncio, json, os, sys, time
import ray

@ray.remote
class Plain:
    def __init__(self, x):
        self.x = x
    def add(self, y):
        return self.x + y
    def boom(self):
        raise ValueError("bad input")

@ray.remote(max_concurrency=3)
class Threaded:
    def nap(self, t):
        time.sleep(t)
        return t

@ray.remote
class Async:
    async def nap(self, t):
        await asyncio.sleep(t)
        return t

ray.init(address=sys.argv[1])   # no runtime_env here: it comes from RAY_JOB_CONFIG_JSON_ENV_VAR
p = Plain.options(name="plain-1").remote(1)
th = Threaded.options(name="threaded-1").remote()
a = Async.options(name="async-1").remote()
fb = Plain.options(name="fallback-1", runtime_env={"env_vars": {"HANGTRACE_RAY_HOOK": "class"}}).remote(5)
off = Plain.options(name="off-1", runtime_env={"env_vars": {"HANGTRACE_RAY_HOOK": "off"}}).remote(7)
assert ray.get(p.add.remote(2)) == 3 and ray.get(fb.add.remote(1)) == 6 and ray.get(off.add.remote(1)) == 8
try:
    ray.get(p.boom.remote())
except ray.exceptions.RayTaskError:
    pass
assert ray.get([th.nap.remote(0.3), th.nap.remote(0.2), th.nap.remote(0.1)]) == [0.3, 0.2, 0.1]
assert ray.get([a.nap.remote(0.3), a.nap.remote(0.1)]) == [0.3, 0.1]
print("JOB", ray.get_runtime_context().get_job_id(), flush=True)
print("HANGTRACE in driver:", "hangtrace" in sys.modules, flush=True)
"""


def _phases(proc):
    return [
        (r["kind"], r["phase"], r["state"])
        for r in proc.records
        if r["kind"] in ("phase_enter", "phase_exit")
    ]


def test_env_vars_activate_unmodified_actors_with_identity_and_method_phases(cluster, tmp_path):
    run_dir = tmp_path / "run"
    env = _driver_env()
    # what `ray job submit --runtime-env-json` does for the entrypoint: the job config in
    # RAY_JOB_CONFIG_JSON_ENV_VAR, merged by ray.init into the job's runtime env
    env["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps({"runtime_env": _runtime_env(run_dir)})
    r = subprocess.run(
        [sys.executable, "-c", PLAIN_DRIVER, cluster.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("JOB ", 1)[1].split()[0]
    assert "HANGTRACE in driver: False" in r.stdout  # the driver itself is not traced
    procs = {p.meta.get("ray_actor_name"): p for p in load_run(str(run_dir)).processes}

    def named():
        ps = {p.meta.get("ray_actor_name"): p for p in load_run(str(run_dir), records=True).processes}
        return ps if "off-1" in ps else None

    procs = wait_until(named, timeout=15)  # the identity-only path records from a thread
    assert {"plain-1", "threaded-1", "async-1", "fallback-1"} <= set(procs), list(procs)
    node_ids = {n.node_id for n in cluster.list_all_nodes()}
    for name, cls in (
        ("plain-1", "Plain"),
        ("threaded-1", "Threaded"),
        ("async-1", "Async"),
        ("fallback-1", "Plain"),
    ):
        m = procs[name].meta
        assert m["ray_actor_class"] == cls and m["ray_job_id"] == job and m["ray_pid"] == procs[name].pid
        assert len(m["ray_actor_id"]) == 32 and m["ray_node_id"] in node_ids and m["ray_worker_id"]
    # which hook path ran: the private executor hook by default, the class fallback when forced
    assert procs["plain-1"].meta["ray_hook_path"] == "executor"
    assert procs["fallback-1"].meta["ray_hook_path"] == "class"
    # no actor-method hook at all: identity still recorded (public runtime context), no phases
    assert procs["off-1"].meta["ray_hook_path"] == "identity-only"
    assert procs["off-1"].meta["ray_job_id"] == job and procs["off-1"].meta["ray_actor_id"]
    assert _phases(procs["off-1"]) == []
    for name in ("plain-1", "fallback-1"):
        ph = _phases(procs[name])
        assert ph[:4] == [
            ("phase_enter", "__init__", "completed"),
            ("phase_exit", "__init__", "completed"),
            ("phase_enter", "add", "completed"),
            ("phase_exit", "add", "completed"),
        ], ph
    assert ("phase_exit", "boom", "failed") in _phases(procs["plain-1"])
    err = [r for r in procs["plain-1"].records if r["kind"] == "phase_exit" and r["phase"] == "boom"]
    assert "ValueError: bad input" in (err[0]["error"] or "")
    # threaded: three overlapping calls on three threads, each exit names its own method
    th = [r for r in procs["threaded-1"].records if r["phase"] == "nap" and r["kind"].startswith("phase")]
    assert sorted(r["kind"] for r in th) == ["phase_enter"] * 3 + ["phase_exit"] * 3
    assert len({r["thread"] for r in th}) == 3
    # async: two overlapping coroutines; both enters come before both exits
    an = [
        r["kind"] for r in procs["async-1"].records if r["phase"] == "nap" and r["kind"].startswith("phase")
    ]
    assert an == ["phase_enter", "phase_enter", "phase_exit", "phase_exit"], an


def test_env_ray_prints_runtime_env_fragment(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "hangtrace", "env", "--ray", "--dir", str(tmp_path)],
        env=_driver_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    frag = json.loads(r.stdout)
    assert frag["env_vars"]["HANGTRACE"] == "1" and frag["env_vars"]["HANGTRACE_DIR"] == str(tmp_path)
    assert frag["env_vars"]["HANGTRACE_RUN_ID"]


# --- rl_loop faults, collected on both nodes ------------------------------------------------------


@pytest.fixture(scope="module")
def cp_extra(cluster, tmp_path_factory):
    """(verdict, driver log, run dir) of rl_loop's cp-extra-microbatch fault (run once: two tests)."""
    return run_fault(
        cluster, tmp_path_factory.mktemp("cp"), "cp-extra-microbatch", "step 2: actor_train start"
    )


def test_cp_extra_microbatch(cp_extra):
    d, log, run_dir = cp_extra
    check_verdict(d, "skipped-collective", 1, "trainer-1")
    assert d["phase"] == "train_step" and d["step"] == 2
    # actor method phases in the records of the culprit
    procs = {p.rank: p for p in load_run(str(run_dir), records=True).processes}
    names = [r["phase"] for r in procs[1].records if r["kind"] == "phase_enter"]
    assert names[:2] == ["__init__", "address"] or names[0] == "__init__"
    assert {"setup", "train_step", "sync_weights"} <= set(names)
    assert {"setup", "generate", "receive_weights"} <= {
        r["phase"] for r in procs[4].records if r["kind"] == "phase_enter"
    }
    # issue 11: the snapshot's timeline names every track with its Ray actor, the culprit marked
    tls = sorted(glob.glob(os.path.join(str(run_dir), "snapshots", "*", "timeline.json")))
    assert tls, os.listdir(os.path.join(str(run_dir), "snapshots"))
    with open(tls[-1]) as f:
        tracks = [
            e["args"]["name"]
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "process_name"
        ]
    assert any(t.startswith("CULPRIT rank 1 ") and t.endswith("trainer-1") for t in tracks), tracks
    assert any(t.startswith("rank 0 ") and t.endswith("trainer-0") for t in tracks), tracks
    assert sum(t.startswith("CULPRIT") for t in tracks) == 1, tracks


def test_cp_extra_microbatch_timeline_in_the_browser(cp_extra):
    """issue 41: the Perfetto UI the docs document imports every event of the incident's
    timeline (slices, counters, flow arrows; no import error)."""
    from viewer import check_in_browser

    _d, _log, run_dir = cp_extra
    tls = sorted(glob.glob(os.path.join(str(run_dir), "snapshots", "*", "timeline.json")))
    assert tls, os.listdir(os.path.join(str(run_dir), "snapshots"))
    r = check_in_browser(tls[-1])[tls[-1]]
    assert r["ok"], json.dumps(r, indent=1)
    assert r["viewer"]["slice"] > 0 and r["viewer"]["flow"] > 0 and r["viewer"]["counter"] > 0
    assert any(n.startswith("CULPRIT rank 1 ") for n in r["process_names"]), r["process_names"]


def test_sync_order_is_cross_group_deadlock(cluster, tmp_path):
    d, log, _ = run_fault(cluster, tmp_path, "sync-order", "step 2: actor_train start")
    check_verdict(d, "cross-group-deadlock", 2, "trainer-2")
    assert d["op"] == "broadcast"


def test_rank0_checkpoint(cluster, tmp_path):
    d, log, _ = run_fault(cluster, tmp_path, "rank0-checkpoint", "step 3: actor_train start")
    # trainer 0 alone in the checkpoint's all_reduce on 'train'; trainers 1-3 went on to the
    # next train step's all_gather at the same seq: a different op, 3 against 1
    check_verdict(d, "collective-mismatch", 0, "trainer-0")
    assert d["phase"] == "checkpoint" and d["step"] == 2 and d["op"] == "all_reduce"


def test_kill_trainer_dead_rank_with_rays_death_cause(cluster, tmp_path):
    d, log, _ = run_fault(cluster, tmp_path, "kill-trainer", "holding the actors", hold=True, blocked=0)
    check_verdict(d, "dead-rank", 1, "trainer-1")
    assert d["cause"] == "killed-without-record"  # hangtrace's own evidence
    says = d["details"]["ray_says"]["1"]
    assert "worker process has died" in says["text"]  # Ray's text, reported as Ray's
    assert says["actor_state"] == "DEAD" and says["exit_type"]
    assert any(e.startswith("rank 1: Ray says: ") for e in d["evidence"])
    assert 'Ray says (rank 1): "' in d["summary"]
    # no dashboard on this cluster: the public state API fails, the GCS tables answer
    with open(os.path.join(d["snapshot"], "ray_state.json")) as f:
        st = json.load(f)
    assert st["source"] == "gcs" and "state-api" in st["errors"][0]


def _pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_node_watcher_stall_collects_on_every_node(cluster, tmp_path):
    """Auto-watch on: the first traced worker of the host starts the node watcher (with its
    cluster's GCS address); the watcher detects the stall itself and collects on both nodes
    through Ray tasks, like `dump --ray`."""
    import socket

    run_dir = tmp_path / "run"
    rte = _runtime_env(run_dir, HANGTRACE_AUTO_WATCH="1", HANGTRACE_STALL_S="6")
    argv = [
        sys.executable,
        RL_LOOP,
        "--fault",
        "cp-extra-microbatch",
        "--address",
        cluster.address,
        "--spread",
        "--timeout-s",
        str(TIMEOUT_S),
        "--runtime-env-json",
        json.dumps(rte),
    ]
    wlog = run_dir / ("watcher-%s.log" % socket.gethostname())
    wpid = None
    t0 = time.time()
    drv = Driver(argv, _driver_env(), str(tmp_path / "driver.log"))
    try:
        drv.wait_line("step 2: actor_train start", timeout=120)
        t_hang = time.time()

        def verdict():
            text = wlog.read_text() if wlog.exists() else ""
            return text if "snapshot: " in text else None

        text = wait_until(verdict, timeout=60, period=0.25)
        t_verdict = time.time()
        wpid = int((run_dir / ("watcher-%s.pid" % socket.gethostname())).read_text())
        # one watcher per host and run, although the host runs two Ray nodes
        assert text.count("watcher started") == 1, text
        assert [n for n in os.listdir(run_dir) if n.startswith("watcher-") and n.endswith(".pid")] == [
            "watcher-%s.pid" % socket.gethostname()
        ]
        started = [
            ln for ln in (run_dir / "hangtrace.log").read_text().splitlines() if "started node watcher" in ln
        ]
        assert len(started) == 1 and "RAY_ADDRESS %s" % cluster.address in started[0], started
        assert "stall: no progress" in text
        assert "cluster-wide collection (Ray at %s): 2 node(s), 5 process(es)" % cluster.address in text, text
        sdir = text.split("snapshot: ", 1)[1].split()[0]
        assert sdir.endswith("-ray") and os.path.exists(os.path.join(sdir, "ray_state.json"))
        with open(os.path.join(sdir, "processes.json")) as f:
            assert json.load(f)["reason"] == "stall"
        with open(os.path.join(sdir, "diagnosis.json")) as f:
            d = json.load(f)
        d["snapshot"] = sdir
        check_verdict(d, "skipped-collective", 1, "trainer-1")
        assert d["phase"] == "train_step" and d["step"] == 2
        print(
            "watcher verdict %.1f s after the hang (%.1f s from start): %s"
            % (t_verdict - t_hang, t_verdict - t0, d["summary"])
        )
    finally:
        if wpid and _pid_alive(wpid):
            os.kill(wpid, signal.SIGTERM)  # before the job ends: no second (death) collection
            try:
                wait_until(lambda: not _pid_alive(wpid), timeout=10, period=0.1)
            except Exception:
                os.kill(wpid, signal.SIGKILL)
        drv.stop()


# --- the Ray-state join, on plain data ---------------------------------------------------------------


def test_raystate_join_by_actor_id_then_pid_and_death_text():
    from hangtrace.tracer.snapshot import ProcessInfo
    from hangtrace.tracer.collect.ray.rayjoin import death_text, joined

    cause = {
        "actor_died_error_context": {
            "error_message": "The actor is dead because its worker process has died.",
            "pid": 11,
        }
    }
    state = {
        "source": "gcs",
        "actors": [
            {
                "actor_id": "a1",
                "class_name": "Trainer",
                "name": "trainer-1",
                "state": "DEAD",
                "pid": 11,
                "node_id": "n1",
                "death_cause": cause,
                "death_text": death_text(cause),
            },
            {
                "actor_id": "a2",
                "class_name": "Rollout",
                "name": "rollout",
                "state": "ALIVE",
                "pid": 12,
                "node_id": "n2",
                "death_cause": None,
                "death_text": None,
            },
        ],
        "workers": [
            {
                "worker_id": "w1",
                "pid": 11,
                "node_id": "n1",
                "is_alive": False,
                "exit_type": "SYSTEM_ERROR",
                "exit_detail": "connection error code 2",
            }
        ],
    }
    by_id = ProcessInfo(host="h", pid=99, meta={"ray_actor_id": "a1", "ray_node_id": "n1"})
    by_pid = ProcessInfo(host="h", pid=12, meta={"ray_pid": 12, "ray_node_id": "n2"})
    wrong_node = ProcessInfo(host="h", pid=12, meta={"ray_pid": 12, "ray_node_id": "n9"})
    not_ray = ProcessInfo(host="h", pid=11, meta={})
    (by_id, by_pid, wrong_node, not_ray), n = joined([by_id, by_pid, wrong_node, not_ray], state)
    assert n == 2
    assert by_id.meta["ray_death"].startswith("The actor is dead") and by_id.meta["ray_actor_state"] == "DEAD"
    assert by_id.meta["ray_actor_class"] == "Trainer" and by_id.meta["ray_actor_name"] == "trainer-1"
    assert by_pid.meta["ray_actor_class"] == "Rollout" and "ray_death" not in by_pid.meta
    assert "ray_actor_state" not in wrong_node.meta and not_ray.meta == {}
    assert death_text({"creation_task_failure_context": {"error_message": "boom"}}) == "boom"
    assert death_text(None) is None
