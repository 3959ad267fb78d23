"""Blind jobs of three training frameworks on top of torch.distributed
(``tests/integration/blind/frameworks/``): PyTorch Lightning (``lightning/``, started with
plain ``python job.py``: Lightning re-runs the script for rank 1 itself), Hugging Face
``transformers.Trainer`` (``hf/hf_*.py``, under ``torchrun`` and, where the job lists it in
``LAUNCHERS``, ``accelerate launch --multi_gpu --num_processes 2``) and plain Accelerate
(``hf/acc_*.py``, under ``accelerate launch``). Written from the README alone, by someone who
had not read the analysis code; each file tells its incident and holds ``LAUNCH``,
``NPROC``, ``EXPECT`` (and ``LAUNCHERS`` when it runs under more than one launcher). Files
whose name starts with ``_`` are shared set-up, not jobs.

Each job runs as a user would: ``hangtrace run --stall-s 15 --stop-on-stall -- <launcher>
FILE``; the FIRST verdict of the run must have the expected kind (``EXPECT['kind']``: one
kind, or a list of acceptable kinds) and culprit ranks, and the cause where one is given; a
job whose ``EXPECT['kind']`` is None (a clean run) must produce no verdict at all.
``EXPECT['where']`` (the user's function the verdict should point at) is reported, not
asserted.

The jobs take 10-60 s each (2 CPU ranks, DataLoader workers, framework imports), so by
default (and in ``.ci/run``) only ``CI_SET`` runs, one job per launcher; all of them with
``HANGTRACE_BLIND=frameworks`` or ``HANGTRACE_BLIND=all``, where a job the tool gets wrong
today (``WRONG``) is an ``xfail(strict=True)`` saying what the tool said. A job whose
framework cannot be imported is skipped saying which. The author's table:
``blind/frameworks/lightning/RESULTS.md`` and ``blind/frameworks/hf/RESULTS.md``.
"""

import glob
import importlib.util
import os
import shutil
import sys

import pytest

from jobs import blind_consts, run_blind_entry

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blind", "frameworks")
#: this harness's folders only (other folders of blind/frameworks have their own harness)
FOLDERS = ("lightning", "hf")
JOBS = sorted(
    p
    for folder in FOLDERS
    for p in glob.glob(os.path.join(HERE, folder, "*.py"))
    if not os.path.basename(p).startswith("_")
)
ENABLED = os.environ.get("HANGTRACE_BLIND") in ("frameworks", "all")
#: the representative slice run by default: one job per launcher that the tool gets right today
CI_SET = {"lt_raise[python]", "hf_sigkill[torchrun]", "acc_raise[accelerate]"}
#: wrong verdicts on the current tree, 2026-12-07 (job id -> what the tool said; RESULTS.md)
WRONG = {
    # (acc_rank0_barrier right since 13:20: history without a repeating step, by frequency)
    "acc_skip_step[accelerate]": "collective-mismatch naming ranks 0-1, not rank 1: without step "
    "records, one cycle of Accelerate's every-5-steps gather cannot tell which rank skipped",
}


def needs(path, launcher):
    """(module names that must import, framework name) for a job and its launcher."""
    name = os.path.basename(path)
    if name.startswith("lt_"):
        return (("pytorch_lightning", "lightning"), "PyTorch Lightning (pip install pytorch-lightning)")
    mods = []
    if name.startswith("hf_"):
        mods.append(("transformers", "transformers (pip install transformers accelerate)"))
    if name.startswith("acc_") or launcher == "accelerate" or name.startswith("hf_"):
        # transformers.Trainer needs accelerate for any distributed run
        mods.append(("accelerate", "accelerate (pip install accelerate)"))
    return mods


def missing(path, launcher):
    """Why the job cannot run here (a framework that does not import, a launcher not on
    PATH), or None."""
    req = needs(path, launcher)
    if isinstance(req, tuple):  # one of several module names
        alts, what = req
        if not any(importlib.util.find_spec(m) for m in alts):
            return "%s cannot be imported" % what
    else:
        for mod, what in req:
            if importlib.util.find_spec(mod) is None:
                return "%s cannot be imported" % what
    if launcher in ("torchrun", "accelerate") and shutil.which(launcher) is None:
        return "%s not on PATH" % launcher
    return None


def params():
    out = []
    for path in JOBS:
        c = blind_consts(path, ("LAUNCH", "LAUNCHERS"))
        for launcher in c.get("LAUNCHERS") or [c["LAUNCH"]]:
            name = "%s[%s]" % (os.path.basename(path)[:-3], launcher)
            if not ENABLED and name not in CI_SET:
                continue
            marks = [pytest.mark.xfail(strict=True, reason=WRONG[name])] if ENABLED and name in WRONG else []
            out.append(pytest.param(path, launcher, id=name, marks=marks))
    return out


def command(path, launcher, nproc):
    if launcher == "torchrun":
        return [shutil.which("torchrun"), "--standalone", "--nproc-per-node", str(nproc), path]
    if launcher == "accelerate":
        # accelerate 1.16: `--cpu --num_processes 2` starts ONE process; the jobs set
        # use_cpu=True / Accelerator(cpu=True) themselves, so --multi_gpu runs them on the CPU
        return [shutil.which("accelerate"), "launch", "--multi_gpu", "--num_processes", str(nproc), path]
    return [sys.executable, path]  # Lightning's own subprocess launcher starts the other ranks


@pytest.mark.parametrize("path,launcher", params())
def test_framework_job(path, launcher, tmp_path):
    why_not = missing(path, launcher)
    if why_not:
        pytest.skip(why_not)
    c = blind_consts(path, ("LAUNCH", "NPROC", "EXPECT"))
    want = c["EXPECT"]
    diags, why = run_blind_entry(
        command(path, launcher, c.get("NPROC", 2)),
        str(tmp_path / "run"),
        os.path.dirname(path),
        stall_s=15,
        timeout_s=300,
    )
    if want["kind"] is None:
        assert not diags, "a clean run got a verdict: %s %s\n%s\n%s" % (
            diags[0]["kind"],
            diags[0]["culprit_ranks"],
            diags[0]["summary"],
            why,
        )
        return
    assert diags, "no verdict\n" + why
    d = diags[0]
    kinds = want["kind"] if isinstance(want["kind"], list) else [want["kind"]]
    where = want.get("where")
    note = "" if not where or where in d["summary"] else "\n(the verdict does not name %r)" % where
    assert d["kind"] in kinds and d["culprit_ranks"] == want["culprit_ranks"], (
        "got %s %s, want %s %s\n%s%s\n%s"
        % (
            d["kind"],
            d["culprit_ranks"],
            kinds,
            want["culprit_ranks"],
            d["summary"],
            note,
            why,
        )
    )
    # issue 37: the verdict names the framework it saw (its version, tested or not)
    fw = {"lt": ("PyTorch Lightning", "Lightning"), "hf": ("Hugging Face Trainer",), "ac": ("Accelerate",)}
    names = [f["name"] for f in d["details"].get("frameworks", [])]
    assert set(fw[os.path.basename(path)[:2]]) & set(names), (names, d["evidence"])
    if want.get("cause"):
        assert d["cause"] == want["cause"], "cause %s, want %s\n%s" % (
            d["cause"],
            want["cause"],
            d["summary"],
        )
