"""A Ray trainer's DataLoader worker segfaults in a C decoder; Ray then tears the job down.

Incident (blind job, 2026-12-04, run by a user as `hangtrace run -- python job.py`): a driver and
two Trainer actors (ranks 0 and 1) in one gloo group, DDP, each with a DataLoader(num_workers=2)
whose dataset decodes every record with a small C library through ctypes. Record 100 of rank 1's
shard is corrupt: the decoder dereferences NULL and rank 1's DataLoader worker dies of SIGSEGV in
__getitem__. Rank 1's train() raises "DataLoader worker (pid(s) N) exited unexpectedly"; Ray catches
it (RayTaskError) and keeps the actor alive; the driver's ray.get fails, it calls ray.shutdown(),
and about 0.3 s later the raylet SIGTERMs both actors. Rank 0 was in DDP's backward, waiting for
rank 1. A good tool: dead-rank, rank 1 (Ray actor Trainer), its exception, its worker's segfault
and where; the raylet's SIGTERMs are Ray stopping the job, not a cause.

Corpus changes to the job as written (what the harness needs, nothing else): the C source is
embedded (DECODE_C) and compiled into a temp directory instead of beside the job; Ray is started
with address="local" (never another session's cluster) and the HANGTRACE environment is passed
to the workers through runtime_env by default (the job took it as --runtime-env-json).
"""
import argparse, json, os, socket, subprocess, sys, time, ctypes

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [1], "culprit_actors": ["Trainer"], "cause": "exception",
          "summary_has": "was killed by signal Segmentation fault in __getitem__"}

DECODE_C = r"""#include <stddef.h>
#include <string.h>

/* Decode a "sample": header byte 0xD5 means a valid record; out gets 16 floats. */
typedef struct { const float *table; int n; } codebook_t;

static float base_table[16];
static codebook_t good_cb = { base_table, 16 };

int decode_sample(const unsigned char *buf, int len, float *out) {
    const codebook_t *cb = &good_cb;
    for (int i = 0; i < 16; i++) base_table[i] = (float)i / 16.0f;
    if (len < 17) return -1;
    if (buf[0] != 0xD5) {
        /* corrupt header: codebook lookup fails and returns NULL, never checked */
        cb = NULL;
    }
    for (int i = 0; i < 16; i++) {
        out[i] = cb->table[i % cb->n] * (float)buf[1 + i] / 255.0f;
    }
    return 0;
}
"""

SO = os.environ.get("BLIND96_LIB", "")


def build_lib():
    global SO
    import tempfile
    d = tempfile.mkdtemp(prefix="blind96-")
    with open(os.path.join(d, "decoder.c"), "w") as f:
        f.write(DECODE_C)
    SO = os.path.join(d, "libdecoder.so")
    os.environ["BLIND96_LIB"] = SO  # (the actors' workers find it through their runtime_env)
    subprocess.check_call(["cc", "-shared", "-fPIC", "-O0", "-o", SO,
                           os.path.join(d, "decoder.c")])


import ray


class DecodedDataset:
    """Samples are raw byte records decoded by the C library."""

    def __init__(self, rank, n, corrupt_index=None):
        import random
        rng = random.Random(rank)
        self.records = []
        for i in range(n):
            hdr = 0xD5
            if corrupt_index is not None and i == corrupt_index:
                hdr = 0x00  # corrupt record
            payload = bytes(rng.randrange(256) for _ in range(16))
            self.records.append(bytes([hdr]) + payload)
        self._lib = None

    def _decoder(self):
        if self._lib is None:
            lib = ctypes.CDLL(SO)
            lib.decode_sample.argtypes = [ctypes.c_char_p, ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_float)]
            lib.decode_sample.restype = ctypes.c_int
            self._lib = lib
        return self._lib

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        import torch
        time.sleep(0.1)  # decode cost
        out = (ctypes.c_float * 16)()
        rc = self._decoder().decode_sample(self.records[i], len(self.records[i]), out)
        if rc != 0:
            raise ValueError(f"bad record {i}")
        x = torch.tensor(list(out), dtype=torch.float32)
        y = x.sum().unsqueeze(0)
        return x, y


@ray.remote(num_cpus=0.5)
class Trainer:
    def __init__(self, rank, world_size, master_addr, master_port):
        self.rank = rank
        self.world_size = world_size
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["LOCAL_RANK"] = "0"

    def setup(self):
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world_size)
        return os.getpid()

    def train(self, epochs=3):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader
        torch.manual_seed(0)
        corrupt = 100 if self.rank == 1 else None  # corrupt record in rank 1's shard
        ds = DecodedDataset(self.rank, 200, corrupt_index=corrupt)
        dl = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        step = 0
        t0 = time.time()
        for ep in range(epochs):
            for x, y in dl:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                step += 1
                if step % 5 == 0:
                    print(f"rank {self.rank} step {step} loss {loss.item():.4f} "
                          f"t={time.time()-t0:.1f}s", flush=True)
        return step


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime-env-json", default=None)
    args = ap.parse_args()
    build_lib()
    renv = json.loads(args.runtime_env_json) if args.runtime_env_json else \
        {"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}}
    renv.setdefault("env_vars", {})["BLIND96_LIB"] = SO
    ray.init(address="local", num_cpus=2, runtime_env=renv, include_dashboard=False)
    port = free_port()
    actors = [Trainer.remote(r, 2, "127.0.0.1", port) for r in range(2)]
    pids = ray.get([a.setup.remote() for a in actors])
    print("driver: actors up, pids", pids, flush=True)
    futs = [a.train.remote() for a in actors]
    t0 = time.time()
    try:
        res = ray.get(futs, timeout=120)
        print("driver: train finished", res, flush=True)
    except ray.exceptions.GetTimeoutError:
        print(f"driver: TIMEOUT after {time.time()-t0:.0f}s waiting for train()", flush=True)
    except Exception as e:
        print(f"driver: train failed after {time.time()-t0:.0f}s: {type(e).__name__}: {e}",
              flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
