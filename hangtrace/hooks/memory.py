"""Memory sampling inside a traced process (issue 5): host, cgroup, CUDA, gauges -> ring.

What one sample writes (record layout in ``tracer/ring/layout.py``, kind K_MEM):

* ``host``: RSS (``/proc/PID/statm`` field 2 x page size), swap (``VmSwap`` of
  ``/proc/PID/status``), and the process's memory cgroup: usage, limit (the smallest limit
  of the cgroup and its ancestors; 0 = none) and the ``oom_kill`` counter. cgroup v1:
  ``memory.usage_in_bytes``, ``memory.limit_in_bytes``, ``memory.oom_control``
  (``oom_kill N``, kernel >= 4.13); v2: ``memory.current``, ``memory.max``,
  ``memory.events`` (``oom_kill N``). The cgroup directory comes from
  ``/proc/PID/cgroup`` mapped through ``/proc/PID/mountinfo`` (works inside a cgroup
  namespace).
* ``cuda:N`` (only when torch is imported AND ``torch.cuda.is_initialized()``; CUDA is
  never initialised here): ``memory_allocated``, ``memory_reserved``,
  ``max_memory_allocated``, and ``mem_get_info`` free/total.
* ``gauge:<name>`` for every ``tracer.gauge(name, fn)``.

When: just after a phase is entered, just before it is left, at every ``tracer.step``
and on a timer (``HANGTRACE_MEM_INTERVAL_S``, default 1 s; the tick writes no record when
a phase/step sample is younger than the interval). Costs (measured on this machine):
``os.pread`` of an open ``/proc``/cgroup file descriptor ~1 us each, a whole host sample
~10 us; ``/proc/PID/status`` costs ~120 us, so swap, limits and ``mem_get_info`` are only
refreshed on the timer thread and reused by phase/step samples.

CUDA out of memory: the allocator's out-of-memory observer
(``torch._C._cuda_attach_out_of_memory_observer``, called with ``(device, bytes
requested, device allocated, device free)`` after the allocator released its lock;
torch's memory docs use it to dump ``torch.cuda.memory._snapshot()``) is attached the
first time the timer sees CUDA initialised; an ``OutOfMemoryError``/``MemoryError``
leaving a ``tracer.phase`` or reaching ``sys.excepthook`` writes a MEM_OOM sample too.
With ``HANGTRACE_MEM_CUDA_HISTORY=1`` torch's allocator history is recorded and a snapshot
``RUN_DIR/memory/cuda-oom-<host>-<pid>-<n>.pickle`` written at the OOM.

Nothing here raises into the program: every entry point swallows its errors and logs
each kind once to the run log. Standard library only (torch is looked up in
``sys.modules``, never imported).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Optional

from hangtrace.hooks.instrument import Instrumentor
from hangtrace.tracer import api
from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F

THREAD_NAME = "hangtrace-memory"
NO_LIMIT = 1 << 60  # limits at or above this are "no limit" (v1 reports 2**63 - 4096)
_mono = time.monotonic_ns

_sampler = None
_lock = threading.Lock()


# --- cgroup discovery (pure functions on file contents; unit-tested) -----------------------
def parse_proc_cgroup(text):
    """``/proc/PID/cgroup`` text -> ``(v1 memory path or None, v2 path or None)``."""
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        elif "memory" in ctrls.split(","):
            v1 = path
    return v1, v2


def parse_mountinfo(text):
    """``/proc/PID/mountinfo`` -> ``{'v1': (root, mountpoint) or None, 'v2': ... }``."""
    out = {"v1": None, "v2": None}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f = left.split()
        r = right.split()
        if len(f) < 5 or len(r) < 1:
            continue
        fstype = r[0]
        supers = r[2].split(",") if len(r) > 2 else []
        root, mnt = f[3], f[4].replace("\\040", " ")
        if fstype == "cgroup" and "memory" in supers and out["v1"] is None:
            out["v1"] = (root, mnt)
        elif fstype == "cgroup2" and out["v2"] is None:
            out["v2"] = (root, mnt)
    return out


def _join(root, mnt, path):
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.normpath(mnt + "/" + path.lstrip("/"))


def cgroup_candidates(cgroup_text, mountinfo_text):
    """Directories that may hold this process's memory cgroup files, best first:
    ``[(version, dir), ...]`` (v1 memory controller first: on hybrid hosts it is the one
    that limits; then v2). The caller keeps the first whose files exist."""
    v1, v2 = parse_proc_cgroup(cgroup_text)
    mi = parse_mountinfo(mountinfo_text)
    out = []
    if v1 is not None:
        root, mnt = mi["v1"] or ("/", "/sys/fs/cgroup/memory")
        out.append((1, _join(root, mnt, v1)))
        out.append((1, mnt))  # inside a cgroup namespace the mount root is our cgroup
    if v2 is not None:
        root, mnt = mi["v2"] or ("/", "/sys/fs/cgroup")
        out.append((2, _join(root, mnt, v2)))
        out.append((2, mnt))
    return out


V1_FILES = ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control")
V2_FILES = ("memory.current", "memory.max", "memory.events")


def find_cgroup(pid=None):
    """``(version, dir)`` of the memory cgroup of ``pid`` (default: this process), or
    ``(0, None)`` when no memory controller is readable."""
    pid = os.getpid() if pid is None else pid
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            cg = f.read()
        try:
            with open("/proc/%d/mountinfo" % pid) as f:
                mi = f.read()
        except OSError:
            mi = ""
    except OSError:
        return 0, None
    for ver, d in cgroup_candidates(cg, mi):
        files = V1_FILES if ver == 1 else V2_FILES
        if os.path.exists(os.path.join(d, files[0])):
            return ver, d
    return 0, None


def parse_limit(raw):
    """A limit file's content -> bytes, 0 for none ('max', or >= 2**60)."""
    raw = raw.strip()
    if not raw or raw == b"max" or raw == "max":
        return 0
    v = int(raw)
    return 0 if v >= NO_LIMIT else v


def parse_oom_kill(raw):
    """``oom_kill N`` from memory.oom_control (v1) or memory.events (v2) -> N, -1 if absent."""
    if isinstance(raw, bytes):
        i = raw.find(b"\noom_kill ")  # fast path (every sample): never the first line
        if i >= 0:
            j = raw.find(b"\n", i + 10)
            try:
                return int(raw[i + 10:j if j > 0 else len(raw)])
            except ValueError:
                pass
        raw = raw.decode("ascii", "replace")
    for line in raw.splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill":
            try:
                return int(v)
            except ValueError:
                return -1
    return -1


def _is_oom_type(etype):
    try:
        if issubclass(etype, MemoryError):
            return True
    except TypeError:
        return False
    return etype.__name__ == "OutOfMemoryError"


class Sampler:
    """Samples memory into ``recorder``'s ring. ``log(msg, key)`` logs once per key."""

    def __init__(self, recorder, log, interval_s=1.0, run_dir=None):
        self.rec = recorder
        self.log = log
        self.run_dir = run_dir
        self.interval_s = max(0.05, float(interval_s))
        self.interval_ns = int(self.interval_s * 1e9)
        self.pid = os.getpid()
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.dead = False
        self.last_ns = 0
        self.nsamples = 0
        self._stop = threading.Event()
        self._thread = None
        self._fds = []
        self._statm = self._open("/proc/%d/statm" % self.pid)
        self.swap = -1
        self.cg_version, self.cg_dir = 0, None
        self._cg_raw = None
        self._usage = self._oom = None
        self._limit_fds = []
        self.limit = -1
        self.oom_kills = -1
        self._host = recorder.intern("host")
        self._cuda = {}          # device -> [strid, free, total]
        self._cuda_hooked = False
        self._gauge_sids = {}
        self._oom_seen = None    # id of the last exception recorded as MEM_OOM
        self._oom_count = 0
        self._check_cgroup()
        self._refresh_slow()

    # -- file handling ------------------------------------------------------------------
    def _open(self, path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        self._fds.append(fd)
        return fd

    def _close_cgroup(self):
        for fd in [self._usage, self._oom] + self._limit_fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                if fd in self._fds:
                    self._fds.remove(fd)
        self._usage = self._oom = None
        self._limit_fds = []

    def _check_cgroup(self):
        """(Re)open the cgroup files when ``/proc/PID/cgroup`` changed (a launcher or Ray
        may move the process after it started)."""
        try:
            with open("/proc/%d/cgroup" % self.pid, "rb") as f:
                raw = f.read()
        except OSError:
            raw = b""
        if raw == self._cg_raw:
            return
        self._cg_raw = raw
        self._close_cgroup()
        ver, d = find_cgroup(self.pid)
        self.cg_version, self.cg_dir = ver, d
        if d is None:
            self.log("memory: no readable memory cgroup for pid %d; cgroup figures are -1" % self.pid,
                     "mem-nocg")
        else:
            files = V1_FILES if ver == 1 else V2_FILES
            self._usage = self._open(os.path.join(d, files[0]))
            self._oom = self._open(os.path.join(d, files[2]))
            # the effective limit is the smallest over the cgroup and its ancestors
            cur = d
            for _ in range(16):
                fd = self._open(os.path.join(cur, files[1]))
                if fd is None:
                    break
                self._limit_fds.append(fd)
                parent = os.path.dirname(cur)
                if parent == cur or not parent.startswith("/sys/fs/cgroup/"):
                    break
                cur = parent
        try:
            self.rec.set_meta(mem_cgroup=d, mem_cgroup_version=ver, mem_page_size=self.page)
        except Exception:
            pass

    def _refresh_slow(self):
        """Swap, limit, CUDA free/total: the expensive figures (timer thread only)."""
        try:
            with open("/proc/%d/status" % self.pid, "rb") as f:
                for line in f:
                    if line.startswith(b"VmSwap:"):
                        self.swap = int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            self.swap = -1
        lim = 0
        seen = False
        for fd in self._limit_fds:
            try:
                v = parse_limit(os.pread(fd, 64, 0))
            except (OSError, ValueError):
                continue
            seen = True
            if v and (not lim or v < lim):
                lim = v
        self.limit = lim if seen else -1
        self._cuda_slow()

    # -- CUDA ---------------------------------------------------------------------------
    @staticmethod
    def _torch_cuda():
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_initialized():
                return None
        except Exception:
            return None
        return cuda

    def _cuda_slow(self):
        cuda = self._torch_cuda()
        if cuda is None:
            return
        try:
            n = cuda.device_count()
        except Exception:
            return
        for d in range(n):
            ent = self._cuda.get(d)
            if ent is None:
                ent = self._cuda[d] = [self.rec.intern("cuda:%d" % d), -1, -1]
            try:
                ent[1], ent[2] = cuda.mem_get_info(d)
            except Exception:
                pass
        if not self._cuda_hooked:
            self._cuda_hooked = True
            self._hook_cuda_oom()

    def _hook_cuda_oom(self):
        torch = sys.modules.get("torch")
        attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            self.log("memory: this torch has no CUDA out-of-memory observer; CUDA OOMs are seen "
                     "through the exception only", "mem-noobs")
            return
        try:
            attach(self.on_cuda_oom)
        except Exception as e:
            self.log("memory: attaching the CUDA OOM observer failed: %r" % (e,), "mem-obs")
        if os.environ.get(config.MEM_CUDA_HISTORY, "0") == "1":
            try:
                torch.cuda.memory._record_memory_history(max_entries=100000)
            except Exception as e:
                self.log("memory: _record_memory_history failed: %r" % (e,), "mem-hist")

    def on_cuda_oom(self, device, alloc, device_allocated, device_free):
        """The allocator's OOM observer (also what a test stand-in calls): record the event
        with phase, step and the allocator's figures; dump torch's memory snapshot when
        HANGTRACE_MEM_CUDA_HISTORY=1. Never raises."""
        try:
            d = int(device)
            ent = self._cuda.get(d)
            sid = ent[0] if ent else self.rec.intern("cuda:%d" % d)
            total = ent[2] if ent else -1
            self.rec.memory(F.MEM_OOM, sid, int(alloc), int(device_allocated), -1, int(device_free), total)
            self._oom_count += 1
            snap = None
            if os.environ.get(config.MEM_CUDA_HISTORY, "0") == "1" and self.run_dir:
                snap = self._dump_cuda_snapshot()
            phase, step = self.rec.current()
            self.rec.event("cuda_oom", device=d, requested=int(alloc), device_allocated=int(device_allocated),
                           device_free=int(device_free), device_total=total, phase=phase, step=step,
                           snapshot=snap, source="allocator-observer")
        except Exception as e:
            self.log("memory: recording a CUDA OOM failed: %r" % (e,), "mem-oomrec")

    def _dump_cuda_snapshot(self):
        try:
            import pickle
            torch = sys.modules["torch"]
            d = os.path.join(self.run_dir, "memory")
            os.makedirs(d, mode=0o700, exist_ok=True)
            path = os.path.join(d, "cuda-oom-%s-%d-%d.pickle" % (self.rec.host, self.pid, self._oom_count))
            with open(path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
            return path
        except Exception as e:
            self.log("memory: CUDA memory snapshot failed: %r" % (e,), "mem-snap")
            return None

    # -- sampling -----------------------------------------------------------------------
    def sample(self, source):
        """Write one sample of every source (host, CUDA devices, gauges). Never raises."""
        if self.dead:
            return
        try:
            rec = self.rec
            try:
                rss = int(os.pread(self._statm, 64, 0).split(None, 2)[1]) * self.page
            except (OSError, TypeError, ValueError, IndexError):
                rss = -1
            usage = oom = -1
            if self._usage is not None:
                try:
                    usage = int(os.pread(self._usage, 64, 0))
                except (OSError, ValueError):
                    pass
            if self._oom is not None:
                try:
                    oom = parse_oom_kill(os.pread(self._oom, 512, 0))
                except OSError:
                    pass
            rec.memory(source, self._host, rss, self.swap, usage, self.limit, oom)
            if self._cuda:
                self._sample_cuda(source)
            if api._gauges:
                self._sample_gauges(source)
            self.last_ns = _mono()
            self.nsamples += 1
        except Exception as e:
            self.log("memory: sampling failed: %r" % (e,), "mem-sample")

    def _sample_cuda(self, source):
        cuda = self._torch_cuda()
        if cuda is None:
            return
        for d, (sid, free, total) in list(self._cuda.items()):
            try:
                self.rec.memory(source, sid, cuda.memory_allocated(d), cuda.memory_reserved(d),
                                cuda.max_memory_allocated(d), free, total)
            except Exception as e:
                self.log("memory: CUDA sample failed: %r" % (e,), "mem-cuda")

    def _sample_gauges(self, source):
        for name, (fn, limit) in list(api._gauges.items()):
            try:
                v = fn()
                if isinstance(v, (tuple, list)):
                    v, lim = int(v[0]), int(v[1] or 0)
                else:
                    v, lim = int(v), int(limit or 0)
            except Exception as e:
                self.log("memory: gauge %r raised %r; its samples are skipped" % (name, e), "mem-g-" + name)
                continue
            sid = self._gauge_sids.get(name)
            if sid is None:
                sid = self._gauge_sids[name] = self.rec.intern("gauge:" + name)
            self.rec.memory(source, sid, v, lim, -1, -1, -1)

    def on_exception(self, etype, evalue):
        """An exception leaves a phase (or reaches sys.excepthook): an out-of-memory error
        (torch's OutOfMemoryError, MemoryError) gets one MEM_OOM sample, with the phase and
        step where it was raised. Never raises."""
        try:
            if not _is_oom_type(etype) or id(evalue) == self._oom_seen:
                return
            self._oom_seen = id(evalue)
            self._oom_count += 1
            self.sample(F.MEM_OOM)
        except Exception:
            pass

    # -- timer thread -------------------------------------------------------------------
    def tick(self):
        """One timer tick: refresh the slow figures; sample unless a sample is recent."""
        try:
            self._check_cgroup()
            self._refresh_slow()
        except Exception as e:
            self.log("memory: refresh failed: %r" % (e,), "mem-refresh")
        if _mono() - self.last_ns >= self.interval_ns * 0.9:
            self.sample(F.MEM_TIMER)

    def _run(self):
        while not self._stop.wait(self.interval_s):
            if self.dead:
                return
            self.tick()

    def start(self):
        self.sample(F.MEM_TIMER)
        t = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        t.start()
        self._thread = t

    def stop(self, timeout_s=2.0):
        """Stop the timer thread and wait for it (at exit: no thread of ours may be inside
        a torch call when the interpreter finalizes, see torch_dist._Poller)."""
        self._stop.set()
        t = getattr(self, "_thread", None)
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def abandon(self):
        """In a forked child: stop using this (the parent's) sampler without touching the ring."""
        self.dead = True
        self._stop.set()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []


def _excepthook(etype, evalue, tb):
    s = _sampler
    if s is not None:
        s.on_exception(etype, evalue)
    return _excepthook.prev(etype, evalue, tb)


def _install_excepthook():
    cur = sys.excepthook
    if getattr(cur, "_hangtrace_mem", False):
        return
    _excepthook.prev = cur
    _excepthook._hangtrace_mem = True
    sys.excepthook = _excepthook


def _after_fork_child() -> None:
    """In a forked child the inherited sampler (its thread is gone, its descriptors are the
    parent's /proc files) must never write again; ``MemoryInstrumentor`` then starts a
    new one for the child's own ring."""
    global _sampler
    s = _sampler
    if s is not None and s.pid != os.getpid():
        s.abandon()
        _sampler = None
        api._set_sampler(None)


def start(rt: Any, forked: bool = False) -> Optional[Sampler]:
    """Start sampling for Runtime ``rt`` (from ``bootstrap.activate``, and again in a forked
    child, where the parent's sampler thread does not exist). Returns the Sampler or None
    (HANGTRACE_MEM=0, or it failed: logged once)."""
    global _sampler
    with _lock:
        old = _sampler
        if old is not None:
            if old.pid == os.getpid() and not forked:
                return old
            old.abandon()
            _sampler = None
            api._set_sampler(None)
        if not config.mem_enabled():
            return None
        try:
            s = Sampler(rt.recorder, rt.log, config.get_float(config.MEM_INTERVAL_S), rt.run_dir)
            _sampler = s
            api._set_sampler(s)
            _install_excepthook()
            s.start()
            return s
        except Exception as e:
            _sampler = None
            api._set_sampler(None)
            rt.log("memory sampling disabled: %r" % (e,), "mem-start")
            return None


def stop() -> None:
    """Stop the timer thread and phase/step sampling (tests, benchmarks)."""
    global _sampler
    with _lock:
        s = _sampler
        _sampler = None
        api._set_sampler(None)
        if s is not None:
            s.stop()


def active() -> Optional[Sampler]:
    return _sampler


class MemoryInstrumentor(Instrumentor):
    """Memory sampling (this module): the sampler and its timer thread, the OOM hooks.

    ``HANGTRACE_MEM=0`` installs nothing. Stopped at exit before the exit record."""

    name = "memory"

    def _install(self, runtime: Any) -> None:
        start(runtime)

    def _uninstall(self) -> None:
        stop()

    def _after_fork_child(self) -> None:
        _after_fork_child()
        start(self.runtime, forked=True)

    def _at_exit(self) -> None:
        stop()
