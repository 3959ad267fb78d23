"""An async RolloutManager actor scores samples with a blocking ``ray.get`` on a RewardModel
inside its ``async def rollout``; every 16th score, RewardModel.score calls back into the
manager's ``async def get_running_stats``, which never runs: the manager's event loop is
blocked inside the synchronous ray.get. The driver waits in ray.get on rollout; three
Samplers are idle. Ray warns "Using blocking ray.get inside async actor" in the actor's log.

Written blind on 2026-12-04 by a helper that had read only the README (helper 64). Its
verdict named the cycle of the two actors, but no line, not the blocked event loop, and
advised max_concurrency (fixed: rules/actor_waits.py names each wait's line and a blocking
call inside an async actor's event loop, with advice to await). For the corpus: ray.init
with the job's HANGTRACE variables in runtime_env (the harness's way) instead of the
helper's --runtime-env-json argument, address="local" and no dashboard.

EXPECTED verdict: kind actor-deadlock; culprit_actors RewardModel 'reward-model',
RolloutManager 'rollout-manager'; the blocked event loop named.
"""
LAUNCH = "ray"
EXPECT = {"kind": "actor-deadlock", "culprit_ranks": [],
          "culprit_actors": ["RewardModel 'reward-model'", "RolloutManager 'rollout-manager'"],
          "cause": None, "summary_has": "a blocking call inside its asyncio event loop"}

import argparse
import os
import asyncio
import json
import time

import ray
import torch


@ray.remote
class Sampler:
    def __init__(self, idx):
        self.idx = idx
        torch.manual_seed(idx)
        self.policy = torch.nn.Linear(16, 8)

    def sample(self, n):
        out = []
        with torch.no_grad():
            for _ in range(n):
                obs = torch.randn(4, 16)
                logits = self.policy(obs)
                actions = torch.distributions.Categorical(logits=logits).sample()
                out.append({"sampler": self.idx, "obs": obs, "actions": actions})
        return out


@ray.remote
class RewardModel:
    def __init__(self):
        torch.manual_seed(123)
        self.head = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.manager = None
        self.n_scored = 0
        self.stats = (0.0, 1.0)

    def set_manager(self, manager):
        self.manager = manager
        return True

    def score(self, sample):
        with torch.no_grad():
            raw = self.head(sample["obs"]).mean().item()
        self.n_scored += 1
        # refresh normalisation stats from the manager every 16 scores
        if self.n_scored % 16 == 0:
            self.stats = ray.get(self.manager.get_running_stats.remote())
        mean, std = self.stats
        return (raw - mean) / (std + 1e-6)


@ray.remote
class RolloutManager:
    def __init__(self, samplers, reward):
        self.samplers = samplers
        self.reward = reward
        self.rewards_seen = []

    async def get_running_stats(self):
        if not self.rewards_seen:
            return (0.0, 1.0)
        t = torch.tensor(self.rewards_seen)
        return (t.mean().item(), t.std().item() if len(self.rewards_seen) > 1 else 1.0)

    async def rollout(self, n):
        batches = await asyncio.gather(*[s.sample.remote(n) for s in self.samplers])
        samples = [x for b in batches for x in b]
        scores = []
        for sample in samples:
            score = ray.get(self.reward.score.remote(sample))  # BUG: should be `await`
            scores.append(score)
        self.rewards_seen.extend(scores)
        return {"n": len(samples), "mean_reward": sum(scores) / len(scores)}


def main():
    ray.init(address="local", num_cpus=6, include_dashboard=False,
             runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}})
    print("ray initialised", flush=True)

    samplers = [Sampler.options(name=f"sampler-{i}").remote(i) for i in range(3)]
    reward = RewardModel.options(name="reward-model").remote()
    manager = RolloutManager.options(name="rollout-manager").remote(samplers, reward)
    ray.get(reward.set_manager.remote(manager))
    print("actors up", flush=True)

    for it in range(5):
        t0 = time.time()
        print(f"rollout {it} start", flush=True)
        res = ray.get(manager.rollout.remote(4))
        print(f"rollout {it} done: {res} ({time.time() - t0:.2f}s)", flush=True)
    print("all rollouts done", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
