"""The per-process state of the torch.distributed hooks (``torch_dist._state``), split out of
``torch_dist.py`` (module size). Imported by the torchdist modules for the type: ``typing``
and nothing else at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:
    from hangtrace.hooks.record.recorder import Recorder

Log = Callable[[str, str], None]  # log(message, key): the run log, once per key
# A sequence counter: a one-item sequence holding the last sequence number issued
# (``cell[0] += 1``): a list, or with the C path a ``_fastrec.Counter`` that C advances in place.
Cell = Any
# (strid, name, the group object or None, its collectives' seq cell: st.seq[name])
GroupEntry = Tuple[int, str, Any, Cell]


def _list_cell() -> List[int]:
    return [0]


class State:
    """Per-process state of the torch hooks (one instance; recreated after fork)."""

    new_cell: Callable[[], Cell] = staticmethod(_list_cell)  # a new sequence counter at 0

    def __init__(self, recorder: Recorder, log: Log) -> None:
        self.rec = recorder
        self.log = log
        # group name, or (group name, peer) -> [last seq] (a cell: the C path counts in place)
        self.seq: Dict[Union[str, Tuple[str, int]], Cell] = {}
        self.groups: Dict[Optional[int], GroupEntry] = {}  # id(pg) or None -> (strid, name, pg)
        self.dtypes: Dict[Any, int] = {}  # torch.dtype -> dtype id
        self.shapes: Dict[Any, int] = {}  # torch.Size -> strid
        self.order = 0
        self.dist: Any = None  # the torch.distributed module (set by install)
        self.fault = False

    def seq_cell(self, key: Union[str, Tuple[str, int]]) -> Cell:
        """The counter of ``key`` (a group name, or (group name, peer) for p2p): a cell
        holding the last sequence number issued, created at 0 (``new_cell``)."""
        cell = self.seq.get(key)
        if cell is None:
            cell = self.seq[key] = self.new_cell()
        return cell

    def clear_groups(self) -> None:
        """Forget the cached group entries (the process group was (re)initialised or
        destroyed); the sequence counters stay, by group name."""
        self.groups.clear()
