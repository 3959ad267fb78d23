"""The type checker is clean where it is strict (setup.cfg [mypy]): the analysis, the
diagnosis contract and the report; every function of the collectors, the watcher, the API and
the torch hooks annotated and checked; and every function under hangtrace/ annotated (issue 8)."""

import ast
import importlib.util
import os
import subprocess
import sys
from typing import List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRICT = [
    "-p",
    "hangtrace.tracer.analyze",
    "-p",
    "hangtrace.tracer.stackmodel",
    "-p",
    "hangtrace.tracer.report",
    "-p",
    "hangtrace.tracer.ring",
    "-m",
    "hangtrace.tracer.diagnosis",
    "-m",
    "hangtrace.tracer.snapshot",
    "-m",
    "hangtrace.tracer.process_model",
    "-m",
    "hangtrace.tracer.pipeline",
    # every function annotated, bodies checked (setup.cfg's second section)
    "-p",
    "hangtrace.tracer.collect",
    "-p",
    "hangtrace.tracer.watch",
    "-m",
    "hangtrace.tracer.api",
    "-p",
    "hangtrace.hooks",
]


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e .[test])"
)
def test_mypy_strict_packages_are_clean() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            os.path.join(ROOT, "setup.cfg"),
            "--no-incremental",
            "--cache-dir",
            os.devnull,
        ]
        + STRICT,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout


def _unannotated(path: str) -> List[str]:
    """``file:line name(...)`` of every function in ``path`` with a parameter (other than
    self/cls) or the return (``__init__`` excepted) not annotated."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
        missing = [p.arg for p in params if p.annotation is None and p.arg not in ("self", "cls")]
        if node.returns is None and node.name != "__init__":
            missing.append("return")
        if missing:
            out.append(
                "%s:%d %s (%s)" % (os.path.relpath(path, ROOT), node.lineno, node.name, ", ".join(missing))
            )
    return out


def test_every_function_is_annotated() -> None:
    """New code keeps its annotations (issue 8): every def under hangtrace/, nested ones too."""
    bad = []
    for d, dirs, files in os.walk(os.path.join(ROOT, "hangtrace")):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        bad += [x for f in sorted(files) if f.endswith(".py") for x in _unannotated(os.path.join(d, f))]
    assert not bad, "functions without annotations:\n" + "\n".join(bad)
