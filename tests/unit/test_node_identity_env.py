"""Issue 39, node identity: the launcher's environment of a rank -> its ring meta
(``hooks/torchdist/torch_groups._record_launch``) -> the node's identity read from the run
directory (``collect/nodes/identity.find_identity``), for torchrun (GROUP_RANK), a launcher
that sets NODE_RANK/NNODES, and Slurm (SLURM_NODEID/SLURM_NNODES/SLURM_JOB_ID). The real
Recorder writes the ring; the run directory is read back as the watcher reads it."""

import types

import pytest

from hangtrace.hooks.record.recorder import Recorder
from hangtrace.hooks.torchdist import torch_groups
from hangtrace.tracer.collect.nodes.identity import find_identity

LAUNCH = (
    "GROUP_RANK NODE_RANK SLURM_NODEID GROUP_WORLD_SIZE NNODES SLURM_NNODES MASTER_ADDR MASTER_PORT "
    "TORCHELASTIC_RUN_ID SLURM_JOB_ID TORCHELASTIC_RESTART_COUNT"
).split()


@pytest.mark.parametrize(
    "env,want",
    [
        (  # torchrun (static or c10d rendezvous) inside a Slurm allocation: torchrun's node rank
            dict(
                GROUP_RANK="1",
                GROUP_WORLD_SIZE="2",
                SLURM_NODEID="5",
                SLURM_NNODES="8",
                MASTER_ADDR="n0",
                MASTER_PORT="29500",
                TORCHELASTIC_RUN_ID="abc",
                TORCHELASTIC_RESTART_COUNT="2",
            ),
            (1, 2, ("n0", 29500), "abc.2"),
        ),
        (
            dict(NODE_RANK="3", NNODES="4", MASTER_ADDR="10.0.0.1", MASTER_PORT="1234"),
            (3, 4, ("10.0.0.1", 1234), "job.0"),
        ),
        (  # srun starts the ranks itself; the job script exports MASTER_ADDR/PORT
            dict(
                SLURM_NODEID="2", SLURM_NNODES="3", SLURM_JOB_ID="777", MASTER_ADDR="n0", MASTER_PORT="29400"
            ),
            (2, 3, ("n0", 29400), "777.0"),
        ),
    ],
)
def test_launcher_environment_gives_the_node_identity(tmp_path, monkeypatch, env, want):
    for k in LAUNCH:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rec = Recorder(str(tmp_path), "run", 64, lambda *a, **k: None)
    try:
        rec.set_rank(4, 0, 8)
        torch_groups._record_launch(types.SimpleNamespace(rec=rec))
    finally:
        rec.close()
    ident = find_identity(str(tmp_path))
    assert ident is not None
    assert (ident.node_rank, ident.node_count, ident.store, ident.job) == want
    assert ident.ranks == (4,)


def test_one_node_or_no_launcher_is_no_meeting(tmp_path, monkeypatch):
    for k in LAUNCH:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("MASTER_ADDR", "n0")
    monkeypatch.setenv("MASTER_PORT", "1")
    rec = Recorder(str(tmp_path), "run", 64, lambda *a, **k: None)
    try:
        rec.set_rank(0, 0, 2)
        torch_groups._record_launch(types.SimpleNamespace(rec=rec))
    finally:
        rec.close()
    assert find_identity(str(tmp_path)) is None
