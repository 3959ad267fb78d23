"""The per-process state of the torch.distributed hooks (``torch_dist._state``), split out of
``torch_dist.py`` (module size). Imported by ``torch_dist`` only: ``typing`` and nothing else at
run time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

if TYPE_CHECKING:
    from hangtrace.hooks.recorder import Recorder

Log = Callable[[str, str], None]  # log(message, key): the run log, once per key
GroupEntry = Tuple[int, str, Any]  # (strid, name, the group object or None)


class State:
    """Per-process state of the torch hooks (one instance; recreated after fork)."""

    def __init__(self, recorder: Recorder, log: Log) -> None:
        self.rec = recorder
        self.log = log
        self.seq: Dict[Union[str, Tuple[str, int]], int] = {}  # group name, or (group name, peer) -> last seq
        self.groups: Dict[Optional[int], GroupEntry] = {}  # id(pg) or None -> (strid, name, pg)
        self.dtypes: Dict[Any, int] = {}  # torch.dtype -> dtype id
        self.shapes: Dict[Any, int] = {}  # torch.Size -> strid
        self.order = 0
        self.dist: Any = None  # the torch.distributed module (set by install)
        self.fault = False
