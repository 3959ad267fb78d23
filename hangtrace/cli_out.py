"""Output helpers shared by the ``hangtrace`` subcommands (``cli.py`` and its ``cli_*.py`` siblings)."""

from __future__ import annotations

import sys
from typing import Any


def err(msg: str) -> None:
    """One ``hangtrace: MSG`` line on stderr."""
    sys.stderr.write("hangtrace: %s\n" % msg)
    sys.stderr.flush()


def dumps(obj: Any) -> str:
    """Indented JSON text of ``obj`` (non-string keys and unknown types as strings)."""
    import orjson

    return str(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode())


#: Exit status when the reader of our standard output went away (``... | head``): 128 +
#: SIGPIPE, what a shell reports for a command killed by SIGPIPE (``yes | head``).
EXIT_PIPE = 141


def stdout_closed() -> bool:
    """True when standard output is a pipe whose reader has gone. Then points file
    descriptor 1 at /dev/null, so that nothing written later (the interpreter's final
    flush) fails again. Python ignores SIGPIPE, so such a write raises BrokenPipeError."""
    import os
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR is always reported: a pipe with no reader left
        if not any(ev & select.POLLERR for _, ev in poller.poll(0)):
            return False
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        return True
    except (OSError, ValueError):
        return False
