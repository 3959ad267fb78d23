"""Three RL actors call each other in a cycle; the last one calls back into the busy first one.

Incident (PPO-style RLHF pipeline, generate -> score -> reference log-probs): the driver asks
the Generator (a plain synchronous actor, max_concurrency=1) to produce a rollout batch.
Generator.generate() blocks in ray.get(RewardModel.score.remote(...)). RewardModel is an
asyncio actor: score() does `await self.ref.ref_logprobs.remote(...)`. RefPolicy is a threaded
actor (max_concurrency=2): every 3rd step ref_logprobs() checks that it scores with the
generator's current weights, and calls back into the Generator with
ray.wait([generator.weights_version.remote()]) + ray.get. The Generator is still inside
generate() with its only slot taken, so weights_version() never starts: steps 1 and 2 complete,
step 3 deadlocks. Nobody is in a collective, no process died, no rank exists; three different
call forms (ray.get, await, ray.wait) make up the cycle.

EXPECTED verdict: kind actor-deadlock; culprit_ranks []; culprit_actors
Generator 'generator', RewardModel 'reward-model', RefPolicy 'ref-policy' (the whole cycle);
cause none. The driver, blocked in ray.get on Generator.generate, is a waiter on the cycle.
"""
import asyncio
import os
import threading
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "actor-deadlock", "culprit_ranks": [],
          "culprit_actors": ["Generator 'generator'", "RewardModel 'reward-model'", "RefPolicy 'ref-policy'"],
          "cause": None}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def log(msg):
    print(time.strftime("%H:%M:%S"), f"[driver] {msg}", flush=True)


@ray.remote(max_concurrency=1)
class Generator:
    def __init__(self, reward):
        import torch
        self.torch = torch
        self.reward = reward
        self.policy = torch.nn.Linear(32, 32)
        self.version = 0

    def weights_version(self):
        return self.version

    def generate(self, step, n=8):
        torch = self.torch
        with torch.no_grad():
            prompts = torch.randn(n, 32)
            responses = torch.tanh(self.policy(prompts))
        print(f"[generator] step {step}: generated {n} responses, scoring ...", flush=True)
        rewards = ray.get(self.reward.score.remote(step, responses.tolist()))
        self.version += 1
        return {"step": step, "mean_reward": sum(rewards) / len(rewards)}


@ray.remote
class RewardModel:
    def __init__(self):
        self.ref = None
        self.scored = 0

    def set_ref(self, ref):
        self.ref = ref

    async def score(self, step, responses):
        # KL-penalised reward: needs the reference policy's log-probs
        ref_lp = await self.ref.ref_logprobs.remote(step, responses)
        await asyncio.sleep(0.05)
        self.scored += len(responses)
        return [sum(r) / len(r) - 0.1 * lp for r, lp in zip(responses, ref_lp)]


@ray.remote(max_concurrency=2)
class RefPolicy:
    def __init__(self):
        import torch
        self.torch = torch
        self.model = torch.nn.Linear(32, 1)
        self.generator = None
        self.synced_version = 0
        self.lock = threading.Lock()

    def set_generator(self, generator):
        self.generator = generator

    def ref_logprobs(self, step, responses):
        torch = self.torch
        if step % 3 == 0:
            # make sure the reference scores responses of the generator's current policy version
            ready, _ = ray.wait([self.generator.weights_version.remote()], num_returns=1)
            with self.lock:
                self.synced_version = ray.get(ready[0])
            print(f"[ref] synced to generator version {self.synced_version}", flush=True)
        with torch.no_grad():
            lp = torch.log_softmax(self.model(torch.tensor(responses)).squeeze(-1), dim=0)
        return lp.tolist()


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    reward = RewardModel.options(name="reward-model").remote()
    generator = Generator.options(name="generator").remote(reward)
    ref = RefPolicy.options(name="ref-policy").remote()
    ray.get([reward.set_ref.remote(ref), ref.set_generator.remote(generator)], timeout=120)
    log("actors ready: generator -> reward-model -> ref-policy")
    try:
        for step in range(1, 6):
            t0 = time.time()
            out = ray.get(generator.generate.remote(step), timeout=120)
            log(f"step {step} mean reward {out['mean_reward']:.4f} ({time.time() - t0:.2f}s)")
    except ray.exceptions.GetTimeoutError:
        log(f"generator.generate({step}) did not return within 120 s; giving up")
    ray.shutdown()
    log("shut down")


if __name__ == "__main__":
    main()
