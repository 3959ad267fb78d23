"""Output helpers shared by the ``hangtrace`` subcommands (``cli.py``, ``cli_records.py``)."""
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
