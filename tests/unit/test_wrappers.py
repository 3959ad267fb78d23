"""torch.distributed wrappers on a real world-size-1 gloo group in this process.

No HANGTRACE environment: the hooks are installed directly with
``torch_install.install(dist, recorder, log)`` on a Recorder in tmp_path, and uninstalled
after each test.
"""

import functools
import inspect
import re
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from jobs import free_port  # noqa: E402
from hangtrace.hooks.torchdist import torch_install, torch_specs  # noqa: E402
from hangtrace.hooks.record.recorder import Recorder  # noqa: E402
from hangtrace.tracer.ring import reader as R

c10d = dist.distributed_c10d
NAMES = [
    n
    for n in list(torch_specs.SPECS)
    + [torch_specs.BATCH_OP, "init_process_group", "new_group", "destroy_process_group"]
    if hasattr(c10d, n)
]


class Log:
    def __init__(self):
        self.lines = []

    def __call__(self, msg, key=None):
        self.lines.append((msg, key))


@pytest.fixture(scope="module")
def pg():
    assert not torch_install._installed, "hooks left installed by another test"
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def originals(pg):
    """The unwrapped functions, checked to be restored after the test."""
    orig = {n: getattr(c10d, n) for n in NAMES}
    orig_dist = {n: getattr(dist, n) for n in NAMES if hasattr(dist, n)}
    yield orig
    torch_install.uninstall()
    for n in NAMES:
        assert getattr(c10d, n) is orig[n], n
    for n, f in orig_dist.items():
        assert getattr(dist, n) is f, n


@pytest.fixture
def hooked(tmp_path, originals):
    rec = Recorder(str(tmp_path), "wrappers", 256, Log())
    assert torch_install.install(dist, rec, rec.log) == len(NAMES)
    yield rec
    torch_install.uninstall()
    rec.close()


def no_addr(text):
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


def records(rec, kind=("collective", "p2p")):
    return [r for r in R.read_ring(rec.path).records if r["kind"] in kind]


def test_wrappers_look_like_the_originals(hooked, originals):
    for n in NAMES:
        w, orig = getattr(c10d, n), originals[n]
        assert w is not orig and w.__wrapped__ is orig, n
        assert w.__name__ == orig.__name__ and w.__qualname__ == orig.__qualname__, n
        assert w.__doc__ == orig.__doc__ and w.__module__ == orig.__module__, n
        assert inspect.signature(w) == inspect.signature(orig), n
        if hasattr(dist, n):
            assert getattr(dist, n) is w, n  # torch.distributed.X is distributed_c10d.X


def test_install_twice_does_not_stack(hooked, originals):
    assert torch_install.install(dist, hooked, hooked.log) == 0
    for n in NAMES:
        assert getattr(c10d, n).__wrapped__ is originals[n], n
    dist.all_reduce(torch.ones(2))
    assert [(r["op"], r["seq"]) for r in records(hooked)] == [("all_reduce", 1)]


def test_uninstall_restores_and_reinstall_records_into_the_new_recorder(tmp_path, originals):
    (tmp_path / "a").mkdir()
    a = Recorder(str(tmp_path / "a"), "a", 64, Log())
    torch_install.install(dist, a, a.log)
    dist.all_reduce(torch.ones(1))
    torch_install.uninstall()
    for n in NAMES:
        assert getattr(c10d, n) is originals[n], n
    dist.all_reduce(torch.ones(1))  # not recorded anywhere
    (tmp_path / "b").mkdir()
    b = Recorder(str(tmp_path / "b"), "b", 64, Log())
    torch_install.install(dist, b, b.log)
    dist.all_reduce(torch.ones(3))
    torch_install.uninstall()
    assert [r["numel"] for r in records(a)] == [1]
    assert [r["numel"] for r in records(b)] == [3]
    a.close()
    b.close()


def test_sync_call_returns_none_and_is_recorded(hooked):
    t = torch.ones(4) * 3
    assert dist.all_reduce(t) is None
    assert t.tolist() == [3.0] * 4
    assert dist.broadcast(t, src=0) is None
    (ar, bc) = records(hooked)
    assert (ar["op"], ar["numel"], ar["dtype"], ar["shape"], ar["state"], ar["async_op"]) == (
        "all_reduce",
        4,
        "float32",
        "4",
        "completed",
        False,
    )
    assert (bc["op"], bc["peer"], bc["seq"], bc["group"]) == ("broadcast", 0, 2, ar["group"])


def test_async_call_returns_the_exact_work_and_args(tmp_path, originals):
    seen = []
    orig = originals["all_reduce"]

    @functools.wraps(orig)
    def spy(*args, **kwargs):
        r = orig(*args, **kwargs)
        seen.append((args, kwargs, r))
        return r

    c10d.all_reduce = dist.all_reduce = spy
    rec = Recorder(str(tmp_path), "spy", 64, Log())
    try:
        torch_install.install(dist, rec, rec.log)
        t = torch.ones(2, 3)
        op = dist.ReduceOp.SUM
        w = dist.all_reduce(t, op=op, async_op=True)
        args, kwargs, ret = seen[-1]
        assert w is ret and w is not None
        assert args[0] is t and kwargs == {"op": op, "async_op": True}
        assert w.wait() is True
        r = dist.all_reduce(t)
        assert r is None and seen[-1][2] is None
    finally:
        torch_install.uninstall()
        c10d.all_reduce = dist.all_reduce = orig
        rec.close()
    recs = [r for r in R.read_ring(rec.path).records if r["kind"] == "collective"]
    assert [(r["async_op"], r["shape"]) for r in recs] == [(True, "2x3"), (False, "2x3")]
    # the async record completes through the Work's future
    deadline = time.time() + 5
    while records(rec)[0]["state"] != "completed" and time.time() < deadline:
        time.sleep(0.01)
    assert records(rec)[0]["state"] == "completed"


@pytest.mark.parametrize("case", ["wrong_type", "bad_group", "bad_op"])
def test_exceptions_are_exactly_the_originals(hooked, originals, case):
    bogus_group = object()
    call = {
        "wrong_type": lambda f: f([1, 2]),
        "bad_group": lambda f: f(torch.ones(2), group=bogus_group),
        "bad_op": lambda f: f(torch.ones(2), op="bogus"),
    }[case]
    with pytest.raises(Exception) as plain:
        call(originals["all_reduce"])
    with pytest.raises(Exception) as wrapped:
        call(dist.all_reduce)
    assert type(wrapped.value) is type(plain.value)
    # (pybind messages name a fresh options object: compare without addresses)
    assert no_addr(str(wrapped.value)) == no_addr(str(plain.value))
    (r,) = records(hooked)
    assert r["op"] == "all_reduce" and r["state"] == "failed"
    assert no_addr(r["error"]) == no_addr("%s: %s" % (type(plain.value).__name__, plain.value))
    # the next call is recorded normally (no nesting state left behind)
    dist.all_reduce(torch.ones(1))
    assert [x["state"] for x in records(hooked)] == ["failed", "completed"]


def test_nested_calls_are_recorded_once(hooked):
    objs = [None]
    dist.all_gather_object(objs, {"x": 1})
    assert objs == [{"x": 1}]
    out = [torch.zeros(2)]
    dist.all_gather(out, torch.ones(2))
    lst = [None]
    dist.broadcast_object_list(lst, src=0)
    recs = records(hooked)
    assert [(r["op"], r["seq"], r["numel"], r["dtype"]) for r in recs] == [
        ("all_gather_object", 1, -1, "object"),
        ("all_gather", 2, 2, "float32"),
        ("broadcast_object_list", 3, 1, "object"),
    ]
    assert all(r["state"] == "completed" for r in recs)


def test_group_ops_are_recorded(hooked):
    g = dist.new_group([0])
    dist.all_reduce(torch.ones(1), group=g)
    ring = R.read_ring(hooked.path)
    assert ring.groups[0]["op"] == "existing" and ring.groups[0]["ranks"] == [0]
    assert ring.groups[-1]["op"] == "new_group" and ring.groups[-1]["ranks"] == [0]
    name = ring.groups[-1]["name"]
    (r,) = records(hooked)
    assert (r["group"], r["seq"]) == (name, 1)
    assert ring.header["rank"] == 0 and ring.header["world_size"] == 1


NEW_213 = ("all_gather_single", "reduce_scatter_single", "all_gather_coalesced", "all_reduce_coalesced")


@pytest.mark.skipif(not all(hasattr(c10d, n) for n in NEW_213), reason="torch before 2.13")
@pytest.mark.filterwarnings("ignore::FutureWarning")  # the *_coalesced functions are deprecated
def test_single_and_coalesced_collectives_are_recorded(hooked) -> None:
    dist.all_gather_single(torch.zeros(4), torch.ones(4))
    dist.reduce_scatter_single(torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    dist.all_gather_coalesced([[torch.zeros(2), torch.zeros(3)]], [torch.ones(2), torch.ones(3)])
    dist.all_reduce_coalesced([torch.ones(2, 5), torch.ones(3)])
    dist.all_reduce_coalesced(torch.ones(3, dtype=torch.int32))  # one tensor, not a list
    fut = dist.all_reduce_coalesced([torch.ones(2)], async_op=True)  # a Future, not a Work
    fut.wait()
    got = [(r["op"], r["seq"], r["numel"], r["shape"], r["dtype"], r["async_op"]) for r in records(hooked)]
    assert got == [
        ("all_gather_single", 1, 4, "4", "float32", False),
        ("reduce_scatter_single", 2, 2, "2", "float64", False),
        ("all_gather_coalesced", 3, 5, "2", "float32", False),
        ("all_reduce_coalesced", 4, 13, "2x5", "float32", False),
        ("all_reduce_coalesced", 5, 3, "3", "int32", False),
        ("all_reduce_coalesced", 6, 2, "2", "float32", True),
    ]
    # the async one completes through the poller, which reads a Future's done()
    deadline = time.time() + 5
    while records(hooked)[-1]["state"] != "completed" and time.time() < deadline:
        time.sleep(0.01)
    assert all(r["state"] == "completed" for r in records(hooked))
