"""The C hot path's shortcuts (``hangtrace/hooks/_fastrec.c``) against the records they
must not change: the thread-local nesting guard (``_fastrec.Busy``), the State's one-entry
caches of the last group, shape and dtype, torch.Tensor's getters called directly, and the
wall time derived from the monotonic clock. Each test changes what a cache keys on and
checks that the record follows.
"""

import threading
import time

import pytest

from hangtrace.tracer.ring import reader as RD
from test_fastrec import HAVE_C, NO_C, hooked, mode, new_recorder, pg  # noqa: F401 (pytest fixtures)

pytestmark = pytest.mark.skipif(not HAVE_C, reason=NO_C)


def collectives(rec):
    return [r for r in RD.read_ring(rec.path).records if r["kind"] == "collective"]


def test_busy_is_a_mapping_of_thread_idents():
    from hangtrace.hooks import _fastrec

    b, me = _fastrec.Busy(), threading.get_ident()
    assert me not in b and len(b) == 0
    b[me] = 1
    assert me in b and b[me] == 1 and len(b) == 1
    other = []
    th = threading.Thread(target=lambda: other.append(me in b))
    th.start()
    th.join()
    assert other == [False]  # the flag is this thread's own
    b[12345] = 1  # another thread's ident: kept in a dict, as before
    assert 12345 in b and len(b) == 2
    del b[me], b[12345]
    assert me not in b and len(b) == 0
    with pytest.raises(KeyError):
        del b[me]
    with pytest.raises(TypeError):
        "x" in b


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_shape_dtype_and_group_caches_follow_their_keys(hooked, pg, mode):
    import torch
    from hangtrace.hooks.torchdist import torch_dist

    a = torch.ones(4, 2)
    for t in (
        a,
        a,
        torch.ones(4, 2),
        torch.ones(8),
        torch.ones(8, dtype=torch.float64),
        torch.ones(2, 4),
        torch.ones(4, 2, dtype=torch.int64),
        torch.ones(2**20),
        torch.ones(2**20 + 1),
    ):
        pg.all_reduce(t)
    got = [(r["numel"], r["shape"], r["dtype"]) for r in collectives(hooked)]
    assert got == [(8, "4x2", "float32")] * 3 + [
        (8, "8", "float32"),
        (8, "8", "float64"),
        (8, "2x4", "float32"),
        (8, "4x2", "int64"),
        (2**20, "1048576", "float32"),
        (2**20 + 1, "1048577", "float32"),
    ]
    # a new process group under the same key (None: the default group) after clear_groups()
    c10d = pg.distributed_c10d
    real = c10d._get_process_group_name
    torch_dist._state.clear_groups()
    c10d._get_process_group_name = lambda g: "renamed"
    try:
        pg.all_reduce(a)
    finally:
        c10d._get_process_group_name = real
    torch_dist._state.clear_groups()
    pg.all_reduce(a)
    last = collectives(hooked)[-2:]
    assert [(r["group"], r["seq"]) for r in last] == [("renamed", 1), ("0", 10)]


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_direct_getters_follow_changes_to_torch_tensor(hooked, pg, mode):
    import torch
    from hangtrace.hooks import _fastrec

    assert _fastrec.direct_getters()
    torch.Tensor._hangtrace_probe = 1  # an unrelated change to the type: looked up again, still direct
    try:
        assert _fastrec.direct_getters()
    finally:
        del torch.Tensor._hangtrace_probe
    real = torch.Tensor.shape
    torch.Tensor.shape = property(lambda self: torch.Size([7, 7]))  # patched: read as an attribute
    try:
        assert not _fastrec.direct_getters()
        pg.all_reduce(torch.ones(3))
    finally:
        torch.Tensor.shape = real
    assert _fastrec.direct_getters()
    pg.all_reduce(torch.ones(3))
    assert [(r["numel"], r["shape"]) for r in collectives(hooked)] == [(49, "7x7"), (3, "3")]


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_wall_time_of_a_record_is_the_wall_clock(hooked, pg, mode):
    import torch

    t = torch.ones(1)
    for _ in range(3):
        before = time.time_ns()
        pg.all_reduce(t)
        after = time.time_ns()
        rec = collectives(hooked)[-1]
        # the wall time is the monotonic one plus an offset read at most 100 ms earlier:
        # within the call's window, give or take a clock slew (< 50 us) and the readings' order
        assert before - 1_000_000 <= rec["t_wall_ns"] <= after + 1_000_000
        time.sleep(0.15)  # past the offset's re-read interval


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_sizes_and_dtype_read_from_the_tensorimpl_match_the_getters(hooked, pg, mode):
    import torch
    from hangtrace.hooks import _fastrec
    from hangtrace.hooks.record import tensor_layout

    assert tensor_layout.probe(torch).startswith("{'cdata_off'"), _fastrec.tensor_layout()
    base = torch.ones(6, 10)
    moved = torch.ones(5)
    cases = [
        torch.ones(()),
        torch.ones(3),
        torch.ones(3),
        torch.ones(2, 3),
        torch.ones(2, 3, 4, 5, 6),
        torch.ones(2, 1, 1, 1, 1, 3),  # 6 dims: not inline, getters
        base.t(),
        base[:, 1],
        torch.ones(3, dtype=torch.int64),
        torch.ones(3, dtype=torch.bfloat16),
        torch.nn.Parameter(torch.ones(3, 2)),  # a subclass: getters
        moved,
    ]
    want = [
        (1, "", "float32"),
        (3, "3", "float32"),
        (3, "3", "float32"),
        (6, "2x3", "float32"),
        (720, "2x3x4x5x6", "float32"),
        (6, "2x1x1x1x1x3", "float32"),
        (60, "10x6", "float32"),
        (6, "6", "float32"),
        (3, "3", "int64"),
        (3, "3", "bfloat16"),
        (6, "3x2", "float32"),
        (5, "5", "float32"),
    ]
    for t in cases:
        pg.all_reduce(t)
    # the same Python object changed in place: sizes (resize_) and dtype and sizes (.data)
    moved.resize_(2, 2)
    pg.all_reduce(moved)
    moved.data = torch.ones(7, dtype=torch.float64)
    pg.all_reduce(moved)
    moved.data = torch.ones(7, dtype=torch.float32)
    pg.all_reduce(moved)
    want += [(4, "2x2", "float32"), (7, "7", "float64"), (7, "7", "float32")]
    got = [(r["numel"], r["shape"], r["dtype"]) for r in collectives(hooked)]
    shape_of_scalar = got[0][1]
    want[0] = (1, shape_of_scalar, "float32")  # a 0-dim tensor's shape text, as the getters give it
    assert got == want
    assert isinstance(_fastrec.tensor_layout(), dict)  # every cache miss agreed with the getters


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_a_probe_that_does_not_fit_leaves_the_getters_in_use(hooked, pg, mode):
    import torch
    from hangtrace.hooks import _fastrec
    from hangtrace.hooks.record import tensor_layout

    ts = [torch.ones(3, 4), torch.ones(5), torch.ones(2, 2, 2), torch.ones(6, dtype=torch.int64)]
    try:
        wrong_sizes = [(t, t._cdata, (9,) * t.dim(), i) for i, t in enumerate(ts)]
        assert _fastrec.probe_tensor_layout(wrong_sizes) is False
        assert "sizes" in _fastrec.tensor_layout()
        other_impl = [(t, ts[(i + 1) % 4]._cdata, tuple(t.shape), i) for i, t in enumerate(ts)]
        assert _fastrec.probe_tensor_layout(other_impl) is False
        assert "TensorImpl" in _fastrec.tensor_layout()
        assert _fastrec.probe_tensor_layout(ts[:2]) is False  # not (tensor, address, sizes, label)
        pg.all_reduce(torch.ones(4, 3, dtype=torch.float64))
        assert [(r["numel"], r["shape"], r["dtype"]) for r in collectives(hooked)] == [(12, "4x3", "float64")]
    finally:
        assert tensor_layout.probe(torch).startswith("{")


@pytest.mark.parametrize("mode", ["c"], indirect=True)
def test_sequence_counters_are_counter_cells_advanced_in_c(hooked, pg, mode):
    import torch
    from hangtrace.hooks import _fastrec
    from hangtrace.hooks.torchdist import torch_dist

    c = _fastrec.Counter()
    assert len(c) == 1 and c[0] == 0 and c[-1] == 0
    c[0] += 1
    c[0] += 2**40  # the Python paths' ``cell[0] += 1`` on the same cell
    assert c[0] == 2**40 + 1 and repr(c) == "Counter([%d])" % (2**40 + 1)
    with pytest.raises(IndexError):
        c[1]
    with pytest.raises(TypeError):
        del c[0]
    with pytest.raises(TypeError):
        c[0] = "1"
    t = torch.ones(2)
    for _ in range(3):
        pg.all_reduce(t)
    cell = torch_dist._state.seq["0"]
    assert isinstance(cell, _fastrec.Counter) and cell[0] == 3
    cell[0] += 5  # a Python path advancing the same counter
    pg.all_reduce(t)
    assert [r["seq"] for r in collectives(hooked)] == [1, 2, 3, 9]
