"""Ray's memory monitor kills the newest worker, not the one holding the memory.

Incident (OpenRLHF #936 in spirit): a Rollout actor (the memory hog: a growing KV/sample cache)
pushes the node over Ray's memory-usage threshold. Ray's memory monitor does not kill the hog: it
kills the most recently started worker, a small RewardModel actor that was scoring a batch. The
driver sees OutOfMemoryError from the reward model. Ray's pre-2.56 killing policy is used
(RAY_worker_killing_policy_by_group=true, as in the incident); the threshold is set 2.5 GiB above
the memory used at job start, so the monitor really fires on this 24 GiB machine.
A good tool: dead-rank, RewardModel, cause ray-memory-monitor, and says Rollout held the memory.
"""
import os
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["reward-model"],
          "cause": "ray-memory-monitor"}

GiB = 1 << 30


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def node_memory():
    total = used = None
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    total = info["MemTotal"]
    used = total - info["MemAvailable"]
    return total, used


@ray.remote
class Rollout:
    def ready(self):
        return os.getpid()

    def generate(self, threshold_bytes, hold_s):
        """Grows a sample cache to just below Ray's threshold, waits for the reward model to
        start, then one more batch of samples crosses it by ~64 MiB and is held."""
        import numpy as np
        cache = []
        chunk = 256 << 20
        while node_memory()[1] + chunk < threshold_bytes - (400 << 20):
            cache.append(np.ones(chunk, dtype=np.uint8))
            time.sleep(0.2)
        print(f"[rollout] sample cache {sum(a.nbytes for a in cache) / GiB:.2f} GiB", flush=True)
        time.sleep(6)  # decoding; meanwhile the reward model starts and loads its weights
        last = max(0, threshold_bytes + (64 << 20) - node_memory()[1])
        cache.append(np.ones(last, dtype=np.uint8))
        print(f"[rollout] sample cache {sum(a.nbytes for a in cache) / GiB:.2f} GiB "
              f"(node {node_memory()[1] / GiB:.2f} GiB used, threshold {threshold_bytes / GiB:.2f} GiB)", flush=True)
        time.sleep(hold_s)
        n = len(cache)
        cache.clear()
        print("[rollout] cache released", flush=True)
        return n


@ray.remote(max_restarts=0)
class RewardModel:
    def __init__(self):
        import numpy as np
        self.weights = np.ones(300 << 20, dtype=np.uint8)  # 300 MiB of "reward model weights"

    def ready(self):
        return os.getpid()

    def score(self, n, seconds):
        import numpy as np
        out = []
        t_end = time.time() + seconds
        while time.time() < t_end:
            out.append(float(np.tanh(np.arange(n)).sum()))
            time.sleep(0.05)
        return len(out)


def main():
    total, used = node_memory()
    threshold = min(0.95, (used + 2.5 * GiB) / total)
    os.environ["RAY_memory_usage_threshold"] = f"{threshold:.4f}"
    os.environ["RAY_memory_monitor_refresh_ms"] = "250"
    # the policy of the incident's Ray versions (< 2.56): one worker at a time, chosen by owner
    # group and newest task start, not by memory held
    os.environ["RAY_worker_killing_policy_by_group"] = "true"
    print(time.strftime("%H:%M:%S"), f"[driver] node {total / GiB:.1f} GiB, used {used / GiB:.1f} GiB -> "
          f"RAY_memory_usage_threshold={threshold:.4f} ({threshold * total / GiB:.2f} GiB)", flush=True)
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    rollout = Rollout.options(name="rollout").remote()
    print(time.strftime("%H:%M:%S"), f"[driver] rollout up: pid {ray.get(rollout.ready.remote(), timeout=60)}", flush=True)
    gen = rollout.generate.remote(int(threshold * total), hold_s=20)
    time.sleep(2.0)
    reward = RewardModel.options(name="reward-model").remote()  # started after the rollout: the newest worker
    print(time.strftime("%H:%M:%S"), f"[driver] reward model up: pid {ray.get(reward.ready.remote(), timeout=60)}", flush=True)
    try:
        n = ray.get(reward.score.remote(1000, 20), timeout=90)
        print(time.strftime("%H:%M:%S"), f"[driver] scored {n} batches", flush=True)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] reward model failed: {type(e).__name__}: {str(e)[:1500]}", flush=True)
    try:
        print(time.strftime("%H:%M:%S"), f"[driver] rollout finished: {ray.get(gen, timeout=90)} chunks", flush=True)
    except Exception as e:  # noqa: BLE001
        print(time.strftime("%H:%M:%S"), f"[driver] rollout failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
