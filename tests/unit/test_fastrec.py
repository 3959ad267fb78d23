"""The C hot path (``hangtrace.hooks._fastrec``) against the pure-Python one.

Every check here runs through both paths (``mode`` "c" and "py"; HANGTRACE_PURE_PYTHON
selects the path): the same script of recorder calls and of real torch.distributed calls
on a world-size-1 gloo group must give the same records, byte for byte apart from
times. The C half is skipped, with the reason, when the extension is not built.
"""

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from hangtrace.hooks.record import recorder as R
from hangtrace.tracer import config
from hangtrace.tracer.ring import layout as F
from hangtrace.tracer.ring import reader as RD

HAVE_C = R._fastrec is not None
NO_C = "hangtrace.hooks._fastrec is not built (no C compiler when hangtrace was installed)"
MODES = ["c", "py"]
TIME_FIELDS = ("t_mono_ns", "t_wall_ns", "t_end_mono_ns")


class Log:
    def __init__(self):
        self.lines = []

    def __call__(self, msg, key=None):
        self.lines.append((msg, key))


def use_mode(monkeypatch, mode):
    if mode == "c" and not HAVE_C:
        pytest.skip(NO_C)
    monkeypatch.setenv(config.PURE_PYTHON, "0" if mode == "c" else "1")


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    use_mode(monkeypatch, request.param)
    return request.param


def new_recorder(path, mode, nslots=64, name="run"):
    os.makedirs(path, exist_ok=True)
    rec = R.Recorder(str(path), name, nslots, Log())
    assert isinstance(rec, R._FastRecorder) == (mode == "c")
    return rec


def no_addr(text):
    return re.sub(r"0x[0-9a-f]+", "0x?", text) if isinstance(text, str) else text


def normalized(records):
    return [{k: no_addr(v) for k, v in r.items() if k not in TIME_FIELDS} for r in records]


def slot_bytes_without_times(path, nslots):
    """The slot area with the three time fields of every slot zeroed."""
    with open(path, "rb") as f:
        f.seek(F.HEADER_SIZE)
        data = bytearray(f.read(nslots * F.SLOT_SIZE))
    for base in range(0, len(data), F.SLOT_SIZE):
        data[base + 56 : base + 72] = bytes(16)
        data[base + 80 : base + 88] = bytes(8)
    return bytes(data)


# --- recorder level --------------------------------------------------------------------
def recorder_script(rec):
    """Every kind of recorder write; returns the indices of the collective records."""
    rec.set_rank(1, 0, 2)
    rec.event("start", argv=["x"])
    rec.group_created({"op": "new_group", "name": "7", "ranks": [0, 1], "order": 0, "member": True})
    rec.phase_enter("train", step=3)
    g, s = rec.intern("7"), rec.intern("4x2")
    out = [rec.issue(F.K_COLL, F.OP_IDS["all_reduce"], g, 1, 8, s, F.DTYPE_IDS["float32"], -1, 0)]
    rec.complete(out[-1])
    out.append(rec.issue(F.K_P2P, F.OP_IDS["isend"], g, 1, 8, s, F.DTYPE_IDS["int64"], 1, F.F_ASYNC))
    rec.complete(out[-1], err="RuntimeError: Connection closed by peer")
    out.append(rec.issue(F.K_COLL, F.OP_IDS["broadcast"], g, 2, -1, 0, F.DTYPE_IDS["object"], 0, 0))
    rec.complete(idx=out[-1])
    th = threading.Thread(
        target=lambda: out.append(rec.issue(F.K_COLL, 1, g, 3, 1, s, 1, -1, 0)), name="side"
    )
    th.start()
    th.join()
    rec.phase_enter("inner")
    out.append(rec.issue(F.K_COLL, 1, g, 4, 2**40, s, 1, 2**31 - 1, 7))
    rec.phase_exit("inner", error="ValueError: x")
    rec.step(9)
    rec.heartbeat()
    if hasattr(rec, "memory"):
        rec.memory(1, rec.intern("host"), 10, 20, 30, 0, -1)
    with pytest.raises(Exception):  # struct.error on both paths: the index is used up
        rec.issue(F.K_COLL, 1, g, 5, 1, s, 300, -1, 0)
    for i in range(70):  # wrap the 64-slot ring; complete the oldest late (left alone)
        out.append(rec.issue(F.K_COLL, 1, g, 10 + i, i, s, 1, -1, 0))
        if i % 3 == 0:
            rec.complete(out[-1])
    rec.complete(out[0])
    rec.complete(out[1], err="late")
    rec.complete(out[-2], err="E" * 5000)  # cut to 4000 characters
    rec.phase_exit("train")
    rec.mark_exit(0)
    return out


def test_recorder_writes_the_same_records_on_both_paths(tmp_path, monkeypatch):
    if not HAVE_C:
        pytest.skip(NO_C)
    rings = {}
    for m in MODES:
        use_mode(monkeypatch, m)
        rec = new_recorder(tmp_path / m, m)
        t0 = time.time_ns()
        idxs = recorder_script(rec)
        t1 = time.time_ns()
        ring = RD.read_ring(rec.path)
        rings[m] = (rec, ring, idxs)
        for r in ring.records:
            assert t0 <= r["t_wall_ns"] <= t1 and r["t_mono_ns"] > 0
            assert r["t_end_mono_ns"] is None or r["t_end_mono_ns"] >= r["t_mono_ns"]
        rec.close()
    (rc, c, ic), (rp, p, ip) = rings["c"], rings["py"]
    assert ic == ip
    assert normalized(c.records) == normalized(p.records)
    byidx = {r["idx"]: r for r in c.records}
    assert len(c.records) == 64 and byidx[ic[-2]]["error"] == "E" * 4000 and ic[0] not in byidx
    assert c.records[-1]["kind"] == "phase_exit" and byidx[ic[-1]]["state"] == "completed"
    assert slot_bytes_without_times(rc.path, 64) == slot_bytes_without_times(rp.path, 64)
    hc, hp = dict(c.header), dict(p.header)
    for h in (hc, hp):
        for k in ("start_wall_ns", "start_mono_ns", "progress_mono_ns", "progress_wall_ns", "exit_wall_ns"):
            assert h.pop(k) > 0
    assert hc == hp and hc["progress_count"] > 20 and hc["next_idx"] == ic[-1]
    assert c.strings == p.strings and c.groups == p.groups and c.meta == p.meta
    assert rc.log.lines == rp.log.lines == []


def test_issue_complete_fields_and_header(tmp_path, mode):
    rec = new_recorder(tmp_path, mode)
    rec.phase_enter("ph", step=4)
    i = rec.issue(
        F.K_P2P,
        F.OP_IDS["irecv"],
        rec.intern("g"),
        7,
        12,
        rec.intern("3x4"),
        F.DTYPE_IDS["bfloat16"],
        5,
        F.F_ASYNC | F.F_BATCH,
    )
    h = RD.read_ring(rec.path).header
    assert (h["next_idx"], h["inflight_idx"]) == (i, i)
    before = h["progress_count"]
    rec.complete(i)
    ring = RD.read_ring(rec.path)
    (r,) = [x for x in ring.records if x["idx"] == i]
    assert {
        k: r[k]
        for k in (
            "kind",
            "op",
            "group",
            "seq",
            "numel",
            "shape",
            "dtype",
            "peer",
            "async_op",
            "batch",
            "thread",
            "phase",
            "step",
            "state",
            "error",
        )
    } == dict(
        kind="p2p",
        op="irecv",
        group="g",
        seq=7,
        numel=12,
        shape="3x4",
        dtype="bfloat16",
        peer=5,
        async_op=True,
        batch=True,
        thread="MainThread",
        phase="ph",
        step=4,
        state="completed",
        error=None,
    )
    assert ring.header["inflight_idx"] == 0 and ring.header["progress_count"] == before + 1
    assert ring.header["progress_mono_ns"] == r["t_end_mono_ns"]


def test_slot_indices_are_unique_across_threads(tmp_path, mode):
    rec = new_recorder(tmp_path, mode, nslots=1 << 14)
    seen, n, k = [], 4, 2000
    start = RD.read_ring(rec.path).header["progress_count"]
    together = threading.Barrier(n)  # all alive at once: distinct thread idents

    def work():
        together.wait()
        mine = []
        for s in range(k):
            i = rec.issue(F.K_COLL, 1, 0, s, 1, 0, 1, -1, 0)
            rec.complete(i)
            mine.append(i)
        seen.extend(mine)
        together.wait()

    ts = [threading.Thread(target=work, name="w%d" % j) for j in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(seen) == list(range(1, n * k + 1))
    ring = RD.read_ring(rec.path)
    assert len(ring.records) == n * k and all(r["state"] == "completed" for r in ring.records)
    assert {r["thread"] for r in ring.records} == {"w%d" % j for j in range(n)}
    assert ring.header["progress_count"] == start + n * k


# --- torch.distributed wrappers ----------------------------------------------------------
torch = None


@pytest.fixture(scope="module")
def pg():
    global torch
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from hangtrace.hooks.torchdist import torch_install
    from jobs import free_port

    assert not torch_install._installed, "hooks left installed by another test"
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.fixture
def hooked(pg, tmp_path, mode):
    from hangtrace.hooks.torchdist import torch_install

    rec = new_recorder(tmp_path, mode, nslots=256, name="wrappers")
    orig = pg.all_reduce
    torch_install.install(pg, rec, rec.log)
    call = pg.all_reduce  # the installed function itself: the C Call or the Python closure
    assert (HAVE_C and isinstance(call, R._fastrec.Call)) == (mode == "c"), call
    assert call.__hangtrace_wrapped__ is orig and call.__wrapped__ is orig
    try:
        yield rec
    finally:
        torch_install.uninstall()
        assert pg.all_reduce is orig
        rec.close()


def wait_completed(rec, deadline_s=5.0):
    end = time.time() + deadline_s
    while time.time() < end:
        recs = RD.read_ring(rec.path).records
        if all(r["state"] != "issued" for r in recs if r["kind"] in ("collective", "p2p")):
            return recs
        time.sleep(0.01)
    return RD.read_ring(rec.path).records


def wrapper_script(dist, rec, g):
    """Real calls covering every branch of the wrapper; returns what the user saw."""
    seen = []
    t = torch.ones(4, 2)
    seen.append(dist.all_reduce(t))
    seen.append(dist.all_reduce(tensor=t, op=dist.ReduceOp.SUM, group=None, async_op=False))
    w = dist.all_reduce(t, async_op=True)
    seen.append(type(w).__name__)
    w.wait()
    dist.all_reduce(t, group=g)
    dist.broadcast(t, src=0)
    dist.broadcast(t, 0, g)
    dist.broadcast(t, group=g, group_src=0)
    dist.reduce(t, dst=0)
    out = [torch.zeros(4, 2)]
    dist.all_gather(out, t)
    dist.gather(t, gather_list=[torch.zeros(4, 2)], dst=0)
    dist.scatter(torch.zeros(4, 2), scatter_list=[t], src=0)
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})  # nested all_gather: recorded once
    seen.append(objs)
    lst = [1, "x"]
    dist.broadcast_object_list(lst, src=0)
    dist.barrier()
    dist.all_reduce(torch.ones(3, dtype=torch.int64))
    dist.all_reduce(torch.ones((), dtype=torch.float64))
    rec.phase_enter("phase-a", step=2)
    th = threading.Thread(target=lambda: dist.all_reduce(torch.ones(1)), name="side-thread")
    th.start()
    th.join()
    rec.phase_exit("phase-a")
    for bad in (
        lambda: dist.all_reduce([1, 2]),  # wrong type: payload recorded as zeros
        lambda: dist.all_reduce(torch.ones(2), op="bogus"),
        lambda: dist.reduce_scatter(torch.zeros(1), [torch.ones(1)]),  # (list payload)
        lambda: dist.broadcast(t, src=2**40),
    ):  # root does not fit the record: not recorded
        try:
            bad()
            seen.append("no error")
        except Exception as e:
            seen.append("%s: %s" % (type(e).__name__, no_addr(str(e))))
    return seen


def test_wrappers_record_the_same_on_both_paths(pg, tmp_path, monkeypatch):
    from hangtrace.hooks.torchdist import torch_install

    results = {}
    g = pg.new_group([0])  # before both installs: the same group records on both paths
    for m in MODES:
        if m == "c" and not HAVE_C:
            continue
        use_mode(monkeypatch, m)
        rec = new_recorder(tmp_path / m, m, nslots=256)
        torch_install.install(pg, rec, rec.log)
        try:
            seen = wrapper_script(pg, rec, g)
        finally:
            torch_install.uninstall()
        recs = wait_completed(rec)
        results[m] = (seen, recs, rec)
    seen, recs, rec = results["py"]
    colls = [r for r in recs if r["kind"] in ("collective", "p2p")]
    ops = [r["op"] for r in colls]
    assert ops == ["all_reduce"] * 4 + ["broadcast"] * 3 + [
        "reduce",
        "all_gather",
        "gather",
        "scatter",
        "all_gather_object",
        "broadcast_object_list",
        "barrier",
        "all_reduce",
        "all_reduce",
        "all_reduce",
        "all_reduce",
        "all_reduce",
        "reduce_scatter",
    ]
    assert all(r["state"] in ("completed", "failed") for r in recs)  # (no half-written record)
    by = {r["idx"]: r for r in colls}
    first = colls[0]
    assert (first["numel"], first["shape"], first["dtype"], first["state"], first["seq"]) == (
        8,
        "4x2",
        "float32",
        "completed",
        1,
    )
    assert colls[2]["async_op"] and colls[2]["state"] == "completed"
    assert colls[3]["group"] != first["group"] and colls[3]["seq"] == 1
    assert [r["peer"] for r in colls[4:7]] == [0, 0, 0]
    assert colls[11]["dtype"] == "object" and colls[11]["numel"] == -1
    assert colls[12]["numel"] == 2 and colls[13]["op"] == "barrier"
    assert (colls[14]["dtype"], colls[14]["shape"]) == ("int64", "3")
    assert (colls[15]["shape"], colls[15]["dtype"]) == ("scalar", "float64")
    assert (colls[16]["thread"], colls[16]["phase"], colls[16]["step"]) == ("side-thread", "phase-a", 2)
    assert (colls[17]["numel"], colls[17]["state"]) == (0, "failed") and colls[17]["error"].startswith(
        "TypeError"
    )
    assert all(r["state"] == "completed" for r in colls[:17])
    assert (colls[-1]["numel"], colls[-1]["shape"], colls[-1]["state"]) == (1, "1", "completed")
    assert [k for _, k in rec.log.lines] == ["rec-broadcast"]
    assert seen[-1].startswith(("ValueError", "RuntimeError")) and seen[2] == "Work"
    assert len(by) == len(colls)
    if "c" not in results:
        pytest.skip(NO_C + " (Python half checked)")
    cseen, crecs, crec = results["c"]
    assert cseen == seen
    assert normalized(crecs) == normalized(recs)
    clines = [(m, k) for m, k in crec.log.lines if k != "tensor-layout"]  # the C path's probe, said once
    assert [no_addr(m) for m, _ in clines] == [no_addr(m) for m, _ in rec.log.lines]
    assert [k for _, k in clines] == [k for _, k in rec.log.lines]


def test_return_values_and_exceptions_are_the_originals(pg, tmp_path, mode):
    from hangtrace.hooks.torchdist import torch_install

    c10d = pg.distributed_c10d
    orig = c10d.all_reduce
    sentinel, boom = object(), KeyError("boom")
    calls = []

    def fake(tensor, op=None, group=None, async_op=False):
        calls.append((tensor, op, group, async_op))
        if op == "raise":
            raise boom
        return sentinel

    fake.__signature__ = __import__("inspect").signature(orig)
    c10d.all_reduce = pg.all_reduce = fake
    rec = new_recorder(tmp_path, mode)
    try:
        torch_install.install(pg, rec, rec.log)
        t = torch.ones(2)
        assert pg.all_reduce(t) is sentinel
        assert calls[-1][0] is t
        with pytest.raises(KeyError) as ei:
            pg.all_reduce(t, op="raise")
        assert ei.value is boom
        assert pg.all_reduce(t, None, None, False) is sentinel
    finally:
        torch_install.uninstall()
        c10d.all_reduce = pg.all_reduce = orig
    recs = [r for r in RD.read_ring(rec.path).records if r["kind"] == "collective"]
    assert [(r["state"], r["error"]) for r in recs] == [
        ("completed", None),
        ("failed", "KeyError: 'boom'"),
        ("completed", None),
    ]
    assert rec.log.lines == []


def test_recorder_fault_never_reaches_the_user(hooked, pg, mode):
    from hangtrace.hooks.torchdist import torch_dist

    torch_dist._state.fault = True
    t = torch.ones(2) * 2
    assert pg.all_reduce(t) is None and t.tolist() == [2.0, 2.0]
    pg.all_reduce(t)
    torch_dist._state.fault = False
    pg.all_reduce(t)
    recs = [r for r in RD.read_ring(hooked.path).records if r["kind"] == "collective"]
    assert [r["seq"] for r in recs] == [1]
    assert [k for _, k in hooked.log.lines] == ["rec-all_reduce"] * 2  # the run log keeps one per key
    assert "hangtrace test fault" in hooked.log.lines[0][0]


def test_state_none_passes_through(hooked, pg, mode):
    from hangtrace.hooks.torchdist import torch_dist

    st, torch_dist._state = torch_dist._state, None  # what a failed fork set-up does
    try:
        pg.all_reduce(torch.ones(1))
    finally:
        torch_dist._state = st
    pg.all_reduce(torch.ones(1))
    recs = [r for r in RD.read_ring(hooked.path).records if r["kind"] == "collective"]
    assert [r["seq"] for r in recs] == [1]


class _UsesCollectiveAsAttribute:
    op = None  # set to the installed wrapper: read through an instance it binds like a function


def test_installed_function_looks_like_the_original(hooked, pg, mode):
    """The installed wrapper is a function-like object with the original's identity: name,
    qualified name, module, docstring, signature; it pickles by reference (to itself, the
    object installed under that name) and binds like a function (no wrapt: see
    tests/integration/test_hooks_roles.py for a real traced process)."""
    import inspect
    import pickle
    from hangtrace.hooks.torchdist import torch_install

    w, orig = pg.all_reduce, torch_install._installed["all_reduce"]
    assert w is not orig and pg.distributed_c10d.all_reduce is w
    for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
        assert getattr(w, attr) == getattr(orig, attr), attr
    assert inspect.signature(w) == inspect.signature(orig)
    assert pickle.loads(pickle.dumps(w)) is w
    _UsesCollectiveAsAttribute.op = w
    bound = _UsesCollectiveAsAttribute().op
    assert bound.__func__ is w and bound.__self__ is not None
    t = torch.ones(3)
    assert _UsesCollectiveAsAttribute.op(t) is None and t.tolist() == [1.0] * 3  # through the class: unbound
    recs = [r for r in RD.read_ring(hooked.path).records if r["kind"] == "collective"]
    assert [r["numel"] for r in recs] == [3]


def test_after_fork_recorder_swap_records_into_the_new_ring(hooked, pg, tmp_path, mode):
    from hangtrace.hooks.torchdist import torch_dist

    new = new_recorder(tmp_path / "child", mode)
    torch_dist.reset_after_fork(new)
    pg.all_reduce(torch.ones(5))
    assert [r["numel"] for r in RD.read_ring(new.path).records if r["kind"] == "collective"] == [5]
    assert [r for r in RD.read_ring(hooked.path).records if r["kind"] == "collective"] == []
    new.close()


def test_pure_python_path_passes_the_format_and_wrapper_tests():
    """tests/unit/test_format.py and test_wrappers.py with HANGTRACE_PURE_PYTHON=1 (by
    default they run through the C path when it is built)."""
    if not HAVE_C:
        pytest.skip(NO_C + " (those tests already run the Python path)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **{config.PURE_PYTHON: "1"})
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            os.path.join(here, "test_format.py"),
            os.path.join(here, "test_wrappers.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(here),
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def test_host_memory_sample_in_c_is_the_python_sample(tmp_path, monkeypatch):
    """``Ring.mem_host`` (the C recorder's host sample, hooks/mem/memory.py) writes the record
    the Python path (``CgroupFiles._sample_host``) writes, from the same descriptors: this
    process's real ``/proc/PID/statm`` and crafted cgroup files (v1 and v2 oom lines, a
    first-line oom_kill, blanks, garbage, an empty file, a directory that cannot be read),
    and none at all."""
    if not HAVE_C:
        pytest.skip(NO_C)
    from hangtrace.hooks.mem import sampler as HS

    def fd_of(name, text):
        p = tmp_path / name
        p.write_bytes(text)
        return os.open(str(p), os.O_RDONLY)

    statm = os.open("/proc/self/statm", os.O_RDONLY)
    cases = [  # (statm, usage, oom)
        (statm, fd_of("u1", b"471859200\n"), fd_of("o1", b"oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")),
        (
            statm,
            fd_of("u2", b"  12 \n"),
            fd_of("o2", b"low 0\nhigh 0\nmax 3\noom 1\noom_kill 7\noom_group_kill 0\n"),
        ),
        (fd_of("s3", b"100 50 3 1 0 9 0\n"), fd_of("u3", b"12x\n"), fd_of("o3", b"oom_kill 5")),
        (fd_of("s4", b""), fd_of("u4", b""), fd_of("o4", b"oom_kill_disable 1\nnothing 1\n")),
        (os.open(str(tmp_path), os.O_RDONLY), os.open(str(tmp_path), os.O_RDONLY), None),
        (None, None, None),
    ]
    recs = {}
    for m in MODES:
        use_mode(monkeypatch, m)
        rec = new_recorder(tmp_path / m, m)
        s = HS.Sampler(rec, rec.log, 1.0, str(tmp_path))
        assert (getattr(getattr(rec, "_fast", None), "mem_host", None) is not None) == (m == "c")
        for st, us, oo in cases:
            s._statm, s._usage, s._oom = st, us, oo
            s.swap, s.limit = 4096, 1 << 30
            s.sample(F.MEM_STEP)
        recs[m] = [r for r in RD.read_ring(rec.path).records if r["kind"] == "memory"][-len(cases) :]
        rec.close()
    for r in recs["c"][:2] + recs["py"][:2]:  # this process's own RSS moves between the two runs
        assert r["a"][0] > 0
        r["a"] = (0,) + tuple(r["a"][1:])
    assert normalized(recs["c"]) == normalized(recs["py"])
    got = [r["a"] for r in recs["c"]]
    assert [a[2] for a in got] == [471859200, 12, -1, -1, -1, -1] and [a[4] for a in got] == [
        2,
        7,
        5,
        -1,
        -1,
        -1,
    ]
    assert got[2][0] == 50 * os.sysconf("SC_PAGE_SIZE") and [a[0] for a in got[3:]] == [-1] * 3
    assert all(a[1] == 4096 and a[3] == 1 << 30 for a in got)
