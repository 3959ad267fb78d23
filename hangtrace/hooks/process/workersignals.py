"""faulthandler stays on top of torch's DataLoader worker signal handlers (in-process, light).

A DataLoader worker calls ``torch.utils.data._utils.signal_handling._set_worker_signal_handlers``
first thing (torch/utils/data/_utils/worker.py ``_worker_loop``): torch's C handlers for
SIGSEGV, SIGBUS, SIGFPE print "ERROR: Unexpected segmentation fault encountered in worker."
and re-raise with the default action (torch/csrc/DataLoader.cpp), replacing faulthandler's,
so a worker that crashes in native code (a decoder called through ctypes, a C extension)
left an empty fatal-stack file and no kernel fault line (the signal was handled): the
verdict could not say where (blind helper 93: a NULL pointer in a ctypes decode call).

The wrapper installed here turns our faulthandler off around torch's call and on again
after it, so faulthandler's handler is on top and torch's is the one it chains to: the
worker writes its Python stacks (the frame that called into the native code), then torch
prints its message and the worker dies of the same signal as before. Only when the fatal
handler is ours (``lifecycle``: the program did not enable faulthandler itself). Never
raises into the program.
"""

from __future__ import annotations

import faulthandler
import functools
from types import ModuleType
from typing import Any, Callable, Optional

NAME = "_set_worker_signal_handlers"


def patch(module: ModuleType, fatal_fd: Callable[[], Optional[int]]) -> None:
    """Wrap ``module._set_worker_signal_handlers`` (module: torch's ``signal_handling``) once;
    ``fatal_fd()``: the descriptor of this process's fatal-stack file while faulthandler's
    fatal handler is ours, else None (asked at the worker's call, after its fork)."""
    orig = getattr(module, NAME, None)
    if orig is None or getattr(orig, "__hangtrace_wrapped__", None) is not None:
        return

    def call(*args: Any, **kwargs: Any) -> Any:
        fd = None
        try:
            fd = fatal_fd() if faulthandler.is_enabled() else None
            if fd is not None:
                faulthandler.disable()
        except Exception:
            fd = None
        try:
            return orig(*args, **kwargs)
        finally:
            if fd is not None:
                try:
                    faulthandler.enable(file=fd, all_threads=True)
                except Exception:
                    pass

    try:
        functools.update_wrapper(call, orig)
    except (AttributeError, TypeError):  # (a builtin: no __dict__ to copy)
        pass
    setattr(call, "__hangtrace_wrapped__", orig)
    setattr(module, NAME, call)
