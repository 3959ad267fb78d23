"""A traced process's forked child freezes the objects it inherited (``gc.freeze()``,
issue 13: its collections would otherwise write every inherited object's header, a
copy-on-write fault per page of the parent's heap); ``HANGTRACE_FORK_GC_FREEZE=0`` turns
it off; the parent's collector is left as it was; untraced processes are untouched."""

import subprocess
import sys

from jobs import base_env

PROG = """
import gc, os
junk = [[i] for i in range(5000)]  # tracked objects the child inherits
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"%d" % gc.get_freeze_count())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(int(os.read(r, 64)), gc.get_freeze_count())
"""


def _run(tmp_path, traced=True, **extra):
    out = subprocess.run(
        [sys.executable, "-c", PROG],
        env=base_env(tmp_path / "run", traced, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    child, parent = (int(x) for x in out.stdout.split())
    return child, parent


def test_forked_child_freezes_what_it_inherited(tmp_path):
    child, parent = _run(tmp_path)
    assert child >= 5000 and parent == 0


def test_fork_gc_freeze_off_and_untraced(tmp_path):
    assert _run(tmp_path, HANGTRACE_FORK_GC_FREEZE="0") == (0, 0)
    assert _run(tmp_path, traced=False) == (0, 0)
