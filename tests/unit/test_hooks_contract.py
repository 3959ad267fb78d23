"""The in-process side's contracts: import direction, the instrumentor contract, our
post-import finder, the recorder choice, and small rings grown to full size (issue 8 item
3, issue 13 item 2)."""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import textwrap
import time

import pytest

from jobs import REPO, base_env

from hangtrace.hooks import importhook
from hangtrace.hooks.record import ringsize
from hangtrace.hooks.instrument import Instrumentor
from hangtrace.hooks.record.recorder import Recorder, choose, fast_available
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring.reader import read_ring

#: Code a traced process must never load: collection, analysis, rendering, watcher, CLI.
FORBIDDEN = (
    "hangtrace.tracer.collect",
    "hangtrace.tracer.analyze",
    "hangtrace.tracer.report",
    "hangtrace.tracer.watch",
    "hangtrace.tracer.pipeline",
    "hangtrace.cli",
)
HOOKS_DIR = os.path.join(REPO, "hangtrace", "hooks")


def _hooks_modules():
    found = []
    for dirpath, _dirs, files in os.walk(HOOKS_DIR):
        pkg = "hangtrace." + os.path.relpath(dirpath, os.path.dirname(HOOKS_DIR)).replace(os.sep, ".")
        found += [pkg + "." + f[:-3] for f in files if f.endswith(".py") and f != "__init__.py"]
    return sorted(found)


@pytest.mark.parametrize("module", _hooks_modules())
def test_hooks_module_loads_no_collection_analysis_report_or_watcher_code(module):
    code = "import sys, %s\nbad = [m for m in sys.modules if m.startswith(%r)]\nprint(repr(bad))" % (
        module,
        FORBIDDEN,
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=base_env(traced=False),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]", "%s loads %s" % (module, p.stdout)


class _Log:
    def __init__(self):
        self.lines = []
        self.seen = set()

    def __call__(self, msg, key=None):
        if key is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        self.lines.append(msg)


class _Runtime:
    def __init__(self):
        self.log = _Log()


class _Counting(Instrumentor):
    name = "counting"

    def __init__(self, fail=None):
        super().__init__()
        self.calls = []
        self.fail = fail

    def _step(self, what):
        self.calls.append(what)
        if self.fail == what:
            raise RuntimeError("boom in " + what)

    def _install(self, runtime):
        self._step("install")

    def _uninstall(self):
        self._step("uninstall")

    def _after_fork_child(self):
        self._step("fork")

    def _at_exit(self):
        self._step("exit")


def test_instrumentor_install_is_idempotent_and_warns_once_per_repeat():
    rt, ins = _Runtime(), _Counting()
    assert ins.install(rt) is True
    assert ins.install(rt) is False and ins.install(rt) is False
    assert ins.calls == ["install"]
    assert [ln for ln in rt.log.lines if "install called again" in ln] == [
        "instrumentor counting: install called again; nothing stacked"
    ]
    ins.after_fork_child()
    ins.at_exit()
    ins.uninstall()
    ins.uninstall()  # a second uninstall does nothing
    ins.at_exit()  # nor does anything after uninstall
    assert ins.calls == ["install", "fork", "exit", "uninstall"]
    assert ins.install(rt) is True  # a later install starts afresh


@pytest.mark.parametrize("what", ["install", "fork", "exit", "uninstall"])
def test_instrumentor_never_raises_and_logs_the_error_once(what):
    rt, ins = _Runtime(), _Counting(fail=what)
    ins.install(rt)
    for _ in range(3):
        ins.after_fork_child()
        ins.at_exit()
    ins.uninstall()
    errors = [ln for ln in rt.log.lines if "boom" in ln]
    assert len(errors) == 1 and ("boom in " + what) in errors[0], rt.log.lines


@pytest.mark.parametrize("pure", ["1", "0"])
def test_post_import_hook_fires_once_with_the_finished_module(tmp_path, monkeypatch, pure):
    monkeypatch.setenv("HANGTRACE_PURE_PYTHON", pure)
    pkg = tmp_path / "htpkg_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    pf = importlib.machinery.PathFinder
    try:
        importhook.when_imported(
            "htpkg_probe.mod",
            lambda m: seen.append((m.__name__, m.VALUE)),
            before=lambda name: seen.append(("before", name, hasattr(sys.modules.get(name), "VALUE"))),
        )
        wrapper = type(pf.__dict__["find_spec"].__func__).__name__
        assert wrapper == ("FindSpec" if pure == "0" and fast_available({}) else "function")
        # looked up, by position or keyword, not imported: no hook yet; unhooked names as before
        assert importlib.util.find_spec("htpkg_probe.mod") is not None and seen == []
        assert pf.find_spec(fullname="json").name == "json" and pf.find_spec("no_such_mod_x") is None
        with pytest.raises(TypeError):
            pf.find_spec("json", None, None, None)  # the original's own error comes through
        import htpkg_probe.mod as mod

        assert seen == [("before", "htpkg_probe.mod", False), ("htpkg_probe.mod", 42)]
        # the module keeps its own loader (nothing of ours left on it)
        assert type(mod.__loader__).__name__ == "SourceFileLoader"
        assert type(mod.__spec__.loader).__name__ == "SourceFileLoader"
        importhook.when_imported("htpkg_probe.mod", lambda m: seen.append("again"))  # imported: at once
        assert seen[-1] == "again"
    finally:
        importhook.clear()
        for name in ("htpkg_probe.mod", "htpkg_probe"):
            sys.modules.pop(name, None)
    assert type(pf.__dict__["find_spec"].__func__).__name__ == "function"  # the original is back


def test_recorder_choice_gives_its_reason():
    cls, why = choose({"HANGTRACE_PURE_PYTHON": "1"})
    assert cls is Recorder and why == "recorder: Python (HANGTRACE_PURE_PYTHON=1)"
    cls, why = choose({})
    if fast_available({}):
        assert why == "recorder: C (_fastrec)" and cls is not Recorder
    else:
        assert why.startswith("recorder: Python (_fastrec not built: ImportError")


@pytest.mark.parametrize("pure", ["1", "0"])
def test_small_ring_grows_to_full_ring_with_every_record(tmp_path, monkeypatch, pure):
    monkeypatch.setenv("HANGTRACE_PURE_PYTHON", pure)
    log = _Log()
    rec = Recorder(str(tmp_path), "grow", 16, log, full_slots=1024)
    rec.event("start", argv=["x"])
    sid = rec.intern("host")
    for i in range(40):  # wraps the 16-slot ring
        rec.memory(F.MEM_TIMER, sid, i, -1, -1, -1, -1)
    small = read_ring(rec.path)
    assert small.header["nslots"] == 16 and small.header["strtab_size"] == ringsize.SMALL_STRTAB_SIZE
    assert os.stat(rec.path).st_blocks * 512 <= 64 << 10  # kilobytes on disk
    assert [r["idx"] for r in small.records] == list(range(26, 42))

    rec.group_created({"op": "init_process_group", "member": True, "name": "0", "ranks": [0]})
    assert rec.nslots == 1024 and any(
        "ring grown to 1024 slots: joined process group 0" in ln for ln in log.lines
    )
    rec.complete(rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], rec.intern("0"), 1, 4, 0, 1, -1, 0))
    full = read_ring(rec.path)
    assert full.header["nslots"] == 1024 and full.header["strtab_size"] == F.DEFAULT_STRTAB_SIZE
    idxs = [r["idx"] for r in full.records]
    assert idxs == list(range(26, idxs[-1] + 1))  # what the small ring held, then the new ones
    assert full.records[-1]["op"] == "all_reduce" and full.records[-1]["state"] == "completed"
    assert [e["event"] for e in full.events] == ["start"] and full.groups[0]["name"] == "0"
    assert full.strings[sid] == "host"  # string ids stay valid
    assert full.header["pid"] == os.getpid() and full.header["progress_count"] >= 2
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]  # no temporary left
    assert rec.grow("again") is False  # once


def test_ray_actor_identity_grows_and_a_non_member_group_does_not(tmp_path):
    rec = Recorder(str(tmp_path), "g", 16, _Log(), full_slots=256)
    rec.group_created({"op": "new_group", "member": False, "name": None, "ranks": [1, 2]})
    assert rec.nslots == 16
    rec.set_meta(ray_job_id="01000000")
    assert rec.nslots == 16
    rec.set_meta(ray_actor_id="abc")  # the worker-level identity: the class comes with the first method
    assert rec.nslots == 16
    rec.set_meta(ray_actor_id="abc", ray_actor_class="Trainer", ray_actor_module="__main__")
    assert rec.nslots == 256 and read_ring(rec.path).meta["ray_actor_class"] == "Trainer"


def test_an_actor_of_rays_own_library_keeps_a_small_ring(tmp_path):
    """Ray Train's SynchronizationActor, controller cleaners, ... (issue 40: 15 of a Ray Train
    run's 39 MiB) stay helpers until they join a group."""
    rec = Recorder(str(tmp_path), "g", 16, _Log(), full_slots=256)
    module = "ray.train.v2._internal.execution.checkpoint.sync_actor"
    rec.set_meta(ray_actor_id="abc", ray_actor_class="SynchronizationActor", ray_actor_module=module)
    rec.phase_enter("broadcast_from_rank_zero", grow=False)
    rec.phase_exit("broadcast_from_rank_zero")
    assert rec.nslots == 16 and read_ring(rec.path).meta["ray_actor_class"] == "SynchronizationActor"
    rec.group_created({"op": "new_group", "member": True, "name": "0", "ranks": [0, 1]})
    assert rec.nslots == 256


def test_full_string_table_of_a_small_ring_grows_it(tmp_path):
    rec = Recorder(str(tmp_path), "s", 16, _Log(), full_slots=64)
    big = "x" * 4000
    for i in range(80):  # 320 KB of strings > the small 256 KiB table
        rec.intern("%d%s" % (i, big))
    ring = read_ring(rec.path)
    assert ring.header["nslots"] == 64 and len([s for s in ring.strings.values() if s.endswith(big)]) == 80


def test_traced_fork_child_keeps_a_small_ring(tmp_path):
    """A helper forked from a rank (a DataLoader worker) starts small, even when its parent
    is full-size and had a step; what it records is readable afterwards."""
    script = tmp_path / "fork.py"
    script.write_text(
        textwrap.dedent("""
        import os
        from hangtrace import tracer
        tracer.step(3)                       # the parent uses the step API: full ring
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        os.waitpid(pid, 0)
    """)
    )
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, str(script)], env=base_env(run), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    rings = {}
    for f in os.listdir(run):
        if f.startswith("ring-"):
            r = read_ring(str(run / f))
            rings[r.header["nslots"]] = r
    assert sorted(rings) == [256, 16384], sorted(rings)
    child = rings[256]
    assert [e["event"] for e in child.events] == ["start", "exit"] and child.events[-1]["code"] == 7
    assert child.header["step"] == 3
    with open(run / "hangtrace.log") as f:
        log = f.read()
    assert "recorder: " in log and "ring grown to 16384 slots: step API" in log


def test_sampler_take_over_code_is_imported_before_a_fork_not_at_start(tmp_path):
    """hooks/mem/memfork.py (a forked child's sampler take-over) is not imported at start-up
    (issue 8) nor by every child (issue 13): the parent imports it just before its first
    fork, and the child takes the parent's sampler over with it, its timer a raw thread
    that has taken no sample yet."""
    script = tmp_path / "fork.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        from hangtrace.hooks.mem import memory
        assert "hangtrace.hooks.mem.memfork" not in sys.modules, "imported at start-up"
        assert "hangtrace.hooks.mem.memcuda" not in sys.modules, "CUDA sampling imported without CUDA"
        parent = memory.active()
        assert parent is not None
        pid = os.fork()
        if pid == 0:
            s = memory.active()
            from hangtrace.hooks.mem import memfork
            # its timer: a ChildClock whose raw thread waits one interval before any sample
            ok = (s is parent and s.pid == os.getpid() and isinstance(s.thread, memfork.ChildClock)
                  and time.clock_gettime_ns(time.pthread_getcpuclockid(s.thread.ident)) >= 0
                  and len(os.listdir("/proc/self/task")) == 2 and s.nsamples == 0 and not s.dead)
            os._exit(0 if ok else 3)
        assert "hangtrace.hooks.mem.memfork" in sys.modules, "not imported before the fork"
        _, st = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(st))
    """)
    )
    p = subprocess.run(
        [sys.executable, str(script)],
        env=base_env(tmp_path / "run", HANGTRACE_MEM_INTERVAL_S=100),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])


def test_forked_child_starts_in_the_parents_step_from_the_prepared_recorder(tmp_path):
    """A forked child adopts the recorder its parent prepared before the first fork
    (``Runtime.prepare_child``); it is reused for every fork, and each child starts in the
    step its parent was in at that fork (header and records), with its own pid and ring."""
    script = tmp_path / "fork.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        from hangtrace import tracer
        from hangtrace.hooks import state
        kids = []
        for step in (7, 12):
            tracer.step(step)
            pid = os.fork()
            if pid == 0:
                rec = state.active().recorder
                assert rec.pid == os.getpid() and rec.lazy, (rec.pid, rec.lazy)
                rec.event("child-mark", step_seen=rec._step)  # (an event: the ring goes to its file)
                os._exit(0)
            kids.append(pid)
            assert os.waitpid(pid, 0)[1] == 0
        ready = state.active()._child_recorder
        assert ready is not None and ready[0] == os.getpid() and ready[1].lazy  # (kept, unused)
        print("kids", *kids)
    """)
    )
    p = subprocess.run(
        [sys.executable, str(script)],
        env=base_env(tmp_path / "run", HANGTRACE_MEM_INTERVAL_S=100),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    kids = [int(x) for x in p.stdout.split("kids")[1].split()]
    from hangtrace.tracer.ring.reader import read_ring

    for pid, step in zip(kids, (7, 12)):
        r = read_ring(tmp_path / "run" / ("ring-%s-%d.htr" % (os.uname().nodename, pid)))
        assert r.header["pid"] == pid and r.header["step"] == step, r.header
        mark = [e for e in r.events if e["event"] == "child-mark"]
        assert mark and mark[0]["step_seen"] == step, r.events
        assert [x["step"] for x in r.records if x.get("kind") == "event"][-1:] == [step], r.records


def test_forked_helpers_start_record_waits_for_its_file(tmp_path):
    """A forked helper's lazy ring keeps its start record as fields (issue 13) and writes it
    first, with the time of the fork, when the ring goes to its file: by an event
    (``materialize``) or by joining a group (``grow``); a clean exit before then leaves no
    file at all."""
    script = tmp_path / "fork.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        from hangtrace.hooks import state
        kids = []
        for how in ("event", "grow", "none"):
            t0 = time.time_ns()
            pid = os.fork()
            if pid == 0:
                rec = state.active().recorder
                assert rec.lazy and rec._pending_start is not None, rec._pending_start
                time.sleep(0.05)
                if how == "event":
                    rec.event("child-mark")
                elif how == "grow":
                    assert rec.grow("joined a test group")
                assert rec._pending_start is None or how == "none"
                os._exit(0)
            kids.append((pid, how, t0))
            assert os.waitpid(pid, 0)[1] == 0
        print("parent", os.getpid(), "kids", " ".join("%d:%s:%d" % k for k in kids))
    """)
    )
    p = subprocess.run(
        [sys.executable, str(script)],
        env=base_env(tmp_path / "run", HANGTRACE_MEM_INTERVAL_S=100),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    from hangtrace.tracer.ring.reader import read_ring

    for kid in p.stdout.split("kids")[1].split():
        pid, how, t0 = kid.split(":")
        path = tmp_path / "run" / ("ring-%s-%s.htr" % (os.uname().nodename, pid))
        if how == "none":
            assert not path.exists()
            continue
        r = read_ring(path)
        ev = [e["event"] for e in r.events]
        assert ev[:1] == ["start"], ev
        start = r.events[0]
        assert start["forked_from"] == start["ppid"] == int(p.stdout.split()[1]), start
        assert start["thread"] == "MainThread", start
        # the time of the fork, not of the write: the child slept 50 ms before its next record
        assert int(t0) <= start["wall_ns"] <= r.events[1]["wall_ns"] - 50_000_000, (t0, r.events[:2])
        if how == "event":
            assert ev[:2] == ["start", "child-mark"], ev


def test_child_stop_flag_is_an_event():
    """``memfork.StopFlag``: Event's is_set / wait / set, across threads."""
    import threading
    from hangtrace.hooks.mem.memfork import StopFlag

    f = StopFlag()
    assert not f.is_set() and f.wait(0.01) is False
    got = []
    waiters = [threading.Thread(target=lambda: got.append(f.wait(10))) for _ in range(3)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    f.set()
    f.set()  # (twice: no error)
    for w in waiters:
        w.join(5)
    assert got == [True, True, True] and f.is_set() and f.wait(0) is True
