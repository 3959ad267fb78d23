"""Memory sampling and analysis (issue 5): cgroup parsing, the sampler writing real ring
records, ledger / kept-across flags / trends, and every dead-rank attribution class on
synthetic processes (kernel lines, cgroup counters and Ray records are plain data here;
the real cgroup OOM kill is in tests/integration/test_memory.py)."""

import json

import pytest

from synth import MS, S, T0, R, ranks, snap
from hangtrace.hooks.mem import cgroup as HC
from hangtrace.hooks.mem import sampler as HS
from hangtrace.tracer import api
from hangtrace.tracer.analyze import memory as M
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as RD
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.report.text import diagnosis_json, text_report

MIB = 1 << 20
GIB = 1 << 30


# --- synthetic memory records (as tracer.format.decode_slots returns them) ----------------
def mem(b, source, what="host", a=(-1, -1, -1, -1, -1), phase=None, step=None, thread="MainThread"):
    b.idx += 1
    b.t += MS
    b.records.append(
        {
            "idx": b.idx,
            "kind": "memory",
            "op": F.OPS[getattr(F, "MEM_" + source.upper())],
            "group": what,
            "seq": 0,
            "dtype": "",
            "numel": 0,
            "shape": None,
            "peer": -1,
            "async_op": False,
            "batch": False,
            "thread": thread,
            "phase": phase,
            "step": step,
            "t_mono_ns": b.t - T0,
            "t_wall_ns": b.t,
            "t_end_mono_ns": b.t - T0,
            "state": "completed",
            "error": None,
            "a": tuple(a),
        }
    )


def host(rss, usage=None, limit=0, oom=0):
    return (rss, 0, rss if usage is None else usage, limit, oom)


def loop(b, steps, phases, value, what="host", pack=host):
    """Phase enter/exit samples for ``steps``: ``value(step, phase, 'in'|'out')`` -> bytes."""
    for st in steps:
        mem(b, "step", what, pack(value(st, phases(st)[0], "in")), step=st)
        for ph in phases(st):
            mem(b, "enter", what, pack(value(st, ph, "in")), phase=ph, step=st)
            mem(b, "exit", what, pack(value(st, ph, "out")), phase=ph, step=st)
        b.step = st


# --- cgroup files -------------------------------------------------------------------------
def test_cgroup_paths_v1_v2_and_namespaces():
    cg = "4:memory:/process_api/abc\n0::/\n"
    mi = (
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert HC.parse_proc_cgroup(cg) == ("/process_api/abc", "/")
    c = HC.cgroup_candidates(cg, mi)
    assert c[0] == (1, "/sys/fs/cgroup/memory/process_api/abc") and (2, "/sys/fs/cgroup/unified") in c
    # v2 only, inside a cgroup namespace whose mount root is the job's cgroup
    c = HC.cgroup_candidates("0::/job/x\n", "40 1 0:40 /job /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert c[0] == (2, "/sys/fs/cgroup/x")
    assert HC.parse_limit(b"9223372036854771712\n") == 0 and HC.parse_limit(b"max\n") == 0
    assert HC.parse_limit(b"471859200\n") == 471859200
    assert HC.parse_oom_kill(b"oom_kill_disable 0\nunder_oom 0\noom_kill 2\n") == 2
    assert HC.parse_oom_kill(b"low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n") == 1
    assert HC.parse_oom_kill("oom_kill 5") == 5 and HC.parse_oom_kill(b"nothing 1") == -1


def test_kernel_oom_line_parsing():
    from hangtrace.tracer.collect.memfacts import parse_kernel_oom

    k = parse_kernel_oom(
        [
            (
                2672.67,
                "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                "oom_memcg=/hangtrace-test-1,task_memcg=/hangtrace-test-1,task=python3,pid=28926,uid=0",
            ),
            (
                2672.68,
                "Memory cgroup out of memory: Killed process 28926 (python3) total-vm:221448kB, "
                "anon-rss:207344kB, file-rss:6596kB, shmem-rss:0kB, UID:0 pgtables:464kB oom_score_adj:0",
            ),
            (10.0, "Out of memory: Killed process 77 (java) total-vm:1kB, anon-rss:8kB, file-rss:0kB"),
        ]
    )
    assert k[28926]["anon_rss"] == 207344 * 1024 and k[28926]["scope"] == "cgroup"
    assert k[28926]["memcg"] == "/hangtrace-test-1"
    assert k[77]["scope"] == "host"


# --- the sampler writes real records --------------------------------------------------------
@pytest.fixture
def recorder(tmp_path):
    from hangtrace.hooks.bootstrap import RunLog
    from hangtrace.hooks.record.recorder import Recorder

    rec = Recorder(str(tmp_path), "t", 1024, RunLog(str(tmp_path)))
    yield rec
    rec.close()


def test_sampler_records_host_gauges_and_cuda_oom_stand_in(recorder, tmp_path, monkeypatch):
    s = HS.Sampler(recorder, recorder.log, 1.0, str(tmp_path))
    monkeypatch.setattr(api, "_gauges", {})
    api._gauges["pool"] = (lambda: 5 * MIB, 8 * MIB)
    api._gauges["bad"] = (lambda: 1 / 0, None)  # raising gauges are skipped, never raised
    recorder.phase_enter("train", step=3)
    s.sample(F.MEM_ENTER)
    # Stand-in for the GPU path (no GPU here): call the allocator's out-of-memory observer
    # the way torch's CUDACachingAllocator would (device, bytes requested, device
    # allocated, device free). It records the event and a MEM_OOM sample.
    s.on_cuda_oom(0, 2 * GIB, 15 * GIB, 100 * MIB)
    s.tick()
    ring = RD.read_ring(recorder.path)
    ss = M.samples(ring.records)
    hs = [x for x in ss if x["what"] == "host"]
    assert hs[0]["source"] == "phase_enter" and hs[0]["phase"] == "train" and hs[0]["step"] == 3
    assert hs[0]["values"]["rss"] > 10 * MIB
    g = [x for x in ss if x["what"] == "gauge:pool"]
    assert g and g[0]["values"]["gauge:pool"] == 5 * MIB and g[0]["limits"]["gauge:pool"] == 8 * MIB
    assert not [x for x in ss if x["what"] == "gauge:bad"]
    oom = [x for x in ss if x["source"] == "oom"]
    assert (
        oom[0]["what"] == "cuda:0" and oom[0]["requested"] == 2 * GIB and oom[0]["device_free"] == 100 * MIB
    )
    ev = [e for e in ring.events if e["event"] == "cuda_oom"]
    assert ev and ev[0]["phase"] == "train" and ev[0]["step"] == 3
    if s.cg_dir:  # this host has a readable memory cgroup
        assert hs[0]["values"]["cgroup"] > 0 and hs[0]["oom_kills"] is not None
    assert ring.meta.get("mem_cgroup") == s.cg_dir
    # the OOM attributed from these records alone
    from hangtrace.tracer.collect.ringprocs import process_from_ring

    p = process_from_ring(ring, state="killed")
    a = M.attribute(p, "killed-without-record", "x")
    assert a["cause"] == "cuda-oom" and "2.0 GiB requested" in a["cause_text"]


def test_cuda_sampling_once_torch_has_initialised_cuda(recorder, tmp_path, monkeypatch):
    """hooks/mem/memcuda.py is used (and imported) only once ``torch.cuda.is_initialized()``:
    a stand-in torch with one device gets its figures sampled and the allocator's OOM
    observer attached at the next tick."""
    import sys
    import types

    observers = []
    cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        device_count=lambda: 1,
        mem_get_info=lambda d: (3 * GIB, 16 * GIB),
        memory_allocated=lambda d: 5 * GIB,
        memory_reserved=lambda d: 6 * GIB,
        max_memory_allocated=lambda d: 7 * GIB,
    )
    torch = types.SimpleNamespace(
        cuda=cuda, _C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append)
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    s = HS.Sampler(recorder, recorder.log, 1.0, str(tmp_path))
    assert not s._cuda and not observers  # CUDA not initialised: nothing
    cuda.is_initialized = lambda: True
    s.tick()
    s.sample(F.MEM_STEP)
    assert observers == [s.on_cuda_oom]
    observers[0](0, 2 * GIB, 15 * GIB, 100 * MIB)
    ss = M.samples(RD.read_ring(recorder.path).records)
    dev = [x for x in ss if x["what"] == "cuda:0" and x["source"] != "oom"]
    assert dev and dev[-1]["values"]["cuda:0 allocated"] == 5 * GIB and dev[-1]["device_total"] == 16 * GIB
    assert [x for x in ss if x["what"] == "cuda:0" and x["source"] == "oom"][0]["requested"] == 2 * GIB


def test_oom_exception_leaving_a_phase_is_sampled_once(recorder, monkeypatch):
    s = HS.Sampler(recorder, recorder.log, 1.0)
    monkeypatch.setattr(api, "_recorder", recorder)
    monkeypatch.setattr(api, "_sampler", s)
    with pytest.raises(MemoryError):
        with api.phase("outer", step=1):
            with api.phase("wake_up"):
                raise MemoryError("pool")
    ss = M.samples(RD.read_ring(recorder.path).records)
    assert [x["phase"] for x in ss if x["source"] == "oom"] == ["wake_up"]
    assert [x["source"] for x in ss] == ["phase_enter", "phase_enter", "oom", "phase_exit", "phase_exit"]


def test_gauge_is_a_noop_without_tracing(monkeypatch):
    monkeypatch.setattr(api, "_recorder", None)
    monkeypatch.setattr(api, "_gauges", {})
    assert api.gauge("x", lambda: 1) is None and api._gauges == {}


# --- ledger, kept-across flags, trends ------------------------------------------------------
def kept_case(b):
    """validation every 2, checkpoint every step; the checkpoint keeps the validation cache."""
    level = {"v": 0}

    def phases(st):
        return (
            ["wake_up", "rollout", "sleep", "train"]
            + (["validation"] if st % 2 == 0 else [])
            + ["checkpoint"]
        )

    def value(st, ph, io):
        if ph == "wake_up" and io == "out":
            return level["v"] + 6 * GIB
        if ph == "rollout":
            return level["v"] + 6 * GIB
        if ph == "sleep" and io == "in":
            return level["v"] + 6 * GIB
        if ph == "validation" and io == "out":
            level["v"] += GIB
        return level["v"]

    loop(b, range(1, 7), phases, value, what="gauge:kv_pool", pack=lambda v: (v, 8 * GIB, -1, -1, -1))


def test_kept_across_names_steps_phase_sequence_and_bytes():
    b = R(0, 1)
    kept_case(b)
    ss = M.samples(b.build().records)
    rows = M.ledger(ss, 0)
    flags = M.kept_across(rows, 0)
    assert len(flags) == 1
    f = flags[0]
    assert f["metric"] == "gauge:kv_pool"
    assert f["kept_steps"] == [2, 4] and f["released_steps"] == [1, 3, 5]  # step 6 is the newest
    assert f["grown_in"] == "validation" and f["sequence"] == ["validation", "checkpoint"]
    assert f["bytes_kept"] == {"2": GIB, "4": GIB} and f["only_in_kept_steps"] == ["validation"]
    assert f["periods"] == {"validation": 2, "checkpoint": 1}
    assert f["carried_into"][0] == {"step": 3, "phase": "wake_up", "enter": GIB}


def test_steady_growth_trend_and_projection():
    b = R(0, 1)
    loop(
        b,
        range(1, 9),
        lambda st: ["rollout", "train"],
        lambda st, ph, io: (
            200 * MIB + (st - 1) * 20 * MIB + (20 * MIB if (ph, io) == ("train", "out") else 0)
        ),
        pack=lambda v: host(v, v, 400 * MIB),
    )
    ss = M.samples(b.build().records)
    rows = M.ledger(ss)
    t = M.trend(ss, rows, "cgroup")
    assert t["steady"] and t["bytes_per_step"] == 20 * MIB and t["growing_phase"] == "train"
    assert t["phase_growth"] == {"rollout": 0, "train": 20 * MIB}
    assert t["projected_limit_step"] == 8 + 3  # 340 MiB at step 8, 60 MiB to go
    assert M.kept_across(rows) == []  # every step keeps: a trend, not a flag
    lines = M.watch_lines(b.build().records, "rank 0 (pid 1)")
    assert lines and "grows 20.0 MiB/step" in lines[0][1] and "phase 'train'" in lines[0][1]


# --- attribution of dead ranks ----------------------------------------------------------------
def dead_job(setup, samples=True, limit=400 * MIB, level=390 * MIB, oom=0, world=3):
    """Rank 1 dies; the others wait for it later. ``setup``: ProcessInfo fields of rank 1."""
    b = ranks(world)
    if samples:
        mem(b[1], "timer", "host", host(level, level, limit, oom), phase="train", step=7)
    for r in range(world):
        if r != 1:
            b[r].t += 20 * S
            b[r].wait()
    b[1].set(**setup)
    return diagnose(snap(b))


KERNEL = {
    "line": "Memory cgroup out of memory: Killed process 1001 (python3) total-vm:1kB, anon-rss:409600kB",
    "anon_rss": 400 * MIB,
    "scope": "cgroup",
    "mono_s": 1.0,
}


def test_host_oom_kill_from_kernel_line():
    d = dead_job(dict(state="killed", memory_facts={"kernel_oom": KERNEL, "kernel_log": "read"}))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "host-oom-kill")
    a = d.details["memory"]["attribution"]["1"]
    assert (a["at_death"]["phase"], a["at_death"]["step"]) == ("train", 7)
    assert a["base_cause"] == "killed-without-record" and a["at_death"]["limit"] == 400 * MIB
    assert any("98%" in e for e in d.evidence), d.evidence
    assert "Killed process 1001" in d.details["cause_text"]


def test_host_oom_kill_from_cgroup_counter():
    d = dead_job(
        dict(
            state="killed",
            memory_facts={
                "cgroup_dir": "/sys/fs/cgroup/memory/x",
                "cgroup_oom_kill_now": 1,
                "kernel_log": "unreadable",
            },
        )
    )
    assert d.cause == "host-oom-kill"
    assert any("oom_kill 0 at the last sample, 1 now" in e for e in d.evidence), d.evidence


def test_sigkill_without_oom_evidence_says_not_a_host_oom_kill():
    d = dead_job(
        dict(state="killed", memory_facts={"cgroup_oom_kill_now": 0, "kernel_log": "read"}), level=100 * MIB
    )
    assert d.cause == "killed-without-record"
    assert any(
        e.startswith("rank 1: not a host OOM-kill: its cgroup's oom_kill counter is unchanged (0)")
        for e in d.evidence
    ), d.evidence


def test_ray_memory_monitor_from_rays_record_only():
    d = dead_job(
        dict(
            state="killed",
            meta={
                "ray_actor_class": "Trainer",
                "ray_exit_type": "NODE_OUT_OF_MEMORY",
                "ray_death": "Task was killed due to the node running low on memory.",
            },
        )
    )
    assert d.cause == "ray-memory-monitor"
    # the brief's dict form of ray_death is consumed too
    d = dead_job(
        dict(state="killed", meta={"ray_death": {"death_cause": {"oom_context": {"error_message": "x"}}}})
    )
    assert d.cause == "ray-memory-monitor"
    # Ray's generic guess is not evidence
    d = dead_job(
        dict(
            state="killed",
            meta={
                "ray_death": "The actor is dead because its worker process has died. ... may have exceeded K8s pod "
                "memory limits ...",
                "ray_exit_type": "SYSTEM_ERROR",
            },
        ),
        level=50 * MIB,
    )
    assert d.cause == "killed-without-record"


def test_cuda_oom_from_the_exception():
    ev = [
        {
            "event": "exception",
            "type": "OutOfMemoryError",
            "wall_ns": T0 + 10 * S,
            "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
        }
    ]
    d = dead_job(dict(state="exited", exit_code=1, events=ev), samples=False)
    assert d.cause == "cuda-oom" and "Tried to allocate 2.00 GiB" in d.details["cause_text"]


def test_external_sigterm_with_low_memory_is_not_an_oom():
    d = dead_job(
        dict(
            state="killed",
            exit_code=-15,
            signals={"sigterm": {"wall_ns": T0 + 10 * S, "text": ""}},
            memory_facts={"cgroup_oom_kill_now": 0},
        ),
        level=80 * MIB,
    )
    assert d.cause == "sigterm-external"
    assert "not an OOM" in d.details["cause_text"] and "not an OOM" in d.summary
    assert "20%" in d.details["cause_text"]


def test_sigterm_near_the_limit_stays_sigterm_with_a_pressure_note():
    d = dead_job(
        dict(state="killed", signals={"sigterm": {"wall_ns": T0 + 10 * S, "text": ""}}), level=395 * MIB
    )
    assert d.cause == "sigterm"
    assert any("memory-pressure eviction" in e for e in d.evidence)


@pytest.mark.parametrize(
    "setup,cause",
    [
        (
            dict(
                state="exited",
                exit_code=1,
                events=[
                    {"event": "exception", "type": "ValueError", "message": "bad", "wall_ns": T0 + 10 * S}
                ],
            ),
            "exception",
        ),
        (
            dict(
                state="killed",
                signals={"fatal": {"wall_ns": T0 + 10 * S, "text": "Fatal Python error: Aborted\n"}},
            ),
            "fatal-signal",
        ),
        (dict(state="exited", exit_code=3), "exit-code 3"),
    ],
)
def test_other_causes_keep_their_cause_and_get_memory_figures(setup, cause):
    d = dead_job(setup, level=100 * MIB)
    assert d.cause == cause
    assert any("memory at death: cgroup usage 100.0 MiB of limit 400.0 MiB (25%)" in e for e in d.evidence), (
        d.evidence
    )


def test_ledger_and_flag_in_text_report_and_json():
    b = ranks(2)
    kept_case(b[0])
    b[0].set(
        state="exited",
        exit_code=1,
        events=[
            {
                "event": "exception",
                "type": "OutOfMemoryError",
                "message": "CUDA out of memory (stand-in)",
                "wall_ns": b[0].t + MS,
            }
        ],
    )
    mem(b[0], "oom", "gauge:kv_pool", (8 * GIB, 8 * GIB, -1, -1, -1), phase="wake_up", step=7)
    b[0].phase, b[0].step = None, 7  # the exception left every phase (header: no phase)
    b[1].t += 60 * S
    b[1].wait()
    s = snap(b)
    d = diagnose(s)
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [0], "cuda-oom")
    assert (d.phase, d.step) == ("wake_up", 7)
    assert "kept across validation -> checkpoint on steps 2, 4" in d.summary
    txt = text_report(d, s)
    assert "Ledger (memory just after entering" in txt
    assert any(
        ln.split()[:3] == ["0", "2", "validation"] and ln.rstrip().endswith("!") for ln in txt.splitlines()
    )
    j = json.loads(json.dumps(diagnosis_json(d)))
    m = j["details"]["memory"]
    assert m["kept_across"][0]["sequence"] == ["validation", "checkpoint"]
    assert {(r["step"], r["phase"]) for r in m["ledger"]} >= {(2, "validation"), (2, "checkpoint")}
    assert m["attribution"]["0"]["cause"] == "cuda-oom"


def test_no_memory_no_details():
    b = ranks(2)
    b[0].wait()
    b[1].set(state="killed")
    d = diagnose(snap(b))
    assert "memory" not in d.details and d.cause == "killed-without-record"


def test_deferred_timer_thread_waits_for_a_free_registry_lock_and_for_torch(recorder, tmp_path, monkeypatch):
    """hooks/mem/memclock.py: the gc clock starts the thread only past the interval, never while
    a module named torch is being imported, and never while ``threading``'s registry lock
    is held (a collection inside ``threading`` on this thread would deadlock on a plain
    Lock; CPython 3.11 has an RLock there, so a held plain Lock stands in for it)."""
    import gc
    import sys
    import threading
    import types
    from hangtrace.hooks.mem import memclock

    s = HS.Sampler(recorder, recorder.log, 0.05, str(tmp_path))
    held = threading.Lock()
    held.acquire()
    monkeypatch.setattr(threading, "_active_limbo_lock", held)
    fake = types.ModuleType("torch")
    fake.__spec__ = types.SimpleNamespace(_initializing=True)
    monkeypatch.setitem(sys.modules, "torch", fake)
    before = list(gc.callbacks)
    assert memclock.defer_thread(s) is True
    clock = [c for c in gc.callbacks if c not in before]
    assert len(clock) == 1 and s.thread is None
    try:
        import time

        time.sleep(0.06)  # past the interval
        clock[0]("start", {})
        assert s.thread is None  # torch's import is running
        fake.__spec__._initializing = False
        clock[0]("start", {})
        assert s.thread is None and clock[0] in gc.callbacks  # the registry lock is held: later
        held.release()
        monkeypatch.setattr(threading, "_active_limbo_lock", threading.RLock())
        clock[0]("start", {})
        assert s.thread is not None and s.thread.is_alive() and clock[0] not in gc.callbacks
    finally:
        if clock[0] in gc.callbacks:
            gc.callbacks.remove(clock[0])
        s.stop()
    assert not s.thread.is_alive()


@pytest.mark.parametrize(
    "facts,line,said",
    [
        (
            {
                "kernel_log": "read",
                "helper_kernel_oom": {
                    "pid": 4242,
                    "line": "Out of memory: Killed process 4242 (pt_data_worker)",
                },
            },
            "its DataLoader worker (pid 4242) was killed by the kernel's OOM killer: Out of memory: Killed process 4242 "
            "(pt_data_worker)",
            "Rank 1: its DataLoader worker (pid 4242) was killed by the kernel's OOM killer (kernel log). Next: find what "
            "the DataLoader worker holds on to",
        ),
        (
            {"kernel_log": "read"},
            "its DataLoader worker (pid 4242) was killed by SIGKILL (a helper of this rank): the kernel log has no "
            "OOM-killer line for it",
            "Rank 1: its DataLoader worker (pid 4242) was killed by SIGKILL, not by the kernel's OOM killer (the kernel "
            "log has no OOM-killer line for it). Next: find who sends SIGKILL",
        ),
        # blind job mp_dl_killed (a watchdog SIGKILLs a worker; plenty of memory): 'was it an OOM?' answered in the
        # paragraph, not only in the evidence
        (
            {"kernel_log": "read", "cgroup_oom_kill_now": 0},
            "its cgroup's oom_kill counter is unchanged (0); the kernel log has no OOM-killer line for it",
            "Rank 1: its DataLoader worker (pid 4242) was killed by SIGKILL, not by the kernel's OOM killer (its cgroup's "
            "oom_kill counter is unchanged (0); the kernel log has no OOM-killer line for it). Next: find who sends SIGKILL",
        ),
        (
            {},  # no kernel log, no counter: no claim either way
            "whether by the OOM killer is unknown here",
            None,
        ),
    ],
)
def test_a_rank_whose_dataloader_worker_was_killed_says_by_whom(facts, line, said):
    """torch raises 'DataLoader worker (pid N) is killed by signal: Killed.' in the rank
    (a blind job): the verdict says whether the kernel's OOM killer killed that worker."""
    b = ranks(2, steps=5)
    mem(b[1], "timer", "host", host(300 * MIB, oom=0), phase="train", step=0)
    b[1].set(
        state="exited",
        exit_code=1,
        memory_facts=facts,
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "message": "DataLoader worker (pid 4242) is killed by signal: Killed.",
            }
        ],
    )
    b[0].t += 20 * S
    b[0].wait()
    d = diagnose(snap(b))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "exception"), d.summary
    assert any(line in e for e in d.evidence), d.evidence
    if said:
        assert said in d.summary, d.summary
    else:
        assert "OOM killer" not in d.summary and "SIGKILL" not in d.summary, d.summary


def test_dataloader_kills_reads_both_of_torchs_messages_and_the_chain():
    """torch raises "DataLoader worker (pid(s) N, M) exited unexpectedly" *from* the SIGCHLD
    handler's "(pid N) is killed by signal: Killed." (a blind job: only the outer message
    was read); the traceback text holds both."""
    from hangtrace.tracer.collect.memfacts import dataloader_kills, exception_text

    chained = (
        "RuntimeError: DataLoader worker (pid 32027) is killed by signal: Killed. \n\nThe above exception "
        "was the direct cause of the following exception:\n...\nRuntimeError: DataLoader worker (pid(s) "
        "32027) exited unexpectedly\n"
    )
    assert dataloader_kills(chained) == [(32027, "Killed")]
    assert dataloader_kills("RuntimeError: DataLoader worker (pid(s) 32216, 32222) exited unexpectedly") == [
        (32216, None),
        (32222, None),
    ]
    assert dataloader_kills("DataLoader worker (pid 7) is killed by signal: Segmentation fault.") == [
        (7, "Segmentation fault")
    ]
    assert dataloader_kills("ValueError: bad batch") == [] and dataloader_kills(None) == []
    from hangtrace.tracer.snapshot import ProcessInfo

    ev = [
        {"event": "start"},
        {"event": "exception", "message": "m", "traceback": "tb"},
        {"event": "exception"},
    ]
    assert exception_text(ProcessInfo(host="h", pid=1, events=ev)) == "m\ntb"
    assert exception_text(ProcessInfo(host="h", pid=1, events=ev[:1])) == ""


def test_a_rank_whose_dataloader_worker_the_oom_killer_killed_says_whose_memory_grew():
    """The blind job tr_dl_oom: the outer message only names the pid; the worker kept a
    ring (its samples: RSS 200 -> 410 MiB, cgroup 350 of 400 MiB) and its facts hold the
    kernel's line. The verdict says the OOM killer killed the worker and how its memory
    grew; the rank's own (flat) memory comes last, as the rank's."""
    b = ranks(2, steps=5)
    for r in b:
        r.set(meta={"rank_source": 1, "ppid": 900})
    mem(b[1], "timer", "host", host(300 * MIB), phase="train", step=0)
    tb = (
        "Traceback ...\nRuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. \n\nThe above "
        "exception was the direct cause of the following exception:\n\nTraceback ...\nRuntimeError: DataLoader "
        "worker (pid(s) 4242) exited unexpectedly\n"
    )
    b[1].set(
        state="exited",
        exit_code=1,
        memory_facts={"kernel_log": "read"},
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "traceback": tb,
                "message": "DataLoader worker (pid(s) 4242) exited unexpectedly",
            }
        ],
    )
    w = R(1, 2, groups=[], pid=4242)
    for rss, usage in ((200, 10), (300, 150), (410, 350)):
        mem(w, "timer", "host", host(rss * MIB, usage * MIB, 400 * MIB))
        w.t += S
    line = (
        "Memory cgroup out of memory: Killed process 4242 (pt_data_worker) total-vm:1255852kB, "
        "anon-rss:423528kB, file-rss:21972kB"
    )
    w.set(
        state="killed",
        start_wall_ns=T0 + S,
        meta={"ppid": b[1].pid, "rank_source": 0},
        memory_facts={"kernel_log": "read", "cgroup_oom_kill_now": 1, "kernel_oom": {"line": line}},
    )
    b[0].t += 20 * S
    b[0].wait()
    sn = snap(b + [w])
    d = diagnose(sn)
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "exception"), d.summary
    assert "rank-helper of 1" in text_report(d, sn) and "killed (OOM killer)" in text_report(d, sn)
    assert (
        "its DataLoader worker (pid 4242) was killed by the kernel's OOM killer (kernel log: anon-rss "
        "413.6 MiB at the kill); the worker's memory: RSS 200.0 MiB -> 410.0 MiB in 2.0 s, cgroup usage "
        "350.0 MiB of limit 400.0 MiB (88%)" in d.summary
    ), d.summary
    assert any(e.endswith("was killed by the kernel's OOM killer: " + line) for e in d.evidence), d.evidence
    assert any("the rank's own memory at death: RSS 300.0 MiB" in e for e in d.evidence), d.evidence
    assert "Next: find what the DataLoader worker holds on to" in d.summary, d.summary


def test_sigterm_advice_only_for_the_rank_whose_sigterm_is_the_cause():
    """The root died of an exception; the launcher then SIGTERMed another rank (cascade):
    no "find who sent SIGTERM" for that one. A rank SIGTERMed from outside as the root keeps it."""
    b = ranks(3)
    for r in (1, 2):
        mem(b[r], "timer", "host", host(80 * MIB, 80 * MIB, 400 * MIB, 0), phase="train", step=7)
    b[0].t += 20 * S
    b[0].wait()
    b[1].set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "ValueError", "message": "bad", "wall_ns": T0 + 10 * S}],
    )
    b[2].set(
        state="killed",
        exit_code=-15,
        signals={"sigterm": {"wall_ns": T0 + 12 * S, "text": ""}},
        memory_facts={"cgroup_oom_kill_now": 0},
    )
    d = diagnose(snap(b))
    assert (d.kind, d.culprit_ranks) == ("dead-rank", [1]), d.summary
    assert any(c.get("rank") == 2 for c in d.cascade or ()), d.cascade
    advice = d.details["memory"]["advice"]
    assert not any("find who sent SIGTERM" in a for a in advice), advice
    root = dead_job(
        dict(
            state="killed",
            exit_code=-15,
            signals={"sigterm": {"wall_ns": T0 + 10 * S, "text": ""}},
            memory_facts={"cgroup_oom_kill_now": 0},
        ),
        level=80 * MIB,
    )
    assert any("find who sent SIGTERM to rank 1" in a for a in root.details["memory"]["advice"])


def test_a_rank_whose_dataloader_worker_crashed_in_native_code_says_where():
    """Blind helpers 90 and 93: a worker segfaults in a ctypes decode call; torch raises
    "DataLoader worker (pid N) is killed by signal: Segmentation fault." in the rank. With
    the worker's fatal-stack dump (hooks/process/workersignals.py keeps faulthandler on top of torch's
    handlers) the verdict says where the worker crashed, not its memory, and the rank's
    frames are where it noticed; the advice is about native code."""
    from hangtrace.tracer.report.advice import HELPER_CRASH_NEXT

    b = ranks(2, steps=5)
    for r in b:
        r.set(meta={"rank_source": 1, "ppid": 900})
    mem(b[1], "timer", "host", host(300 * MIB), phase="train", step=0)
    tb = (
        'Traceback (most recent call last):\n  File "/job/job.py", line 96, in worker\n    loss.backward()\n'
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Segmentation fault.\n"
    )
    b[1].set(
        state="exited",
        exit_code=1,
        memory_facts={"kernel_log": "read"},
        events=[
            {
                "event": "exception",
                "type": "RuntimeError",
                "wall_ns": b[1].t + MS,
                "traceback": tb,
                "message": "DataLoader worker (pid 4242) is killed by signal: Segmentation fault.",
            }
        ],
    )
    w = R(1, 2, groups=[], pid=4242)
    for rss in (15, 120, 223):  # (it grew while it loaded its data: nothing to do with the crash)
        mem(w, "timer", "host", host(rss * MIB))
        w.t += S
    dump = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f5d1ca3ab80 (most recent call first):\n"
        '  File "/job/job.py", line 76 in __getitem__\n'
        '  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 54 in fetch\n'
        '  File "/usr/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 374 in _worker_loop\n'
    )
    w.set(
        state="killed",
        start_wall_ns=T0 + S,
        meta={"ppid": b[1].pid, "rank_source": 0},
        signals={"fatal": {"wall_ns": w.t, "text": dump}},
    )
    b[0].t += 20 * S
    b[0].wait()
    d = diagnose(snap(b + [w]))
    assert (d.kind, d.culprit_ranks, d.cause) == ("dead-rank", [1], "exception"), d.summary
    assert (
        "Rank 1: its DataLoader worker (pid 4242) was killed by signal Segmentation fault in __getitem__ "
        "(job.py:76)."
    ) in d.summary, d.summary
    assert HELPER_CRASH_NEXT in d.summary and "the worker's memory" not in " ".join(d.evidence), d.evidence
    assert "it noticed it and raised in worker (job.py:96)" in d.summary, d.summary
