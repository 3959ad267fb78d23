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
    mem_last_ns: int
    strings: Optional[Dict[str, int]]
    def __init__(
        self,
        mm: Any,
        nslots: int,
        threads: Dict[int, Any],
        phases: Dict[int, List[Tuple[int, str]]],
        thread_id: Callable[[], int],
        intern: Callable[[str], int],
    ) -> None: ...
    def issue(
        self,
        kind: int,
        op: int,
        group: int,
        seq: int,
        numel: int,
        shape: int,
        dtype: int,
        peer: int,
        flags: int,
    ) -> int: ...
    def complete(self, idx: int, err: Optional[str] = None) -> None: ...
    def slot(
        self,
        kind: int,
        op: int,
        group: int,
        seq: int,
        numel: int,
        shape: int,
        dtype: int,
        peer: int,
        state: int,
        flags: int,
        err: Optional[str],
        a0: int,
        a1: int,
        a2: int,
        a3: int,
        a4: int,
    ) -> int: ...
    def touch(self) -> None: ...
    def mem_host(
        self,
        source: int,
        host: int,
        statm_fd: int,
        page: int,
        usage_fd: int,
        oom_fd: int,
        swap: int,
        limit: int,
    ) -> int: ...
    def phase_in(self, name: str, step: Optional[int], mem: Optional[Tuple[int, ...]]) -> None: ...
    def phase_out(self, name: str, mem: Optional[Tuple[int, ...]], error: Optional[str] = None) -> None: ...
    def step_to(self, n: int, mem: Optional[Tuple[int, ...]], gap_ns: int) -> None: ...
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
    def clear_groups(self) -> None: ...

class FindSpec:
    """``PathFinder.find_spec``'s replacement (``hooks/importhook.py``): called as
    ``(cls, fullname, path=None, target=None)``, returns ``find(fullname, path, target)``
    or, for a key of ``hooks``, ``hooked(spec, fullname, path, target)``."""
    def __init__(
        self, find: Callable[..., Any], hooks: Dict[str, Any], hooked: Callable[..., Any]
    ) -> None: ...
    def __call__(self, cls: Any, fullname: str, path: Any = None, target: Any = None) -> Any: ...

class Counter:
    """A sequence counter cell: a one-item sequence ``[n]`` (``cell[0] += 1``) that C
    advances in place."""
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> int: ...
    def __setitem__(self, i: int, value: int) -> None: ...

class Busy:
    """``torch_dist._busy``: {thread ident: 1} for threads inside a wrapped call; the
    calling thread's entry is a thread-local flag (the C wrappers skip the dict)."""
    def __contains__(self, ident: object) -> bool: ...
    def __getitem__(self, ident: int) -> int: ...
    def __setitem__(self, ident: int, value: int) -> None: ...
    def __delitem__(self, ident: int) -> None: ...
    def __len__(self) -> int: ...

def probe_tensor_layout(probes: List[Tuple[Any, int, Tuple[int, ...], int]]) -> bool: ...
def tensor_layout() -> Any: ...

class Call:
    """The C recording call of one wrapped torch.distributed function (``torch_dist._fast_call``)."""

    __wrapped__: Callable[..., Any]
    name: str
    def __init__(self, *args: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def set_tensor_type(tensor_type: type) -> None: ...
def direct_getters() -> bool: ...
def exit_status_target(fd: int, exit_off: int) -> None: ...
