"""A miniature RL post-training loop on Ray (CPU only) with switchable, deterministic faults.

The shape of slime / verl / OpenRLHF, shrunk to seconds: a Ray driver, one rollout actor
that "generates", N trainer actors (default 4) in one gloo world with context-parallel
(CP) and data-parallel (DP) subgroups, weight sync from the trainers to the rollout actor
through its own group, periodic eval and checkpoint. The driver logs each phase.

    python examples/rl_loop.py [--fault none|cp-extra-microbatch|sync-order|kill-trainer|
        rank0-checkpoint] [--trainers 4] [--steps 4] [--fault-step 2] [--timeout-s 120]
        [--address ADDR] [--num-cpus 4] [--runtime-env-json JSON] [--spread] [--hold-s S]

Tracing needs no change to this file: pass hangtrace's env vars through the runtime env
(``--runtime-env-json "$(hangtrace env --ray)"``, or ``ray job submit --runtime-env-json``)
and every actor is traced; each actor method is recorded as a phase named after it. The
only hangtrace call here is ``tracer.step(n)`` (optional: a no-op without hangtrace).

Ranks: trainers are ranks 0..N-1 (actors ``trainer-0`` ...), the rollout actor is rank N
(actor ``rollout``). Every rank creates every group in the same order:
``cp0, cp1, ...`` (consecutive trainers, CP size 2), ``dp0, dp1, ...`` (strided),
``train`` (all trainers) and ``weight_sync`` (trainers + rollout).

One step, as the driver runs it (and logs it)::

    rollout      rollout.generate(n)                       (no collective)
    actor_train  trainer.train_step(n, samples)            all_gather(train) of token counts,
                                                           per micro-batch all_reduce(cp),
                                                           all_reduce(dp), loss all_reduce(train)
    weight_sync  trainer.sync_weights + rollout.receive_weights   broadcast(weight_sync) from rank 0
    eval         every 2nd step: trainer.evaluate          all_reduce(train)
    checkpoint   every 2nd step: trainer.checkpoint        all_reduce(train) of a checksum, rank 0
                 saves; the driver does not wait for it (async save) and collects it later

Faults (at ``--fault-step``, default 2):

* ``cp-extra-microbatch``: trainer 1 builds one micro-batch more than its CP peer
  (trainer 0) right after rollout: one extra CP all_reduce. The seed report: "rollout
  finished, actor_train start, then only health checks". Culprit: rank 1.
* ``sync-order``: trainer 2 pushes weights (broadcast on ``weight_sync``) at the start of
  its train step, before the training collectives; the others train first: two groups
  entered in different orders. Culprit: rank 2 (cross-group deadlock).
* ``kill-trainer``: trainer 1 SIGKILLs itself in the backward of its first micro-batch,
  after the step's token all_gather (as a host OOM-kill would). Ray reports "The actor is dead because its worker process
  has died". Culprit: rank 1 (dead rank).
* ``rank0-checkpoint``: the checkpoint (with its checksum all_reduce) runs on trainer 0
  only ("only rank 0 saves"); the others go on to the next train step. Culprit: rank 0.

The driver never hangs forever: every ``ray.get`` has ``--timeout-s`` and gloo groups the
same timeout. On a failure or timeout it logs, waits ``--hold-s`` seconds (so
``hangtrace dump --ray`` can still see the live actors) and exits 1 (3 on timeout).
"""

import argparse
import json
import os
import signal
import sys
import time

try:
    from hangtrace import tracer
except ImportError:  # runs without hangtrace too

    class _NoTracer:
        def step(self, n):
            pass

    tracer = _NoTracer()

FAULTS = ("none", "cp-extra-microbatch", "sync-order", "kill-trainer", "rank0-checkpoint")
EVAL_EVERY = 2
CKPT_EVERY = 2
BATCH = 4  # samples per DP index per step
MICRO_TOKENS = 64  # token budget of one micro-batch
HIDDEN = 16
CP = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--trainers", type=int, default=4, help="trainer actors (2-4, even; default 4)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--fault-step", type=int, default=2)
    p.add_argument(
        "--timeout-s",
        type=float,
        default=120.0,
        help="timeout of every ray.get and of the gloo groups (default 120)",
    )
    p.add_argument("--address", default=None, help="Ray address (default: start a local Ray)")
    p.add_argument("--num-cpus", type=int, default=4, help="CPUs of a local Ray (default 4)")
    p.add_argument(
        "--runtime-env-json", default=None, help='runtime_env for the job, e.g. "$(hangtrace env --ray)"'
    )
    p.add_argument("--spread", action="store_true", help="place the actors round-robin on the nodes")
    p.add_argument(
        "--hold-s",
        type=float,
        default=0.0,
        help="after a failure or timeout, keep the actors alive this long",
    )
    a = p.parse_args(argv)
    if a.trainers < 2 or a.trainers > 4 or a.trainers % 2:
        p.error("--trainers must be 2 or 4")
    return a


T0 = time.time()


def log(msg):
    print("[driver +%5.1fs] %s" % (time.time() - T0, msg), flush=True)


class _Member:
    """What trainer and rollout share: the gloo world and its groups."""

    def setup(self, rank, world, trainers, addr, port, timeout_s, fault, fault_step):
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.world, self.trainers = rank, world, trainers
        self.fault, self.fault_step = fault, fault_step
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=addr, MASTER_PORT=str(port))
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            "gloo", init_method="tcp://%s:%d" % (addr, port), rank=rank, world_size=world, timeout=timeout
        )
        self.cp_group = self.dp_group = None
        ndp = trainers // CP
        for i in range(ndp):  # cp0 {0,1}, cp1 {2,3}
            ranks = list(range(i * CP, (i + 1) * CP))
            g = dist.new_group(ranks, timeout=timeout, group_desc="cp%d" % i)
            if rank in ranks:
                self.cp_group = g
        for j in range(CP):  # dp0 {0,2}, dp1 {1,3}
            ranks = list(range(j, trainers, CP))
            g = dist.new_group(ranks, timeout=timeout, group_desc="dp%d" % j)
            if rank in ranks:
                self.dp_group = g
        self.train_group = dist.new_group(list(range(trainers)), timeout=timeout, group_desc="train")
        self.sync_group = dist.new_group(list(range(world)), timeout=timeout, group_desc="weight_sync")
        torch.manual_seed(0)
        self.model = torch.nn.Linear(HIDDEN, 1)
        return os.getpid()

    def faulty(self, name, step):
        return self.fault == name and step == self.fault_step

    def _broadcast_weights(self):
        for p in self.model.parameters():
            self.dist.broadcast(p.data, src=0, group=self.sync_group)


class Trainer(_Member):
    def address(self):
        import socket
        import ray

        s = socket.socket()
        s.bind(("", 0))
        port = s.getsockname()[1]
        s.close()
        return ray.util.get_node_ip_address(), port

    def train_step(self, step, samples):
        torch, dist = self.torch, self.dist
        tracer.step(step)
        if self.faulty("sync-order", step) and self.rank == 2 % self.trainers:
            self._broadcast_weights()  # bug: pushes weights before training
        dp_index = self.rank // CP
        shared = samples[dp_index]
        # global token count for loss normalisation
        mine = torch.tensor([sum(shared)], dtype=torch.int64)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.trainers)]
        dist.all_gather(counts, mine, group=self.train_group)
        n_micro = max(1, -(-sum(shared) // MICRO_TOKENS))
        if self.faulty("cp-extra-microbatch", step) and self.rank == 1:
            n_micro += 1  # bug: packs from its own uneven view
        if not hasattr(self, "opt"):
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.opt.zero_grad()
        g = torch.Generator().manual_seed(step * 7919 + self.rank)
        total = 0.0
        for mb in range(n_micro):
            x = torch.randn(8, HIDDEN, generator=g)
            loss = self.model(x).pow(2).mean()
            loss.backward()
            total += float(loss.detach())
            if self.faulty("kill-trainer", step) and self.rank == 1 and mb == 0:
                # after the step's token all_gather, in the first micro-batch's backward
                print("trainer 1 pid %d: SIGKILL myself in train step %d" % (os.getpid(), step), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            for p in self.model.parameters():
                dist.all_reduce(p.grad, group=self.cp_group)
        for p in self.model.parameters():
            dist.all_reduce(p.grad, group=self.dp_group)
        self.opt.step()
        loss_t = torch.tensor([total / n_micro])
        dist.all_reduce(loss_t, group=self.train_group)
        return float(loss_t) / self.trainers

    def sync_weights(self, step):
        tracer.step(step)
        self._broadcast_weights()
        return True

    def evaluate(self, step):
        torch = self.torch
        with torch.no_grad():
            x = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(step))
            v = torch.tensor([float(self.model(x).pow(2).mean())])
        self.dist.all_reduce(v, group=self.train_group)
        return float(v) / self.trainers

    def checkpoint(self, step):
        if self.fault == "rank0-checkpoint" and step >= self.fault_step and self.rank != 0:
            return "skipped"  # bug: "only rank 0 saves" guards the checksum too
        import tempfile

        torch = self.torch
        checksum = torch.tensor([float(sum(p.detach().sum() for p in self.model.parameters()))])
        self.dist.all_reduce(checksum, group=self.train_group)
        if self.rank == 0:
            with tempfile.TemporaryDirectory(prefix="rl_loop_ckpt_") as d:
                torch.save(self.model.state_dict(), os.path.join(d, "step%d.pt" % step))
        return "saved"


class Rollout(_Member):
    def generate(self, step):
        torch = self.torch
        tracer.step(step)
        with torch.no_grad():
            bias = float(self.model.bias.sum())
        out = []
        for dp_index in range(self.trainers // CP):
            g = torch.Generator().manual_seed(1000 * step + dp_index)
            lengths = torch.randint(8, 48, (BATCH,), generator=g)
            out.append([int(x) + (1 if bias > 1e9 else 0) for x in lengths])
        return out

    def receive_weights(self, step):
        tracer.step(step)
        self._broadcast_weights()
        return True


def run(a):
    import ray

    runtime_env = json.loads(a.runtime_env_json) if a.runtime_env_json else None
    kw = {"runtime_env": runtime_env, "log_to_driver": True}
    if a.address:
        ray.init(address=a.address, **kw)
    else:
        ray.init(address="local", num_cpus=a.num_cpus, include_dashboard=False, **kw)
    log(
        "ray ready: fault=%s trainers=%d steps=%d nodes=%d"
        % (a.fault, a.trainers, a.steps, sum(1 for n in ray.nodes() if n.get("Alive")))
    )
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))

    def opts(i):
        o = {"num_cpus": 0}
        if (
            a.spread
        ):  # round-robin over the nodes, hard affinity (Ray's "SPREAD" and soft affinity are best effort)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            o["scheduling_strategy"] = NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False)
        return o

    TrainerActor = ray.remote(Trainer)
    RolloutActor = ray.remote(Rollout)
    trainers = [TrainerActor.options(name="trainer-%d" % r, **opts(r)).remote() for r in range(a.trainers)]
    rollout = RolloutActor.options(name="rollout", **opts(a.trainers)).remote()
    world = a.trainers + 1

    def get(refs, what):
        try:
            return ray.get(refs, timeout=a.timeout_s)
        except ray.exceptions.GetTimeoutError:
            log("%s: no result after %.0f s (hung)" % (what, a.timeout_s))
            raise SystemExit(3)
        except ray.exceptions.RayError as e:
            log("%s failed: %s" % (what, str(e).splitlines()[0][:300]))
            raise SystemExit(1)

    addr, port = get(trainers[0].address.remote(), "address")
    log("setup: world %d at %s:%d" % (world, addr, port))
    args = (world, a.trainers, addr, port, a.timeout_s, a.fault, a.fault_step)
    pids = get(
        [t.setup.remote(r, *args) for r, t in enumerate(trainers)]
        + [rollout.setup.remote(a.trainers, *args)],
        "setup",
    )
    log("setup done: trainer pids %s, rollout pid %d" % (pids[:-1], pids[-1]))
    pending_ckpt = []
    for n in range(1, a.steps + 1):
        log("step %d: rollout start" % n)
        samples = get(rollout.generate.remote(n), "rollout")
        log("step %d: rollout done (%d samples)" % (n, sum(len(s) for s in samples)))
        log("step %d: actor_train start" % n)
        losses = get([t.train_step.remote(n, samples) for t in trainers], "actor_train")
        log("step %d: actor_train done, loss %.4f" % (n, losses[0]))
        log("step %d: weight_sync start" % n)
        get([t.sync_weights.remote(n) for t in trainers] + [rollout.receive_weights.remote(n)], "weight_sync")
        log("step %d: weight_sync done" % n)
        if n % EVAL_EVERY == 0:
            log("step %d: eval %.4f" % (n, get([t.evaluate.remote(n) for t in trainers], "eval")[0]))
        if pending_ckpt:
            log("checkpoint: %s" % get(pending_ckpt, "checkpoint"))
            pending_ckpt = []
        if n % CKPT_EVERY == 0:
            log("step %d: checkpoint start (async)" % n)
            pending_ckpt = [t.checkpoint.remote(n) for t in trainers]
    if pending_ckpt:
        log("checkpoint: %s" % get(pending_ckpt, "checkpoint"))
    log("done: %d steps" % a.steps)
    return 0


def main(argv=None):
    a = parse_args(argv)
    try:
        return run(a)
    except SystemExit as e:
        if a.hold_s > 0:
            log("holding the actors for %.0f s (hangtrace dump --ray now)" % a.hold_s)
            time.sleep(a.hold_s)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
