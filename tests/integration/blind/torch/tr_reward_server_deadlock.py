"""RL post-training job: rank 0 queries a reward-model server subprocess.

INCIDENT: 3-rank torchrun job on CPU (gloo). Rank 0 starts a reward model server
(subprocess.Popen([sys.executable, "servers/reward_server.py", port])) and talks to
it over a local TCP socket: each step rank 0 sends the batch's responses and waits for
scores (sock.recv), then dist.broadcast's the scores to ranks 1-2; all ranks then do a
small update with an all_reduce. The server's request thread and cache-refresher thread
take lock_cache / lock_model in opposite order and deadlock around step 8. The server
never replies; rank 0 blocks forever in recv; ranks 1-2 block in the broadcast.

LAUNCHER: hangtrace run --stall-s 10 --stop-on-stall -- torchrun --nproc_per_node=3 tr_reward_server_deadlock.py

EXPECT: stuck-outside-collective, culprit rank 0, blocked in sock.recv in
get_rewards (job.py), waiting on its reward-server child (reward_server.py), whose
threads deadlock: score_responses holds lock_cache and waits for lock_model,
refresh_cache holds lock_model and waits for lock_cache. Ranks 1-2 wait in broadcast (cascade).

Written blind by helper 94 (2026-12-04). First verdict: partly right (rank 0 in recv in
get_rewards, the server's two threads and their with-lines), but the server child, which
inherited RANK=0, was called "rank 0", and the deadlock was not named. Now: "peer pid N:
rank 0's child process reward_server.py ... threads 'cache-refresher' and 'request' are
deadlocked: each waits for a lock the other holds (...): a lock-order deadlock", with advice
about the lock order.
"""
LAUNCH = "torchrun"
NPROC = 3
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [0], "cause": "blocked",
          "says": ("rank 0's child process reward_server.py", "a lock-order deadlock", "get_rewards")}

import os
import random
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from hangtrace import tracer


def start_reward_server():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "servers", "reward_server.py"), str(port)])
    for _ in range(200):
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            return proc, sock
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("reward server did not start")


def recv_line(sock):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("reward server closed the connection")
        buf += chunk
    return buf


def get_rewards(sock, responses):
    sock.sendall(("\t".join(responses) + "\n").encode())
    line = recv_line(sock)
    return [float(x) for x in line.decode().strip().split(",")]


def rollout(step, n):
    rng = random.Random(step)
    return ["resp-%d-%s" % (step, "x" * rng.randint(1, 40)) for _ in range(n)]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    policy = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    batch = 8
    server = sock = None
    if rank == 0:
        server, sock = start_reward_server()
    for step in range(30):
        tracer.step(step)
        with tracer.phase("rollout"):
            responses = rollout(step, batch)
        with tracer.phase("reward"):
            scores = torch.zeros(batch)
            if rank == 0:
                scores = torch.tensor(get_rewards(sock, responses))
            dist.broadcast(scores, src=0)
        with tracer.phase("train"):
            x = torch.randn(batch, 16)
            loss = -(policy(x).squeeze(-1) * scores).mean()
            opt.zero_grad()
            loss.backward()
            for p in policy.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
        if rank == 0:
            print("step %d done loss %.4f" % (step, loss.item()), flush=True)
        time.sleep(0.2)
    if rank == 0:
        sock.close()
        server.wait(timeout=10)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
