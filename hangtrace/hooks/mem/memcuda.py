"""CUDA memory for the memory sampler (hooks/mem/memory.py): per-device figures, the
allocator's out-of-memory observer and the optional allocator-history snapshot.
Functions of the sampler ``s`` (its ``rec``, ``log``, ``run_dir``, ``pid``, ``_cuda``,
``_cuda_hooked``, ``_oom_count``); imported by the sampler only once torch has
initialised CUDA or calls the observer (not at start-up: issue 8).

torch is looked up in ``sys.modules``, never imported; nothing here initialises CUDA
(``torch.cuda.is_initialized()`` is checked first). Sources: torch 2.13
``torch.cuda.memory_allocated/memory_reserved/max_memory_allocated/mem_get_info``,
``torch._C._cuda_attach_out_of_memory_observer`` (called with ``(device, bytes
requested, device allocated, device free)`` after the allocator released its lock;
torch's memory docs use it to dump ``torch.cuda.memory._snapshot()``). With
``HANGTRACE_MEM_CUDA_HISTORY=1`` torch's allocator history is recorded and a snapshot
``RUN_DIR/memory/cuda-oom-<host>-<pid>-<n>.pickle`` written at the OOM.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from hangtrace.hooks.mem.torchcuda import torch_cuda
from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F


def cuda_slow(s: Any) -> None:
    """Refresh free/total of every device (timer thread); attach the OOM observer once."""
    cuda = torch_cuda()
    if cuda is None:
        return
    try:
        n = cuda.device_count()
    except Exception:
        return
    for d in range(n):
        ent = s._cuda.get(d)
        if ent is None:
            ent = s._cuda[d] = [s.rec.intern("cuda:%d" % d), -1, -1]
        try:
            ent[1], ent[2] = cuda.mem_get_info(d)
        except Exception:
            pass
    if not s._cuda_hooked:
        s._cuda_hooked = True
        _hook_cuda_oom(s)


def _hook_cuda_oom(s: Any) -> None:
    torch = sys.modules.get("torch")
    attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
    if torch is None or attach is None:  # (no torch: no attach either)
        s.log(
            "memory: this torch has no CUDA out-of-memory observer; CUDA OOMs are seen "
            "through the exception only",
            "mem-noobs",
        )
        return
    try:
        attach(s.on_cuda_oom)
    except Exception as e:
        s.log("memory: attaching the CUDA OOM observer failed: %r" % (e,), "mem-obs")
    if os.environ.get(config.MEM_CUDA_HISTORY, "0") == "1":
        try:
            torch.cuda.memory._record_memory_history(max_entries=100000)
        except Exception as e:
            s.log("memory: _record_memory_history failed: %r" % (e,), "mem-hist")


def on_cuda_oom(s: Any, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """The allocator's OOM observer (also what a test stand-in calls): record the event
    with phase, step and the allocator's figures; dump torch's memory snapshot when
    HANGTRACE_MEM_CUDA_HISTORY=1. Never raises."""
    try:
        d = int(device)
        ent = s._cuda.get(d)
        sid = ent[0] if ent else s.rec.intern("cuda:%d" % d)
        total = ent[2] if ent else -1
        s.rec.memory(F.MEM_OOM, sid, int(alloc), int(device_allocated), -1, int(device_free), total)
        s._oom_count += 1
        snap = None
        if os.environ.get(config.MEM_CUDA_HISTORY, "0") == "1" and s.run_dir:
            snap = _dump_cuda_snapshot(s, s.run_dir)
        phase, step = s.rec.current()
        s.rec.event(
            "cuda_oom",
            device=d,
            requested=int(alloc),
            device_allocated=int(device_allocated),
            device_free=int(device_free),
            device_total=total,
            phase=phase,
            step=step,
            snapshot=snap,
            source="allocator-observer",
        )
    except Exception as e:
        s.log("memory: recording a CUDA OOM failed: %r" % (e,), "mem-oomrec")


def _dump_cuda_snapshot(s: Any, run_dir: str) -> Optional[str]:
    try:
        import pickle

        torch = sys.modules["torch"]
        d = os.path.join(run_dir, "memory")
        os.makedirs(d, mode=0o700, exist_ok=True)
        path = os.path.join(d, "cuda-oom-%s-%d-%d.pickle" % (s.rec.host, s.pid, s._oom_count))
        with open(path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
        return path
    except Exception as e:
        s.log("memory: CUDA memory snapshot failed: %r" % (e,), "mem-snap")
        return None


def sample_cuda(s: Any, source: int) -> None:
    """One sample per known device (phase/step/timer)."""
    cuda = torch_cuda()
    if cuda is None:
        return
    for d, (sid, free, total) in list(s._cuda.items()):
        try:
            s.rec.memory(
                source,
                sid,
                cuda.memory_allocated(d),
                cuda.memory_reserved(d),
                cuda.max_memory_allocated(d),
                free,
                total,
            )
        except Exception as e:
            s.log("memory: CUDA sample failed: %r" % (e,), "mem-cuda")
