"""Types of the optional C extension ``_fastrec.c`` (the C hot path of the recorder and of the
torch.distributed wrappers): for the type checker only."""
from typing import Any, Callable, Dict, List, Optional, Tuple

class Ring:
    """The ring writer (``fastrecorder._FastRecorder``)."""
    nslots: int
    counter: int
    last: int
    progress: int
    step: int
    cur_phase: int
    def __init__(self, mm: Any, nslots: int, threads: Dict[int, Any], phases: Dict[int, List[Tuple[int, str]]],
                 thread_id: Callable[[], int], intern: Callable[[str], int]) -> None: ...
    def issue(self, kind: int, op: int, group: int, seq: int, numel: int, shape: int, dtype: int, peer: int,
              flags: int) -> int: ...
    def complete(self, idx: int, err: Optional[str] = None) -> None: ...
    def slot(self, kind: int, op: int, group: int, seq: int, numel: int, shape: int, dtype: int, peer: int,
             state: int, flags: int, err: Optional[str], a0: int, a1: int, a2: int, a3: int, a4: int) -> int: ...
    def touch(self) -> None: ...
    def release(self) -> None: ...

class StateBase:
    """Fields of ``torch_dist.State`` the C wrappers read directly."""
    rec: Any
    fault: bool
    @property
    def fast(self) -> bool: ...
    log: Any
    seq: Any
    groups: Any
    dtypes: Any
    shapes: Any

class Call:
    """The C recording call of one wrapped torch.distributed function (``torch_dist._fast_call``)."""
    __wrapped__: Callable[..., Any]
    name: str
    def __init__(self, *args: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def set_tensor_type(tensor_type: type) -> None: ...
