"""Two single-threaded actors call each other synchronously: a method-call deadlock.

Incident: PolicyTrainer.step() asks the RewardServer to score a batch with a blocking
ray.get(reward.score.remote()); RewardServer.score() needs the current policy version and calls
ray.get(trainer.policy_version.remote()) back. Both actors have max_concurrency=1, so the
callback queues behind step() forever: neither actor is in a collective, no process died.
The vocabulary has no word for a cycle of actor method calls; a good tool should say
"actor-deadlock" (proposal) and name both actors of the cycle.
"""
import os
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "actor-deadlock", "kind_is_proposal": True, "culprit_ranks": [],
          "culprit_actors": ["PolicyTrainer", "RewardServer"], "cause": None}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


@ray.remote(max_concurrency=1)
class PolicyTrainer:
    def __init__(self):
        self.version = 0
        self.reward = None

    def set_reward_server(self, reward):
        self.reward = reward

    def policy_version(self):
        return self.version

    def step(self, step):
        batch = [step * 10 + i for i in range(4)]
        print(f"[trainer] step {step}: scoring {len(batch)} samples", flush=True)
        scores = ray.get(self.reward.score.remote(batch))
        self.version += 1
        return sum(scores)


@ray.remote(max_concurrency=1)
class RewardServer:
    def __init__(self):
        self.trainer = None

    def set_trainer(self, trainer):
        self.trainer = trainer

    def score(self, batch):
        # tag scores with the policy version they were computed for
        version = ray.get(self.trainer.policy_version.remote())
        return [float(x) + 0.01 * version for x in batch]


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    trainer = PolicyTrainer.remote()
    reward = RewardServer.remote()
    ray.get([trainer.set_reward_server.remote(reward), reward.set_trainer.remote(trainer)])
    print(time.strftime("%H:%M:%S"), "[driver] actors ready", flush=True)
    try:
        total = ray.get(trainer.step.remote(1), timeout=120)
        print(time.strftime("%H:%M:%S"), f"[driver] step 1 reward {total}")
    except ray.exceptions.GetTimeoutError:
        print(time.strftime("%H:%M:%S"), "[driver] trainer.step(1) did not return within 120 s", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
