"""A tiny HTTP parameter server inside rank 0 takes state_lock, which rank 0's main loop holds
across its parameter all_reduce; rank 1 fetches the version over HTTP before its all_reduce:
rank 1 waits for the reply, the handler for the lock, rank 0 for rank 1 (a cycle across two
processes).

Written blind on 2026-12-04 by a helper that had read only the README (helper 58), from that
incident. Its verdict was right (rank 1 in recv, the peer rank 0, its handler thread waiting
at `with state_lock:`, the main thread holding it in all_reduce).
"""
LAUNCH = "torchrun"
NPROC = 2
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [1],
          "says": ["peer pid", ": rank 0)", "thread 'param-server'", "`with state_lock:`", "a cycle across the two"]}

import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hangtrace import tracer

HANG_STEP = 4
N_STEPS = 8

state_lock = threading.Lock()
state = {"lr": 0.01, "version": 0}


class ToyData(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum().unsqueeze(0)


class ParamHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        with state_lock:  # same lock the training loop holds during sync
            body = json.dumps({"lr": state["lr"], "version": state["version"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print(f"[param-server] {fmt % args}", flush=True)


def start_param_server():
    srv = HTTPServer(("127.0.0.1", 0), ParamHandler)
    t = threading.Thread(target=srv.serve_forever, name="param-server", daemon=True)
    t.start()
    return srv, srv.server_address[1]


def sync_params(model):
    """Average parameters across ranks; on rank 0 this is done under state_lock."""
    with state_lock:
        for p in model.parameters():
            dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
            p.data /= dist.get_world_size()
        state["version"] += 1


def sync_params_unlocked(model):
    for p in model.parameters():
        dist.all_reduce(p.data, op=dist.ReduceOp.SUM)
        p.data /= dist.get_world_size()


def fetch_version(port):
    url = f"http://127.0.0.1:{port}/version"
    with urllib.request.urlopen(url) as r:  # no timeout
        return json.loads(r.read())


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    # rank 0 runs the param server; tell rank 1 its port
    port_t = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        _srv, port = start_param_server()
        port_t[0] = port
    dist.broadcast(port_t, src=0)
    port = int(port_t.item())
    print(f"rank {rank}: param server at 127.0.0.1:{port}", flush=True)

    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=state["lr"])
    loader = DataLoader(ToyData(), batch_size=16, num_workers=2, shuffle=False)
    it = iter(loader)

    for step in range(N_STEPS):
        tracer.step(step)
        with tracer.phase("train"):
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with tracer.phase("sync"):
            if rank == 0:
                sync_params(model)
            else:
                if step == HANG_STEP:
                    time.sleep(1.0)  # slower batch on rank 1: rank 0 is already in the sync
                    info = fetch_version(port)
                    print(f"rank 1: server says {info}", flush=True)
                sync_params_unlocked(model)
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
