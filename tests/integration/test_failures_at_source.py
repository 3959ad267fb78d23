"""Issue 9 item 2: failures are recorded at their source, before a launcher or a framework
swallows them (torch.multiprocessing.spawn, multiprocessing.Process, unawaited asyncio
tasks). Real processes; the events are read back from the ring files."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import base_env  # noqa: E402
from hangtrace.tracer.collect.rings import load_run  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "caught_failures.py")


def _events(run_dir, mode):
    out = subprocess.run(
        [sys.executable, SCRIPT, mode], env=base_env(run_dir), timeout=120, capture_output=True, text=True
    )
    snap = load_run(str(run_dir), live_facts=False)
    found = []
    for p in snap.processes:
        for e in p.events:
            if e.get("event") in ("exception", "task_exception"):
                found.append((p, e))
    return out, found


@pytest.mark.parametrize(
    "mode,caught_by,etype,message,exit_code",
    [
        ("spawn", "exit-while-handling", "ValueError", "bad batch shape 1", 1),
        ("fork", "multiprocessing", "KeyError", "'missing key'", 1),
        ("spawnmp", "multiprocessing", "KeyError", "'missing key'", 1),
    ],
)
def test_launcher_swallowed_exception_is_recorded(tmp_path, mode, caught_by, etype, message, exit_code):
    out, found = _events(tmp_path / "run", mode)
    assert len(found) == 1, (out.stdout, out.stderr, found)
    proc, ev = found[0]
    assert (ev["type"], ev["message"], ev["caught_by"]) == (etype, message, caught_by)
    assert etype in ev["traceback"]
    assert proc.state == "exited" and proc.exit_code == exit_code


def test_unawaited_asyncio_task_exception_is_recorded(tmp_path):
    out, found = _events(tmp_path / "run", "asyncio")
    assert len(found) == 1, (out.stdout, out.stderr)
    proc, ev = found[0]
    assert ev["event"] == "task_exception" and ev["caught_by"] == "asyncio-task"
    assert (ev["type"], ev["message"]) == ("RuntimeError", "tokenizer server returned 503")
    assert ev["coro"] == "bad"
    # the program's own behaviour is unchanged: asyncio still reports it at collection
    assert "Task exception was never retrieved" in out.stderr
    assert proc.exit_code == 0


def test_awaited_task_exception_is_not_recorded(tmp_path):
    code = (
        "import asyncio\n"
        "async def bad():\n    raise RuntimeError('handled')\n"
        "async def main():\n"
        "    try:\n        await asyncio.create_task(bad())\n"
        "    except RuntimeError:\n        print('caught')\n"
        "asyncio.run(main())\n"
    )
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-c", code], env=base_env(run), timeout=60, capture_output=True, text=True
    )
    assert out.stdout.strip() == "caught", out.stderr
    snap = load_run(str(run), live_facts=False)
    assert not [
        e for p in snap.processes for e in p.events if e.get("event") in ("exception", "task_exception")
    ]
