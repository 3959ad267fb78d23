"""torchelastic's error files, recorded into the ring when they are written or read.

torchrun gives each worker ``TORCHELASTIC_ERROR_FILE``
(``<log_dir>/<run_id>/attempt_<n>/<local_rank>/error.json``, under a ``torchelastic_*``
temp dir unless ``--log-dir`` is given). A worker whose main is decorated with
``torch.distributed.elastic.multiprocessing.errors.record`` writes its exception there
(``ErrorHandler.record_exception``; a parent that caught a ``ChildFailedError`` copies the
child's file into its own: ``ErrorHandler.dump_error_file``), as JSON::

    {"message": {"message": "ValueError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764630000"},
                 "errorCode": 1}}          # errorCode: only in a copy by dump_error_file

(or ``{"message": "text", "timestamp": 1764630000}``, the older flat form). The agent
reads each failed worker's file into a ``ProcessFailure(local_rank, pid, exitcode,
error_file)`` (``errors/__init__.py``, ``__post_init__``).

The files live as long as their directory: torch 2.13 never deletes it (only an attempt
directory it is about to reuse), but temp cleaners, containers and other hosts do. So
both sides record the content as a durable event ``elastic_error`` the moment torch
writes or reads it: ``type``, ``message``, ``traceback``, ``timestamp`` (s, the file's),
``error_file``, ``pid`` (the worker the file belongs to), ``local_rank``/``exit_code``
(agent side), ``seen_by`` (``'worker'`` or ``'agent'``). The analysis
(``tracer/analyze/failures/elastic.py``) uses it where our own records lack the exception.
Never raises into the program.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional

_MESSAGE_MAX = 4000
_TRACEBACK_MAX = 16000
_FILE_MAX = 1 << 20  # bytes read of an error file


def parse(data: Any) -> Dict[str, Any]:
    """The fields of an error file's JSON ``data`` (either form above): ``type``,
    ``message``, ``traceback``, ``timestamp``, ``error_code`` (None when absent)."""
    msg = data.get("message") if isinstance(data, dict) else None
    text, tb, ts, code = "", "", None, None
    if isinstance(msg, dict):
        text = str(msg.get("message") or "")
        info = msg.get("extraInfo")
        extra: Dict[str, Any] = info if isinstance(info, dict) else {}
        tb = str(extra.get("py_callstack") or "")
        ts = extra.get("timestamp")
        code = msg.get("errorCode")
    elif msg is not None:
        text = str(msg)
        ts = data.get("timestamp")
    etype, _, rest = text.partition(": ")
    if not rest or " " in etype or not etype:
        etype, rest = "", text  # not "Type: message"
    try:
        stamp: Optional[int] = int(ts) if ts is not None else None
    except (TypeError, ValueError):
        stamp = None
    return {
        "type": etype or None,
        "message": rest[:_MESSAGE_MAX],
        "traceback": tb[-_TRACEBACK_MAX:],
        "timestamp": stamp,
        "error_code": code if isinstance(code, int) else None,
    }


def read(path: str) -> Optional[Dict[str, Any]]:
    """:func:`parse` of the error file at ``path``; None when absent or unreadable."""
    try:
        if not path or not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return parse(json.loads(f.read(_FILE_MAX).decode("utf-8", "replace")))
    except Exception:
        return None


_record: Callable[..., None] = lambda kind, **fields: None  # noqa: E731


def configure(record: Callable[..., None]) -> None:
    """``record(kind, **fields)`` writes a durable event (``failures.record_event``)."""
    global _record
    _record = record


def _record_file(path: Optional[str], **extra: Any) -> None:
    try:
        fields = read(path or "")
        if fields is not None:
            _record("elastic_error", error_file=path, **fields, **extra)
    except Exception:
        pass


def _own_file(handler: Any) -> Optional[str]:
    try:
        p = handler._get_error_file_path()
        return str(p) if p else None
    except Exception:
        return os.environ.get("TORCHELASTIC_ERROR_FILE") or None


def _after(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``ErrorHandler.record_exception`` / ``dump_error_file``: record this process's error
    file once torch wrote it."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, *args, **kwargs)
        finally:
            _record_file(_own_file(self), pid=os.getpid(), seen_by="worker")

    return wrapper


def _post_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``ProcessFailure.__post_init__`` in the agent: record the failed worker's file."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        try:
            _record_file(
                getattr(self, "error_file", None),
                pid=int(self.pid),
                local_rank=self.local_rank,
                exit_code=self.exitcode,
                seen_by="agent",
            )
        except Exception:
            pass
        return out

    return wrapper


def hook_errors(module: Any, patch: Callable[[Any, str, Callable[..., Any]], None]) -> None:
    """Post-import hook for ``torch.distributed.elastic.multiprocessing.errors``; ``patch``
    is ``failures._patch_method``."""
    handler = getattr(module, "ErrorHandler", None)
    if handler is not None:
        patch(handler, "record_exception", _after)
        patch(handler, "dump_error_file", _after)
    failure = getattr(module, "ProcessFailure", None)
    if failure is not None:
        patch(failure, "__post_init__", _post_init)
