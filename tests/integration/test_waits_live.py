"""What a rank outside collectives waits for, on real 2-rank torchrun jobs: the holder of a
file lock (``/proc/locks``) named by rank, and the other end of a local TCP connection with
what its own threads wait for (blind helpers 54 and 58's shapes, written here anew)."""

import sys

import pytest

from jobs import run_under_hangtrace

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

FLOCK = """
import fcntl, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
for step in range(6):
    x = torch.ones(4)
    dist.all_reduce(x)
    if step == 3:
        f = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache.lock"), "w")
        if r == 0:
            fcntl.flock(f, fcntl.LOCK_EX)
            dist.barrier()          # holds the lock while it waits for rank 1
        else:
            time.sleep(0.5)
            fcntl.flock(f, fcntl.LOCK_EX)
            dist.barrier()
dist.destroy_process_group()
"""

SERVICE = """
import queue, socket, threading, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
answers = queue.Queue()
port = torch.zeros(1, dtype=torch.int64)
if r == 0:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port[0] = srv.getsockname()[1]
    def config_service():
        while True:
            c, _ = srv.accept()
            c.recv(64)
            c.sendall(answers.get())   # nobody puts an answer: never replies
    threading.Thread(target=config_service, name="config-service", daemon=True).start()
dist.broadcast(port, 0)
for step in range(6):
    if r == 1 and step == 3:
        s = socket.create_connection(("127.0.0.1", int(port.item())))
        s.sendall(b"lr?")
        s.recv(64)
    x = torch.ones(4)
    dist.all_reduce(x)
dist.destroy_process_group()
"""


FILELOCK_RDZV = """
import os, time
import torch.distributed as dist
from filelock import FileLock
here = os.path.dirname(os.path.abspath(__file__))
time.sleep(0.2 if os.environ["RANK"] == "0" else 2.0)
with FileLock(os.path.join(here, "cache.lock")):
    if not dist.is_initialized():
        dist.init_process_group("gloo")     # inside the lock: the others never get to theirs
if not dist.is_initialized():
    dist.init_process_group("gloo")
dist.destroy_process_group()
"""


def _run(tmp_path, source, **env):
    pytest.importorskip("torch")
    job = tmp_path / "job.py"
    job.write_text(source)
    diags, why = run_under_hangtrace(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(job)],
        tmp_path / "run",
        tmp_path,
        stall_s=5,
        timeout_s=180,
        extra_env=env,
    )
    assert diags, why
    return diags[0], why


def test_a_rank_blocked_in_flock_names_the_holder_by_rank_and_where_it_is(tmp_path):
    d, why = _run(tmp_path, FLOCK)
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [1]), why
    assert "cache.lock, held by pid" in d["summary"] and ": rank 0))" in d["summary"], d["summary"]
    assert "The lock's holder, rank 0" in d["summary"] and "its main thread is in barrier" in d["summary"], d[
        "summary"
    ]


def test_a_rank_blocked_on_a_socket_names_the_peer_rank_and_its_serving_thread(tmp_path):
    d, why = _run(tmp_path, SERVICE)
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [1]), why
    s = d["summary"]
    assert "recvfrom(" in s and "peer pid" in s and ": rank 0)" in s, s
    assert "The other end, rank 0" in s and "thread 'config-service'" in s and "queue.get" in s, s


def test_ranks_waiting_for_a_file_lock_before_the_rendezvous_name_its_holder_inside_it(tmp_path):
    """Blind helper 59's shape: rank 0 calls init_process_group inside a filelock the other
    rank waits for."""
    pytest.importorskip("filelock")
    d, why = _run(tmp_path, FILELOCK_RDZV, HANGTRACE_STARTUP_STALL_S="5")
    assert (d["kind"], d["culprit_ranks"]) == ("stuck-outside-collective", [1]), why
    s = d["summary"]
    assert "it never reached init_process_group: file lock" in s, s
    assert "Rank 0 waits for it in init_process_group (the rendezvous)" in s, s
    assert "Rank 0 holds a file lock on " in s and "cache.lock" in s, s
