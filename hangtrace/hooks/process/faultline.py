"""Issue 12: keep the kernel's fault line (library + offset of the crashing native frame)
when our faulthandler handles a hardware fault. In: the signals' dispositions and
``HANGTRACE_FAULT_LINE``; out: SIG_IGN as the disposition faulthandler saves for those at
SIG_DFL (``fault_line_disposition``), undone by ``restore_default``. Called by
``lifecycle.install`` before it enables faulthandler.
"""

from __future__ import annotations

import signal
from typing import List

FAULT_SIGNALS = tuple(
    getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL") if hasattr(signal, n)
)


def fault_line_disposition() -> List[int]:
    """Make SIG_IGN the disposition faulthandler saves as "previous" for hardware-fault
    signals that are at SIG_DFL; returns the signals changed.

    Why: faulthandler (CPython 3.11 ``faulthandler_fatal_error``) dumps, restores the
    previous disposition and ``raise()``s the signal again. With SIG_DFL that kills at once
    and the kernel prints no ``segfault at ... ip ... in libX.so[off,base+size]`` line (it
    prints only for faults with no handler, arch/x86/mm/fault.c ``show_signal_msg``). With
    SIG_IGN the re-raise is dropped, the handler returns, the faulting instruction runs
    again, and the kernel, finding the signal ignored, resets it to SIG_DFL, prints the
    line (``/proc/sys/debug/exception-trace``) and kills: same status (-11), same core
    behaviour (measured). The one difference: a SIGSEGV/SIGBUS/SIGFPE/SIGILL *sent* with
    kill(2) to a traced process is then dumped and ignored; ``HANGTRACE_FAULT_LINE=0``
    turns this off."""
    from hangtrace.tracer import config

    changed: List[int] = []  # signal numbers
    if not config.fault_line():
        return changed
    for sig in FAULT_SIGNALS:
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, signal.SIG_IGN)
                changed.append(sig)
        except Exception:
            pass
    return changed


def restore_default(sigs: list) -> None:
    """Put ``sigs`` back to SIG_DFL (what ``fault_line_disposition`` changed). Never raises."""
    for sig in sigs:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except Exception:
            pass
