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
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=base_env(run, **extra))
    return p, _records(run)


@pytest.mark.parametrize("name, code, extra, reason", [
    ("clean", "pass", {}, None),
    ("exit3", "import sys; sys.exit(3)", {}, "exit"),
    ("raises", "1/0", {}, "exit"),
    # the sampler's thread starts at the first collection one interval in (hooks/memclock.py)
    ("lived", "import gc, time\ntime.sleep(0.4); gc.collect(); time.sleep(0.6)",
     {"HANGTRACE_MEM_INTERVAL_S": "0.2"}, "lived"),
    ("no-sampler", "pass", {"HANGTRACE_MEM": "0"}, "bootstrap"),
])
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
    code = ("import torch.distributed as dist\n"
            "dist.init_process_group('gloo', rank=0, world_size=2)\n")
    env = base_env(run, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), HANGTRACE_MEM_INTERVAL_S="60")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
