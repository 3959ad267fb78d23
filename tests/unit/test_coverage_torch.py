"""Every collective and p2p function of the installed torch.distributed is recorded by our
hooks (``torch_specs.SPECS``, ``BATCH_OP``) or listed in ``torch_specs.NOT_APPLICABLE``
with a reason (issue 10). A torch that adds one we do not handle fails here.

The candidates come from the installed torch, not from a hand list:

1. the ``ProcessGroup`` methods that launch an operation: those whose pybind signature
   (in their docstring) returns a ``Work``, plus those named ``*barrier``
   (``monitored_barrier`` returns None) -- ``allreduce``, ``_allgather_base``, ``send``,
   ``recv_anysource``...;
2. every function (public or private) of ``torch.distributed.distributed_c10d`` whose
   source calls one of those methods (``group.allreduce(...)``);
3. then, to a fixed point, every function of ``distributed_c10d`` or ``torch.distributed``
   whose source calls such a function by name (``send`` calls ``isend``,
   ``send_object_list`` calls ``send``, ``breakpoint`` calls ``barrier``...).

The public ones (no leading ``_``), reached as ``torch.distributed.X`` or
``torch.distributed.distributed_c10d.X``, are the candidates.
"""

import inspect
import re
import types
from typing import Callable, Dict, FrozenSet, Set, Tuple

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from hangtrace.hooks.torchdist import torch_specs  # noqa: E402
from hangtrace.tracer.ring import layout as F  # noqa: E402

c10d = dist.distributed_c10d
P2P_METHODS = frozenset(("send", "recv", "recv_anysource"))
# launches whatever was queued in its block (collectives or, for batch_isend_irecv, p2p):
# what it reaches says nothing of the kind of a function that uses it
COALESCING = frozenset(("_coalescing_manager",))
_RETURNS_WORK = re.compile(r"\)\s*->\s*(?:c10d::|torch\._C\._distributed_c10d\.)Work\b")


def launch_methods() -> Set[str]:
    """ProcessGroup methods that launch a collective or p2p operation (module docstring)."""
    out = set()
    for name in dir(dist.ProcessGroup):
        if name.startswith("__"):
            continue
        doc = getattr(getattr(dist.ProcessGroup, name), "__doc__", None) or ""
        if _RETURNS_WORK.search(doc) or name.endswith("barrier"):
            out.add(name)
    return out


def source(f: Callable[..., object]) -> str:
    """The code of ``f`` (decorators unwrapped) without docstrings and comments."""
    try:
        text = inspect.getsource(inspect.unwrap(f))
    except (OSError, TypeError):
        return ""
    text = re.sub(r'(?s)""".*?"""|\'\'\'.*?\'\'\'', "", text)
    return "\n".join(line.split("#")[0] for line in text.splitlines())


def functions() -> Dict[Tuple[str, str], types.FunctionType]:
    """(module, name) -> Python function, of both namespaces (defined under torch.distributed)."""
    out: Dict[Tuple[str, str], types.FunctionType] = {}
    for mod in (c10d, dist):
        for name, obj in list(vars(mod).items()):
            f = inspect.unwrap(obj) if callable(obj) else None
            if isinstance(f, types.FunctionType) and f.__module__.startswith("torch.distributed"):
                out[(mod.__name__, name)] = f
    return out


def reach(opaque: FrozenSet[str] = frozenset()) -> Dict[str, Set[str]]:
    """Name -> launching ProcessGroup methods it reaches, for every function that reaches one
    (calls to the functions in ``opaque`` are not followed)."""
    methods = launch_methods()
    funcs = {k: source(f) for k, f in functions().items()}
    meth = re.compile(r"\.(%s)\(" % "|".join(sorted(methods, key=len, reverse=True)))
    reached: Dict[str, Set[str]] = {}
    for (mod, name), text in funcs.items():
        found = set(meth.findall(text)) if mod == c10d.__name__ else set()
        if found and name not in opaque:
            reached.setdefault(name, set()).update(found)
    changed = bool(reached)
    while changed:
        changed = False
        call = re.compile(r"(?<![\w.])(%s)\(" % "|".join(sorted(reached, key=len, reverse=True)))
        for (_, name), text in funcs.items():
            got = set().union(*(reached[c] for c in set(call.findall(text)) if c != name) or [set()])
            if name not in opaque and not got <= reached.get(name, set()):
                reached.setdefault(name, set()).update(got)
                changed = True
    return reached


def candidates() -> Set[str]:
    """The public collective/p2p functions of the installed torch (module docstring)."""
    return {n for n in reach() if not n.startswith("_") and (hasattr(dist, n) or hasattr(c10d, n))}


def unhandled() -> Set[str]:
    handled = set(torch_specs.SPECS) | {torch_specs.BATCH_OP} | set(torch_specs.NOT_APPLICABLE)
    return candidates() - handled


def test_the_derivation_finds_what_we_know() -> None:
    """Guards the derivation itself: if torch changed its docstrings or sources so that it
    found nothing, the coverage test below would pass vacuously."""
    assert {"allreduce", "broadcast", "send", "recv", "barrier", "monitored_barrier"} <= launch_methods()
    assert not {"rank", "size", "abort", "shutdown", "_get_backend"} & launch_methods()
    found = candidates()
    assert {
        "all_reduce",
        "all_gather_object",
        "broadcast_object_list",
        "send",
        "recv",
        "isend",
        "irecv",
        "barrier",
        "monitored_barrier",
        "batch_isend_irecv",
        "all_to_all_single",
    } <= found
    assert (
        not {"get_rank", "get_world_size", "is_initialized", "get_backend", "destroy_process_group"} & found
    )


def test_every_collective_and_p2p_function_is_wrapped_or_not_applicable() -> None:
    missing = unhandled()
    assert not missing, (
        "torch %s has collective/p2p functions hangtrace neither wraps nor lists: %s. Add each "
        "to hangtrace/hooks/torchdist/torch_specs.py SPECS (and layout.OPS), or to NOT_APPLICABLE with "
        "the reason." % (torch.__version__, sorted(missing))
    )


def test_a_new_collective_would_fail_the_coverage_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check is live: a function of distributed_c10d that calls a ProcessGroup collective
    (as a future torch's would) is reported."""

    def all_reduce_twice(tensor: "torch.Tensor", group: "dist.ProcessGroup") -> None:
        group.allreduce([tensor]).wait()

    all_reduce_twice.__module__ = c10d.__name__
    monkeypatch.setattr(c10d, "all_reduce_twice", all_reduce_twice, raising=False)
    assert unhandled() == {"all_reduce_twice"}


def test_the_tables_agree_with_torch() -> None:
    """SPECS and NOT_APPLICABLE are disjoint, every reason is a sentence, every wrapped
    function torch has launches an operation, is p2p exactly when it reaches only
    send/recv, has an op id, and has the parameters its spec names."""
    assert not set(torch_specs.SPECS) & set(torch_specs.NOT_APPLICABLE)
    assert all(isinstance(r, str) and len(r) > 10 for r in torch_specs.NOT_APPLICABLE.values())
    reached = reach(COALESCING)
    for name, (tparam, peers, is_p2p, pkind) in torch_specs.SPECS.items():
        assert name in F.OP_IDS, name
        f = getattr(c10d, name, None)
        if f is None:
            continue  # an older torch: install() skips it
        assert name in reached, "%s launches no operation in torch %s" % (name, torch.__version__)
        assert is_p2p == (reached[name] <= P2P_METHODS), (name, sorted(reached[name]))
        params = inspect.signature(f).parameters
        assert "group" in params, name
        assert (tparam is None) == (pkind is None), name
        assert tparam is None or tparam in params, (name, tparam)
        assert all(p in params for p in peers), (name, peers)


def test_param_names_agree_with_inspect_signature() -> None:
    """``torch_specs.param_names`` (what ``torch_dist.install`` reads instead of building
    a Signature per function) gives inspect's names for every wrapped function of the
    installed torch and for the shapes a function can have; None where it does not apply."""
    import functools

    names = [n for n in torch_specs.SPECS if hasattr(c10d, n)]
    assert len(names) > 20
    for n in names:
        fn = getattr(c10d, n)
        assert torch_specs.param_names(fn) == list(inspect.signature(fn).parameters), n

    def f(a, b=1, /, c=2, *args, d, e=3, **kw):  # type: ignore[no-untyped-def]
        x = 1  # a local variable: not a parameter
        return x

    def g(a, *, b):  # type: ignore[no-untyped-def]
        pass

    @functools.wraps(f)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return f(*args, **kwargs)

    for fn in (f, g, wrapper, lambda: None, lambda *a: None, lambda **k: None):
        assert torch_specs.param_names(fn) == list(inspect.signature(fn).parameters)

    def sig(a, b):  # type: ignore[no-untyped-def]
        pass

    sig.__signature__ = inspect.Signature([inspect.Parameter("z", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    assert torch_specs.param_names(sig) is None
    assert torch_specs.param_names(functools.partial(f, 1)) is None
    assert torch_specs.param_names(len) is None
