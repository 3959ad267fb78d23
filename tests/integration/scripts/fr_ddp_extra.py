"""DDP job where the last rank trains one batch more (issue 10's first "Must show").

Ranks 0..W-2 run N batches then a barrier; rank W-1 runs N+1 batches: its extra
backward's C++ gradient all-reduce (DDP's reducer, never seen by Python wrappers) meets
its peers' barrier at the same sequence number, and all hang.

argv[1]: 'agent' -> nothing special: traced, hangtrace's Flight Recorder agent (started by
         the init_process_group hook) serves dump requests (RUN_DIR/fr);
         'torch' -> a helper thread writes torch's own dump ``comm_lib_trace_rank_<r>``
         into argv[2] each time the file argv[2]/go<r>-<k> appears (k = 1, 2, ...).
Prints 'HANGING <rank>' just before the call that hangs.
"""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))

if mode != "agent":
    out = sys.argv[2]

    def helper():
        k = 1
        while True:
            if os.path.exists(os.path.join(out, "go%d-%d" % (rank, k))):
                data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
                tmp = os.path.join(out, ".tmp%d" % rank)
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, os.path.join(out, "comm_lib_trace_rank_%d" % rank))
                open(os.path.join(out, "done%d-%d" % (rank, k)), "w").close()
                k += 1
            time.sleep(0.02)

    threading.Thread(target=helper, daemon=True).start()

for _ in range(3):  # Python-issued: our wrapper and the Flight Recorder both number these 1, 2, 3
    dist.all_reduce(torch.ones(2))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(25, 26))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = 3 + (1 if rank == world - 1 else 0)
for i in range(batches):
    if i == batches - 1 and rank == world - 1:
        print("HANGING %d" % rank, flush=True)
    opt.zero_grad()
    model(torch.randn(4, 25)).sum().backward()
    opt.step()
print("HANGING %d" % rank, flush=True)
dist.barrier()
print("UNEXPECTED: barrier passed", flush=True)
