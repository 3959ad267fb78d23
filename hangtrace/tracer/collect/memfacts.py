"""Collection-time OOM evidence of dead processes (issue 5): kernel log, cgroup counters.

Moved from collect/rings.py (issue 8: modules under 400 lines). ``memory_facts(p)`` is
what ``ProcessInfo.memory_facts`` holds; the analysis reads it in analyze/memory/.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Pattern, Tuple

import socket

if TYPE_CHECKING:
    from hangtrace.tracer.snapshot import ProcessInfo

#: A kernel log line: (seconds since boot or None, text).
KernelLine = Tuple[Optional[float], str]

_HOST = socket.gethostname()


_KILLED_RE: Optional[Tuple[Pattern[str], Pattern[str], Pattern[str], Pattern[str]]] = None


def _kernel_re() -> Tuple[Pattern[str], Pattern[str], Pattern[str], Pattern[str]]:
    global _KILLED_RE
    if _KILLED_RE is None:
        import re

        _KILLED_RE = (
            re.compile(r"Kill(?:ed)? process (\d+) \(([^)]*)\)(.*)"),
            re.compile(r"oom-kill:.*?\bpid=(\d+)"),
            re.compile(r"anon-rss:(\d+)kB"),
            re.compile(r"oom_memcg=([^,\s]+)"),
        )
    return _KILLED_RE


def parse_kernel_oom(lines: Iterable[KernelLine]) -> Dict[int, Dict[str, Any]]:
    """Kernel log lines -> {pid: {'line', 'anon_rss' (bytes), 'memcg', 'mono_s', 'scope'}}.

    Recognises the OOM killer's "Memory cgroup out of memory: Killed process N (name)
    total-vm:..kB, anon-rss:..kB, ..." (cgroup limit), "Out of memory: Killed process N"
    (the whole host) and the "oom-kill:constraint=...,oom_memcg=...,task=...,pid=N" summary
    (Linux mm/oom_kill.c). ``lines``: iterable of ``(mono_s or None, text)``.
    """
    killed, summary, anon, memcg = _kernel_re()
    out: Dict[int, Dict[str, Any]] = {}
    for mono, text in lines:
        m = killed.search(text)
        if m:
            pid = int(m.group(1))
            d = out.setdefault(pid, {})
            d["line"] = text.strip()[:400]
            d["name"] = m.group(2)
            d["mono_s"] = mono
            d["scope"] = "cgroup" if "Memory cgroup" in text else "host"
            a = anon.search(text)
            if a:
                d["anon_rss"] = int(a.group(1)) * 1024
            continue
        m = summary.search(text)
        if m:
            d = out.setdefault(int(m.group(1)), {})
            c = memcg.search(text)
            if c:
                d["memcg"] = c.group(1)
            d.setdefault("mono_s", mono)
            d.setdefault("line", text.strip()[:400])
    return out


def read_kernel_log() -> Tuple[List[KernelLine], str]:
    """Kernel log as ``(lines, status)``: ``lines`` [(mono_s, text)]; ``status`` 'read' or
    why not. /dev/kmsg first (records ``prio,seq,usec,flags;text``), then ``dmesg``."""
    import errno

    lines: List[KernelLine] = []
    fd: Optional[int]
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        fd, why = None, "/dev/kmsg: %s" % e.strerror
    if fd is not None:
        try:
            for _ in range(200000):
                try:
                    rec = os.read(fd, 8192)
                except OSError as e:
                    if e.errno == errno.EPIPE:  # overwritten while reading: go on
                        continue
                    if e.errno == errno.EAGAIN:
                        break
                    raise
                if not rec:
                    break
                head, _, text = rec.decode("utf-8", "replace").partition(";")
                f = head.split(",")
                mono: Optional[float]
                try:
                    mono = int(f[2]) / 1e6
                except (IndexError, ValueError):
                    mono = None
                lines.append((mono, text.split("\n", 1)[0]))
            return lines, "read"
        except OSError as e:
            why = "/dev/kmsg: %s" % e.strerror
        finally:
            os.close(fd)
    import subprocess

    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            for ln in out.stdout.splitlines():
                mono = None
                if ln.startswith("[") and "]" in ln:
                    try:
                        mono = float(ln[1 : ln.index("]")])
                    except ValueError:
                        pass
                    ln = ln[ln.index("]") + 1 :].strip()
                lines.append((mono, ln))
            return lines, "read"
        why += "; dmesg: %s" % (out.stderr.strip()[:100] or "status %d" % out.returncode)
    except (OSError, subprocess.SubprocessError) as e:
        why += "; dmesg: %s" % e
    return [], why


def dataloader_kills(text: Any) -> List[Tuple[int, Optional[str]]]:
    """The DataLoader workers torch says died, from an exception's message and traceback
    text: ``[(worker pid, signal name)]`` for each "DataLoader worker (pid 123) is killed by
    signal: Killed." (raised in the rank by torch's SIGCHLD handler,
    ``torch/csrc/DataLoader.cpp``), else ``[(pid, None), ...]`` from "DataLoader worker
    (pid(s) 123, 456) exited unexpectedly" (``torch/utils/data/dataloader.py``, which raises
    it *from* the first: in a traceback the first is the chained cause), else []."""
    import re

    t = str(text or "")
    out: List[Tuple[int, Optional[str]]] = []
    for m in re.finditer(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)", t):
        if all(int(m.group(1)) != pid for pid, _ in out):
            out.append((int(m.group(1)), m.group(2).strip()))
    if not out:
        for m in re.finditer(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly", t):
            for pid in re.findall(r"\d+", m.group(1)):
                if all(int(pid) != q for q, _ in out):
                    out.append((int(pid), None))
    return out


def fatal_signal_name(p: ProcessInfo) -> Optional[str]:
    """``'Segmentation fault'``: the signal process ``p`` died of by its fatal-error dump
    (faulthandler's first line, "Fatal Python error: Segmentation fault"), else None. Torch
    names it in "DataLoader worker (pid N) is killed by signal: ..." only when its SIGCHLD
    handler saw the death first; "exited unexpectedly" names none (blind job ray_dl_worker_segv)."""
    text = str(((p.signals or {}).get("fatal") or {}).get("text") or "")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    name = first.split("Fatal Python error:", 1)[1].strip() if first.startswith("Fatal Python error:") else ""
    return name or None


def exception_text(p: ProcessInfo) -> str:
    """Message and traceback of process ``p``'s exception (``ProcessInfo.exception``: its
    chained causes included), '' when it has none."""
    e = p.exception
    return "%s\n%s" % (e.get("message") or "", e.get("traceback") or "") if e else ""


def _read_int_file(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(4096)
    except OSError:
        return None


def _after_start(k: Dict[str, Any], start_wall_ns: Optional[int]) -> bool:
    """True when kernel line ``k`` (``parse_kernel_oom``) is not older than a process started
    at ``start_wall_ns`` (pids are reused; 2 s of slack; True when either time is unknown)."""
    if k.get("mono_s") is None or not start_wall_ns:
        return True
    wall = time.time() - (time.clock_gettime(time.CLOCK_MONOTONIC) - k["mono_s"])
    return wall * 1e9 >= start_wall_ns - 2e9


def memory_facts(p: ProcessInfo, cache: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Collection-time OOM evidence for a dead process of this host (dict, see
    ``ProcessInfo.memory_facts``); {} for live or foreign processes. ``cache`` (a dict
    shared over one collection) keeps the kernel log read once."""
    facts: Dict[str, Any] = {}
    # (a process whose ring holds a non-zero exit code may still be tearing down: "alive")
    if p.host != _HOST or not (p.state == "killed" or p.exit_code not in (0, None)):
        return facts
    try:
        from hangtrace.hooks.mem.cgroup import parse_oom_kill

        d = (p.meta or {}).get("mem_cgroup")
        ver = (p.meta or {}).get("mem_cgroup_version")
        if d:
            facts["cgroup_dir"] = d
            raw = _read_int_file(os.path.join(d, "memory.oom_control" if ver == 1 else "memory.events"))
            facts["cgroup_exists"] = raw is not None
            if raw is not None:
                n = parse_oom_kill(raw)
                facts["cgroup_oom_kill_now"] = n if n >= 0 else None
        klines: Dict[int, Dict[str, Any]]
        if cache is not None and "kernel" in cache:
            klines, status = cache["kernel"]
        else:
            lines, status = read_kernel_log()
            klines = parse_kernel_oom(lines)
            if cache is not None:
                cache["kernel"] = (klines, status)
        facts["kernel_log"] = status
        k = klines.get(p.pid)
        if k and _after_start(k, p.start_wall_ns):
            facts["kernel_oom"] = k
        for pid, _sig in dataloader_kills(exception_text(p)):  # its DataLoader workers that died: an OOM line
            k = klines.get(pid)
            if k and _after_start(k, p.start_wall_ns):  # (the worker started after it)
                facts["helper_kernel_oom"] = dict(k, pid=pid)
                break
        try:
            with open("/proc/meminfo") as f:
                for ln in f:
                    if ln.startswith("MemTotal:"):
                        facts["host_mem_total"] = int(ln.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            pass
    except Exception as e:  # evidence gathering must not stop a collection
        facts["error"] = repr(e)
    return facts
