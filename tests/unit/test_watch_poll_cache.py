"""The watcher's poll reads what changed (issue 40, item 4): ring headers decoded again only
when their bytes changed (``progress.HeaderCache``), liveness from pidfds once a process was
seen alive (``collect/pidwatch.py``). Real ring files of the real Recorder, real processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.tracer.collect import pidwatch, ringprocs
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.watch.progress import HeaderCache, read_headers


def _ring(run_dir: str, rank: int = 0) -> Recorder:
    rec = Recorder(run_dir, "poll-cache", 256, lambda *a: None)
    rec.set_rank(rank, rank, 2)
    rec.step(1)
    return rec


def test_an_unchanged_header_is_not_decoded_again_and_a_changed_one_is(tmp_path):
    rec = _ring(str(tmp_path))
    cache = HeaderCache()
    first = cache.read(str(tmp_path))
    assert first == read_headers(str(tmp_path))
    again = cache.read(str(tmp_path))
    assert again[rec.path] is first[rec.path]  # the same dict: nothing decoded
    rec.phase_enter("checkpoint", step=7)
    moved = cache.read(str(tmp_path))[rec.path]
    assert moved is not first[rec.path]
    assert (moved["phase"], moved["step"]) == ("checkpoint", 7)
    assert moved == read_headers(str(tmp_path))[rec.path]
    rec.step(8)  # the same phase: its name is kept, not read again
    assert cache.read(str(tmp_path))[rec.path]["phase"] == "checkpoint"
    rec.close()


def _ring_file(tmp_path, name: str, rank: int) -> str:
    """A ring of ``rank`` (this process's: one per directory) copied to ``tmp_path/name``."""
    src = tmp_path / ("src-%s-%d" % (name, rank))
    src.mkdir()
    rec = _ring(str(src), rank)
    rec.close()
    dst = str(tmp_path / "run" / name)
    shutil.copy(rec.path, dst + ".tmp")
    os.rename(dst + ".tmp", dst)  # (a new inode under the name, as the recorder renames)
    return dst


def test_a_replaced_removed_or_foreign_ring_file_is_read_as_read_headers_reads_it(tmp_path):
    (tmp_path / "run").mkdir()
    d = str(tmp_path / "run")
    a, b = _ring_file(tmp_path, "ring-h-1.htr", 0), _ring_file(tmp_path, "ring-h-2.htr", 1)
    cache = HeaderCache()
    assert {p: h["rank"] for p, h in cache.read(d).items()} == {a: 0, b: 1}
    _ring_file(tmp_path, "ring-h-1.htr", 5)  # another ring renamed over a's name: read anew
    assert cache.read(d)[a]["rank"] == 5
    os.unlink(b)  # gone: left out and its descriptor closed
    assert set(cache.read(d)) == {a}
    assert b not in cache.open
    (tmp_path / "run" / "ring-x-1.htr").write_bytes(b"not a ring at all")  # foreign: left out
    assert set(cache.read(d)) == {a}
    final = cache.read(d)
    assert cache.read(d, final=final) == final and not cache.open  # gone processes: closed


def test_pidfds_tell_a_process_that_exits_and_refuse_a_reused_pid():
    watch = pidwatch.PidWatch(F.proc_start_ticks)
    p = subprocess.Popen(["sleep", "60"])
    try:
        ticks = F.proc_start_ticks(p.pid)
        assert watch.answer(p.pid, ticks) is None  # not seen yet: the caller reads /proc
        watch.seen_alive(p.pid, ticks + 1)  # another start time: another process, not held
        assert watch.answer(p.pid, ticks + 1) is None
        watch.seen_alive(p.pid, ticks)
        assert watch.answer(p.pid, ticks) is True
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while watch.answer(p.pid, ticks) is not False and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.answer(p.pid, ticks) is False  # a zombie (not reaped yet) is gone
        assert watch.answer(p.pid, 0) is None  # no recorded start time: /proc decides
    finally:
        p.kill()
        p.wait()


def test_live_state_answers_the_same_with_the_pidfd_registry(tmp_path, monkeypatch):
    if not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open on this Python")
    monkeypatch.setattr(pidwatch, "_WATCH", None)
    p = subprocess.Popen(["sleep", "60"])
    try:
        h = {
            "host": ringprocs.HOST,
            "pid": p.pid,
            "proc_start_ticks": F.proc_start_ticks(p.pid),
            "state": F.ST_RUNNING,
        }
        assert ringprocs.live_state(h) == "alive"
        pidwatch.enable(F.proc_start_ticks)
        assert ringprocs.live_state(h) == "alive"  # read from /proc, then held
        assert pidwatch.registry().answer(p.pid, h["proc_start_ticks"]) is True
        p.kill()
        p.wait()
        time.sleep(2 * pidwatch.DRAIN_S)  # (the epoll set is read at most every DRAIN_S)
        assert ringprocs.live_state(h) == "killed"
        assert ringprocs.live_state(dict(h, state=F.ST_EXITED)) == "exited"
    finally:
        p.kill()
        p.wait()


def test_a_forked_child_reads_proc_not_its_parents_registry(monkeypatch):
    if not hasattr(os, "pidfd_open"):
        pytest.skip("no os.pidfd_open on this Python")
    monkeypatch.setattr(pidwatch, "_WATCH", None)
    pidwatch.enable(F.proc_start_ticks)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(w, b"none" if pidwatch.registry() is None else b"kept")
        os._exit(0)
    os.close(w)
    assert os.read(r, 16) == b"none"
    os.waitpid(child, 0)
    os.close(r)
    assert pidwatch.registry() is not None


def test_a_dropped_cache_closes_its_descriptors(tmp_path):
    import gc

    rec = _ring(str(tmp_path))
    cache = HeaderCache()
    cache.read(str(tmp_path))
    held = cache.open
    assert len(held) == 1
    del cache
    gc.collect()
    assert held == {}  # closed by the finalizer (then emptied)
    rec.close()
