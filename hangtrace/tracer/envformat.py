"""The names and masking rule of the environment record (issue 12), for traced processes.

``RUN_DIR/env/<host>-<pid>.json`` is written by ``hooks/env/envcollect.py`` inside every
traced process and read by ``tracer/collect/forensics.py`` into the typed records of
``tracer/envfacts.py`` (which re-exports everything here). This module holds only what
the writer needs: the schema number, the directory name, the secret-masking rule, the
job-relevant variable names and the names of the libraries that matter. It imports nothing but ``os``: creating the typed records'
classes (``NamedTuple``) costs about 1 ms, which a traced process never needs to pay.
"""

from __future__ import annotations

import os
from typing import Mapping, Tuple

SCHEMA = 1
ENV_DIR = "env"
MASK = "<masked>"
#: Modules whose presence in ``sys.modules`` at a record says which training framework runs the
#: process (``"frameworks"`` of the record; issue 37): a dict lookup each, no per-collective cost.
#: Their versions are the ``"packages"`` of the same record; ``tracer/analyze/frameworks.py``
#: names the framework and compares them with the versions hangtrace was tested with.
FRAMEWORK_MODULES = (
    "ray.train",
    "pytorch_lightning",
    "lightning.pytorch",
    "transformers.trainer",
    "accelerate.accelerator",
)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
#: Job-relevant environment: every variable with one of these prefixes, plus ENV_NAMES
#: (WORLD_SIZE: the same on every rank, read by env:// rendezvous; RANK and LOCAL_RANK
#: differ per rank by design and are left out).
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "OMP_", "RAY_", "MASTER_", "PYTORCH_")
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "WORLD_SIZE")


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name suggests a secret (see SECRET_WORDS)."""
    up = name.upper()
    return any(w in up for w in SECRET_WORDS)


def is_job_relevant(name: str) -> bool:
    """True for the variables a record keeps: ENV_NAMES and every ENV_PREFIXES name."""
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def mask_environ(environ: Mapping[str, str]) -> Tuple[Tuple[str, str], ...]:
    """The job-relevant variables of ``environ``, sorted, secret-looking values masked.
    (The names are filtered before any value is read: ``os.environ`` decodes each one.)"""
    keys = sorted(k for k in environ if k.startswith(ENV_PREFIXES) or k in ENV_NAMES)
    return tuple((k, MASK if is_secret_name(k) else str(environ[k])) for k in keys)


def env_path(run_dir: str, host: str, pid: int) -> str:
    """``RUN_DIR/env/<host>-<pid>.json``: the record of process ``pid`` on ``host``."""
    return os.path.join(run_dir, ENV_DIR, "%s-%d.json" % (host, pid))


#: Library names that matter (issue 12), matched at the start of the lower-cased file name;
#: any name that mentions nccl or cuda matters too.
_MATTER_PREFIXES = (
    "libtorch",
    "libc10",
    "libnccl",
    "libgloo",
    "libcuda",
    "libcudart",
    "libnvidia-ml",
    "libibverbs",
    "libmpi",
    "libpython",
    "libc.so",
    "libc-",
)


def matters(path: str) -> bool:
    """True for libraries named in issue 12: torch, c10, NCCL, gloo, CUDA, NVML, ibverbs,
    MPI, the Python runtime, libc, and any library whose name mentions nccl or cuda
    (case-insensitive, on the file name). These get their build-id read in the traced
    process and count as "(not loaded)" in env-diff where a rank lacks them; every other
    mapped library is compared too (issue 41: ``tracer/collect/elffacts.py``)."""
    n = os.path.basename(path).lower()
    return n.startswith(_MATTER_PREFIXES) or "nccl" in n or "cuda" in n
