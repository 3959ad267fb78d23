"""The auto-started node watcher's verdict on the launching terminal (issue 38, item 2).

In: ``HANGTRACE_WATCH_TTY`` (``hooks/autowatch``: the terminal of the stderr of the traced
process that started the watcher) and a diagnosed ``pipeline.Result``. Out: the verdict
block ``hangtrace run`` prints (``report/console.verdict_block``), written to that terminal.

The watcher runs in a session of its own: the device is opened with ``O_NOCTTY`` (it must
never become the watcher's controlling terminal) and ``O_NONBLOCK`` (a terminal stopped
with Ctrl-S must not stop the watcher), and only when it still belongs to the watcher's own
user (a closed terminal's number may be another user's login by then). Never raises.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from hangtrace.tracer import config


def launching_tty() -> Optional[str]:
    """``HANGTRACE_WATCH_TTY`` when it names a character device, else None."""
    path = os.environ.get(config.WATCH_TTY) or ""
    return path if path.startswith("/dev/") else None


def tell_terminal(tty: Optional[str], res: Any, title: str = "hangtrace verdict (node watcher)") -> bool:
    """Write the verdict block of ``res`` (a ``pipeline.Result``) to the terminal ``tty``;
    True when it was written. Never raises."""
    if not tty or res is None:
        return False
    try:
        from hangtrace.tracer.report.console import console_width, verdict_block

        fd = os.open(tty, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False  # the terminal was closed
    try:
        st = os.fstat(fd)
        if not os.isatty(fd) or st.st_uid != os.getuid():
            return False
        snap = res.snapshot.path or res.snapshot.run_dir or ""
        tl = os.path.join(snap, "timeline.json")
        with os.fdopen(os.dup(fd), "w") as f:
            f.write(
                verdict_block(
                    res.paragraph,
                    snap,
                    res.snapshot.run_dir or snap,
                    console_width(f),
                    tl if os.path.exists(tl) else None,
                    title=title,
                )
            )
        return True
    except (OSError, ValueError, AttributeError):
        return False
    finally:
        os.close(fd)
