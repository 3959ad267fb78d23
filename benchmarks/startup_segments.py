"""Where a traced start-up's instructions go, by segment (issue 8), under callgrind.

Runs one traced ``import torch.distributed`` (bootstrap called by hand, so that each part
can be marked), and beside it an untraced one, each under ``valgrind --tool=callgrind --dump-before=*getloadavg*``: every
marker is an ``os.getloadavg()`` call, which makes callgrind write the instructions since
the previous marker to a file of its own. Segments: importing ``bootstrap``, ``activate``
(the ring, the instrumentors' modules and installs), torch's import up to the
torch.distributed hook, the hook, each environment record written, the rest of the
import, and the exit. Instruction counts do not depend on the machine's load.

    python3 benchmarks/startup_segments.py            # prints a table; about 3 minutes

Bytecode is cached outside the tree (``PYTHONPYCACHEPREFIX``) and written first by a
native run, as a real install has it; ``PYTHONHASHSEED=0``; OpenBLAS/OpenMP on one thread;
the memory sampler's interval stretched to 100 s (callgrind's slowdown), as in
``bench_startup.py --callgrind``. Needs valgrind and torch.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

CHILD = r'''
import os, sys
_mark = os.getloadavg
labels = []
def M(label):
    labels.append(label); _mark()
os.environ["HANGTRACE"] = "1"
M("start")
import hangtrace.hooks.bootstrap as b
from hangtrace.hooks import envrecord, libraries
orig_rec = envrecord.record
def rec(rt, reason):
    M("(before the record)"); orig_rec(rt, reason); M("environment record (%s)" % reason)
envrecord.record = rec
orig_on = libraries.TorchDistInstrumentor._on_import
def on(self, m):
    M("torch's import until torch.distributed is hooked"); orig_on(self, m); M("hooking torch.distributed")
libraries.TorchDistInstrumentor._on_import = on
M("importing bootstrap")
b.activate()
M("activate (ring, instrumentors)")
import torch.distributed
M("the rest of torch's import")
sys.stderr.write("LABELS " + "|".join(labels) + "\n")
'''


UNTRACED = r'''
import os, sys
os.getloadavg()
import torch.distributed
os.getloadavg()
'''


def _summary(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise ValueError("no summary line in %s" % path)


def _dumps(out: str) -> list:
    return sorted(glob.glob(out + ".*"), key=lambda x: int(x.rsplit(".", 1)[1]))


def _callgrind(script: str, env: dict, out: str, labelled: bool) -> tuple:
    """(marker labels, out file) of one run of ``script`` under callgrind; ``labelled``:
    the script prints its markers' labels. Raises SystemExit when the run fails."""
    p = subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=*getloadavg*",
                        "--callgrind-out-file=" + out, sys.executable, script],
                       env=env, capture_output=True, text=True)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("LABELS ")]
    if p.returncode != 0 or (labelled and not lines):
        raise SystemExit("callgrind run failed (%d):\n%s" % (p.returncode, p.stderr[-2000:]))
    return (lines[0][7:].split("|") if lines else []), out


def main() -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="ht-startup-seg-")
    try:
        script = os.path.join(work, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANGTRACE") and k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=repo, PYTHONPYCACHEPREFIX=os.path.join(work, "pycache"), PYTHONHASHSEED="0",
                   OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", HANGTRACE_AUTO_WATCH="0",
                   HANGTRACE_MEM_INTERVAL_S="100", HANGTRACE_DIR=os.path.join(work, "run"))
        plain = os.path.join(work, "untraced.py")
        with open(plain, "w") as f:
            f.write(UNTRACED)
        subprocess.run([sys.executable, script], env=env, check=True, capture_output=True)  # bytecode cache
        runs = {}
        with ThreadPoolExecutor(2) as pool:  # (the two runs side by side: counts do not depend on load)
            for name, path in (("traced", script), ("untraced", plain)):
                runs[name] = pool.submit(_callgrind, path, env, os.path.join(work, name + ".out"), name == "traced")
        (labels, out), (_, plain_out) = runs["traced"].result(), runs["untraced"].result()
        dumps = _dumps(out)
        rows = []
        for i, label in enumerate(labels[1:]):
            # two dumps per marker call (callgrind matches two functions of the call; the
            # second holds a handful of instructions): the segment ending at marker k
            # (k >= 1) is file 2k+1, counted from 1; the exit is the final file
            n = _summary(dumps[2 + 2 * i])
            rows.append(("  (until the next record)" if label.startswith("(") else label, n))
        rows.append(("the exit (interpreter finalization)", _summary(out)))
        torch_traced = sum(n for label, n in rows if "torch" in label or "record" in label)
        torch_plain = _summary(_dumps(plain_out)[2])
        exit_plain = _summary(plain_out)
        print("| segment | instructions (M) |\n|---|---:|")
        for label, n in rows:
            print("| %s | %.2f |" % (label, n / 1e6))
        print("| **ours before torch's import** (importing bootstrap, activate) | **%.2f** |"
              % (sum(n for label, n in rows[:2]) / 1e6))
        print("| torch's import, traced minus untraced (%.1fM), hooks and records included | **%+.2f** |"
              % (torch_plain / 1e6, (torch_traced - torch_plain) / 1e6))
        print("| the exit, traced minus untraced (%.1fM) | **%+.2f** |" % (exit_plain / 1e6, (rows[-1][1] - exit_plain) / 1e6))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
