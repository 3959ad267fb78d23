"""Issue 8 with issue 12's environment record: a process started traced writes its record
once it matters - when it starts joining a process group (before the rendezvous), when it
has lived one memory-sampler interval, when it ends with a non-zero code or an uncaught
exception - and not at all when it ends cleanly within its first interval without joining.
Without the sampler (``HANGTRACE_MEM=0``) the record is written at start, as before. Real
traced processes; the rendezvous case is a real gloo ``init_process_group`` of world size
2 with one rank only, which blocks."""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from jobs import base_env, free_port

pytest.importorskip("torch")


def _records(run) -> dict:
    out = {}
    for f in glob.glob(os.path.join(str(run), "env", "*.json")):
        with open(f) as fh:
            d = json.load(fh)
        out[d["pid"]] = d
    return out


def _run(tmp_path, name: str, code: str, **extra) -> tuple:
    run = tmp_path / name
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=base_env(run, **extra)
    )
    return p, _records(run)


@pytest.mark.parametrize(
    "name, code, extra, reason",
    [
        ("clean", "pass", {}, None),
        ("exit3", "import sys; sys.exit(3)", {}, "exit"),
        ("raises", "1/0", {}, "exit"),
        # the sampler's thread starts at the first collection one interval in (hooks/mem/memclock.py)
        (
            "lived",
            "import gc, time\ntime.sleep(0.4); gc.collect(); time.sleep(0.6)",
            {"HANGTRACE_MEM_INTERVAL_S": "0.2"},
            "lived",
        ),
        ("no-sampler", "pass", {"HANGTRACE_MEM": "0"}, "bootstrap"),
    ],
)
def test_a_process_writes_its_record_once_it_matters(tmp_path, name, code, extra, reason):
    p, recs = _run(tmp_path, name, code, **extra)
    if reason is None:
        assert p.returncode == 0, p.stderr[-2000:]
        assert recs == {}, "a clean sub-second process wrote %r" % [r["reason"] for r in recs.values()]
    else:
        assert len(recs) == 1, (recs, p.stderr[-2000:])
        rec = next(iter(recs.values()))
        assert rec["reason"] == reason
        assert rec["mappings"], "the record has no mappings"


def test_a_rank_blocked_in_the_rendezvous_has_its_record(tmp_path):
    """World size 2, only rank 0 started: ``init_process_group`` waits for rank 1. The
    record (with torch's libraries and the rendezvous variables) is there while it waits."""
    run = tmp_path / "rdzv"
    code = "import torch.distributed as dist\ndist.init_process_group('gloo', rank=0, world_size=2)\n"
    env = base_env(run, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), HANGTRACE_MEM_INTERVAL_S="60")
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 90
        recs: dict = {}
        while time.time() < deadline and not recs:
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            time.sleep(0.2)
            recs = _records(run)
        assert recs, "no environment record while the rank waits in the rendezvous"
        rec = recs[p.pid]
        assert rec["reason"] == "join"
        assert rec["environ"].get("MASTER_ADDR") == "127.0.0.1"
        assert any("libtorch" in m[-1] or "libc10" in m[-1] for m in rec["mappings"])
    finally:
        p.kill()
        p.wait()


def test_a_process_in_the_rendezvous_is_the_rank_it_asked_for(tmp_path):
    """RANK=0 inherited (a spawn child of a parent that set RANK, found by a blind job); the
    call asks for rank 1 of 3 with WORLD_SIZE=2 in the environment. Before the rendezvous
    returns, the ring header says rank 1 asked for at the call (rank_source 2, world size
    from the environment), and a 'join' event holds what the call asked for."""
    from hangtrace.tracer.ring import layout as F
    from hangtrace.tracer.ring.reader import read_ring

    run = tmp_path / "join"
    port = free_port()
    code = "import torch.distributed as dist\ndist.init_process_group('gloo', rank=1, world_size=3)\n"
    env = base_env(
        run,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        RANK="0",
        WORLD_SIZE="2",
        HANGTRACE_MEM_INTERVAL_S="60",
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline, ring = time.time() + 90, None
        while time.time() < deadline:
            assert p.poll() is None, p.stderr.read().decode()[-2000:]
            paths = glob.glob(str(run / ("ring-*-%d.htr" % p.pid)))
            ring = read_ring(paths[0]) if paths else None
            if ring is not None and any(e.get("event") == "join" for e in ring.events):
                break
            time.sleep(0.2)
        assert ring is not None, "no ring"
        join = [e for e in ring.events if e.get("event") == "join"]
        assert join and {
            k: join[-1][k] for k in ("rank", "world_size", "master", "init", "backend", "env_world_size")
        } == {
            "rank": 1,
            "world_size": 3,
            "master": "127.0.0.1:%s" % port,
            "init": "env",
            "backend": "gloo",
            "env_world_size": 2,
        }, ring.events
        h = ring.header
        assert (h["rank"], h["world_size"], h["rank_source"]) == (1, 2, F.RANK_FROM_JOIN), h
    finally:
        p.kill()
        p.wait()


def test_a_record_written_before_the_program_set_its_rendezvous_variables_is_renewed_at_the_join(tmp_path):
    """A Ray actor lives past its first sampler tick (its record written, reason 'lived'), then
    its ``setup`` sets MASTER_ADDR/MASTER_PORT and joins: the record is written again at the
    join, so env-diff does not compare the old environment with its peers' (blind helper 86:
    "rank 2 runs differently from its peers: MASTER_ADDR=(unset)")."""
    code = (
        "import gc, os, time\ntime.sleep(0.4); gc.collect(); time.sleep(0.6)\n"
        "import torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='%d')\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "dist.destroy_process_group()\n" % free_port()
    )
    p, recs = _run(tmp_path, "setup", code, HANGTRACE_MEM_INTERVAL_S="0.2")
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(recs) == 1, recs
    rec = next(iter(recs.values()))
    assert rec["reason"] == "join", rec["reason"]
    assert (rec.get("environ") or {}).get("MASTER_ADDR") == "127.0.0.1", sorted(rec.get("environ") or {})
