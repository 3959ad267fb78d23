"""The type checker is clean where it is strict (setup.cfg [mypy]): the analysis, the
diagnosis contract and the report (issue 8)."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRICT = ["-p", "hangtrace.tracer.analyze", "-p", "hangtrace.tracer.report", "-p", "hangtrace.tracer.ring",
          "-m", "hangtrace.tracer.diagnosis", "-m", "hangtrace.tracer.snapshot", "-m", "hangtrace.tracer.process_model",
          "-m", "hangtrace.tracer.pipeline",
          # every function annotated, bodies checked (setup.cfg's second section)
          "-p", "hangtrace.tracer.collect", "-p", "hangtrace.tracer.watch", "-m", "hangtrace.tracer.api",
          "-m", "hangtrace.hooks.torch_dist", "-m", "hangtrace.hooks.torch_completion", "-m", "hangtrace.hooks.torch_groups",
          "-m", "hangtrace.hooks.torch_specs", "-m", "hangtrace.hooks.torch_state"]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e .[test])")
def test_mypy_strict_packages_are_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "setup.cfg"),
                          "--no-incremental", "--cache-dir", os.devnull] + STRICT,
                         cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout
