"""``state.is_own_cli``: which command lines are hangtrace's own CLI (never traced, issue 38)."""

import pytest

from hangtrace.hooks.state import is_own_cli

PY = "/usr/bin/python3"


@pytest.mark.parametrize(
    "argv",
    [
        [PY, "/venv/bin/hangtrace", "dump", "/tmp/r"],
        [PY, "-m", "hangtrace", "analyze", "x"],
        [PY, "-u", "-X", "dev", "-m", "hangtrace"],
        [PY, "-mhangtrace", "records"],
        [PY, "-m", "hangtrace.cli"],
        ["hangtrace", "hangtrace"],
    ],
)
def test_own_cli(argv):
    assert is_own_cli(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [PY, "train.py", "hangtrace"],
        [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "hangtrace"],
        [PY, "-c", "import hangtrace", "hangtrace"],
        [PY, "-m", "hangtrace.tracer.watch.watcher"],
        [PY, "/x/hangtrace_job.py"],
        [PY],
        [PY, "-"],
        [],
    ],
)
def test_not_own_cli(argv):
    assert not is_own_cli(argv)
