"""Golden verdicts: every analysis scenario of the unit tests, diagnosed, compared with
the stored output (the behaviour oracle of the analysis refactoring, issue 8).

Inputs: ``golden/<test name>.in.json.gz`` - the snapshots the analysis/report unit tests
diagnose (captured by ``golden/capture.py``). Expected: ``golden/<test name>.out.json`` -
per input (``.out.json.gz`` when large), ``diagnosis_json(diagnose(snapshot, ...))``, its verdict paragraph and its text
report. Nothing is volatile (every time comes from the snapshot).

Regenerate (then review the diff before committing):

* ``HANGTRACE_REGEN_GOLDEN=1 python -m pytest tests/unit/test_golden.py`` rewrites the
  expected outputs from the stored inputs with the current code;
* ``golden/examples/example_<fault>.in.json.gz``: the snapshot a real run of
  ``examples/train_faults.py --fault <fault>`` under ``hangtrace run --stall-s 8
  --stop-on-stall`` stored (processes, records, stacks), made offline-deterministic by
  freezing it as JSON; expected outputs computed by the analysis before the issue-8
  refactoring (``golden/examples/README.md``). Never re-captured by the command below.
* ``HANGTRACE_REGEN_GOLDEN=capture python -m pytest tests/unit/test_golden.py`` first
  re-captures the inputs by running the scenario tests (tests/unit/rules/,
  test_diagnose.py, test_robustness_analysis.py, test_memory.py, test_memory_monitor.py, test_report.py)
  with the capture plugin.
"""

import glob
import gzip
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest

from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.report.text import diagnosis_json, text_report, verdict_paragraph
from hangtrace.tracer.snapshot import ProcessInfo, Snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")
REGEN = os.environ.get("HANGTRACE_REGEN_GOLDEN", "")
#: expected outputs longer than this (characters) are stored gzipped (``.out.json.gz``)
BIG = 256 * 1024
SCENARIO_TESTS = [
    "rules",
    "test_diagnose.py",
    "test_robustness_analysis.py",
    "test_memory.py",
    "test_memory_monitor.py",
    "test_report.py",
]


def snapshot_from_json(d: Dict[str, Any]) -> Snapshot:
    """Rebuild a Snapshot from ``golden.capture.snapshot_to_json`` output."""
    d = dict(d)
    d["processes"] = [ProcessInfo(**p) for p in d.get("processes") or ()]
    return Snapshot(**d)


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """The outputs compared for one captured input."""
    s = snapshot_from_json(case["snapshot"])
    call = dict(case["call"])
    if call.get("envs"):  # environment records (a dict each, with its rank)
        from hangtrace.tracer.envfacts import from_json

        call["envs"] = [from_json(e)._replace(rank=int(e.get("rank", -1))) for e in call["envs"]]
    d = diagnose(s, **call)
    out = json.loads(json.dumps(diagnosis_json(d), default=list))
    return {"diagnosis": out, "paragraph": verdict_paragraph(d), "text_report": text_report(d, s)}


def _capture() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE)), HERE]))
    env.pop("HANGTRACE_REGEN_GOLDEN", None)
    for f in glob.glob(os.path.join(GOLDEN, "*.in.json.gz")):
        os.unlink(f)
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "golden.capture"]
        + SCENARIO_TESTS,
        cwd=HERE,
        env=env,
        check=True,
    )


if REGEN == "capture":
    _capture()

NAMES = sorted(
    os.path.relpath(f, GOLDEN)[: -len(".in.json.gz")]
    for pattern in ("*.in.json.gz", os.path.join("examples", "*.in.json.gz"))
    for f in glob.glob(os.path.join(GOLDEN, pattern))
)


def test_golden_inputs_present() -> None:
    assert len(NAMES) >= 50, "golden inputs missing: regenerate with HANGTRACE_REGEN_GOLDEN=capture"


@pytest.mark.parametrize("name", NAMES)
def test_golden(name: str) -> None:
    with gzip.open(os.path.join(GOLDEN, name + ".in.json.gz"), "rt") as f:
        cases: List[Dict[str, Any]] = json.load(f)
    got = [run_case(c) for c in cases]
    out_path = os.path.join(GOLDEN, name + ".out.json")
    if REGEN:
        text = json.dumps(got, indent=1, sort_keys=True) + "\n"
        for old in (out_path, out_path + ".gz"):
            if os.path.exists(old):
                os.unlink(old)
        if len(text) > BIG:  # the 400 random snapshots: kept small on disk
            with open(out_path + ".gz", "wb") as f:
                f.write(gzip.compress(text.encode(), mtime=0))
        else:
            with open(out_path, "w") as f:
                f.write(text)
        return
    if os.path.exists(out_path + ".gz"):
        with gzip.open(out_path + ".gz", "rt") as f:
            want = json.load(f)
    else:
        with open(out_path) as f:
            want = json.load(f)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g["diagnosis"] == w["diagnosis"], "%s case %d: diagnosis differs" % (name, i)
        assert g["paragraph"] == w["paragraph"], "%s case %d: paragraph differs" % (name, i)
        assert g["text_report"] == w["text_report"], "%s case %d: text report differs" % (name, i)
