"""Blind job: DataLoader worker segfaults in a native (ctypes) decoder on rank 2.

INCIDENT: 3-rank data-parallel training on CPU (gloo, DDP over a small MLP),
launched with torch.multiprocessing.spawn. The parent sets MASTER_ADDR /
MASTER_PORT; each child sets RANK / WORLD_SIZE in os.environ itself before
init_process_group. Each rank reads its data through DataLoader(num_workers=2);
the dataset decodes every sample with a tiny C library (libdecode.so,
built from DECODE_C with `cc -shared -fPIC` into a temp directory at start) called through ctypes. On rank 2
only, sample 43 (in the 6th batch, batch index 5) is corrupt (header byte 0xFF):
decode_sample() gets a NULL payload pointer and dereferences it -> a real SIGSEGV
inside the DataLoader worker process of rank 2. Rank 2's main process then gets
"DataLoader worker (pid N) is killed by signal: Segmentation fault" and dies;
ranks 0 and 1 wait in the next collective (DDP's gradient all-reduce / the loss
all_reduce) for rank 2, or fail when rank 2's connection closes.
Normal training otherwise: forward, backward, SGD step, loss all_reduce for
logging every step; 30 steps if nothing breaks.

Launcher: python sp_dl_worker_segv.py  (mp.spawn, nprocs=3)

EXPECT: kind=dead-rank, culprit_ranks=[2]; cause: rank 2's DataLoader worker was
killed by SIGSEGV (segfault) in the native decode function decode_sample
(libdecode.so via ctypes) while decoding a sample in __getitem__; ranks 0,1 are
cascade (waiting in a collective for rank 2 / failing because rank 2 left).

Written blind by helper 90 (2026-12-04; helper 93 wrote the same incident). First verdict:
partly right - rank 2, dead of "DataLoader worker (pid N) is killed by signal: Segmentation
fault", but nothing of where: torch's worker signal handlers had replaced faulthandler's,
so the worker's fatal-stack file was empty, and the rank's frames (where it noticed, in
backward) read as the crash site. Now: "... Rank 2: its DataLoader worker (pid N) was
killed by signal Segmentation fault in __getitem__ (sp_dl_worker_segv.py:...)", the rank
"noticed it and raised" in backward, and advice about native code.
"""
LAUNCH = "spawn"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [2], "cause": "exception",
          "says": ("was killed by signal Segmentation fault in __getitem__", "noticed it and raised")}

import ctypes
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

HERE = os.path.dirname(os.path.abspath(__file__))
LIB_PATH = os.environ.get("BLIND90_LIB", os.path.join(HERE, "libdecode.so"))
WORLD = 3
STEPS = 30
BATCH = 8
NFEAT = 16
CORRUPT = {2: 43}  # rank -> index of the corrupt sample (6th batch)

_lib = None


def _decoder():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(LIB_PATH)
        _lib.decode_sample.argtypes = [ctypes.c_char_p, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_float), ctypes.c_int]
        _lib.decode_sample.restype = ctypes.c_int
    return _lib


class EncodedDataset(Dataset):
    def __init__(self, rank, n):
        rng = np.random.default_rng(1234 + rank)
        self.records = []
        for i in range(n):
            raw = bytearray(rng.integers(0, 255, size=33, dtype=np.uint8).tobytes())
            raw[0] = 0x01
            if CORRUPT.get(rank) == i:
                raw[0] = 0xFF  # truncated record: no payload block
            self.records.append(bytes(raw))
        self.labels = rng.standard_normal(n).astype(np.float32)

    def __len__(self):
        return len(self.records)

    def __getitem__(self, idx):
        raw = self.records[idx]
        out = (ctypes.c_float * NFEAT)()
        _decoder().decode_sample(raw, len(raw), out, NFEAT)
        x = torch.tensor(list(out), dtype=torch.float32)
        return x, torch.tensor([self.labels[idx]])


def worker(local_rank):
    os.environ["RANK"] = str(local_rank)
    os.environ["WORLD_SIZE"] = str(WORLD)
    dist.init_process_group("gloo", rank=local_rank, world_size=WORLD)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(NFEAT, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    ds = EncodedDataset(rank, STEPS * BATCH)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=2)
    step = 0
    for x, y in loader:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0:
            print(f"step {step} loss {logged.item() / WORLD:.4f}", flush=True)
        step += 1
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()


DECODE_C = r'''
#include <stddef.h>

typedef struct { const float *payload; int n; } sample_hdr_t;

static float table[64];

/* Look up the payload block for a sample; a sample whose header byte is 0xFF
   (corrupt/truncated record) has no payload block and we get NULL. */
static const float *find_payload(const unsigned char *raw, int len) {
    if (len < 1 || raw[0] == 0xFF) return NULL;
    return table;
}

/* decode one sample into nout floats; bug: no NULL check on the payload */
int decode_sample(const unsigned char *raw, int len, float *out, int nout) {
    sample_hdr_t hdr;
    for (int i = 0; i < 64; i++) table[i] = (float)i / 64.0f;
    hdr.payload = find_payload(raw, len);
    hdr.n = nout;
    for (int i = 0; i < hdr.n; i++) {
        unsigned char b = raw[1 + i % (len - 1)];
        out[i] = hdr.payload[b % 64] - 0.5f;   /* SIGSEGV when payload == NULL */
    }
    return 0;
}
'''


def _build_decoder():
    """Compile DECODE_C into a temp directory (the job as written loaded a prebuilt .so)."""
    import subprocess
    import tempfile
    d = tempfile.mkdtemp(prefix="blind90-")
    with open(os.path.join(d, "decode.c"), "w") as f:
        f.write(DECODE_C)
    lib = os.path.join(d, "libdecode.so")
    subprocess.run(["cc", "-O0", "-shared", "-fPIC", "-o", lib, os.path.join(d, "decode.c")], check=True)
    os.environ["BLIND90_LIB"] = lib


if __name__ == "__main__":
    _build_decoder()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29631"
    mp.spawn(worker, nprocs=WORLD, join=True)
