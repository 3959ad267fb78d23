"""Rollout producer's fire-and-forget run() loop dies; the consumer polls an empty buffer forever.

Incident: a Producer actor (rollout engine wrapper) is started with `producer.run.remote()` and the
ObjectRef is never awaited. At its 3rd item the engine returns garbage and run() raises
RuntimeError("rollout engine returned malformed batch"). The actor process stays alive, so pop()
keeps answering "empty"; the Consumer actor sleeps and retries forever and the driver waits on it.
A good tool names the Producer and the RuntimeError; the Consumer's endless polling is cascade.
"""
import collections
import os
import threading
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "dead-rank", "culprit_ranks": [], "culprit_actors": ["Producer"], "cause": "exception"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


@ray.remote(max_concurrency=2)
class Producer:
    def __init__(self):
        self.buf = collections.deque()
        self.lock = threading.Lock()

    def run(self, n_items=50):
        for i in range(n_items):
            time.sleep(0.4)  # "generate"
            batch = {"idx": i, "tokens": list(range(i, i + 8))}
            if i == 2:
                raise RuntimeError("rollout engine returned malformed batch")
            with self.lock:
                self.buf.append(batch)
            print(f"[producer] produced item {i}", flush=True)
        return n_items

    def pop(self):
        with self.lock:
            return self.buf.popleft() if self.buf else None


@ray.remote
class Consumer:
    def consume(self, producer, n_items):
        got = []
        empty_polls = 0
        while len(got) < n_items:
            item = ray.get(producer.pop.remote(), timeout=30)
            if item is None:
                empty_polls += 1
                if empty_polls % 20 == 0:
                    print(f"[consumer] buffer empty ({empty_polls} polls), have {len(got)}/{n_items}", flush=True)
                time.sleep(0.5)
                continue
            got.append(item)
            print(f"[consumer] got item {item['idx']}", flush=True)
        return len(got)


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    producer = Producer.remote()
    consumer = Consumer.remote()
    producer.run.remote(50)  # fire and forget, as the real rollout loop did
    try:
        n = ray.get(consumer.consume.remote(producer, 8), timeout=120)
        print(time.strftime("%H:%M:%S"), f"[driver] consumed {n} items")
    except ray.exceptions.GetTimeoutError:
        print(time.strftime("%H:%M:%S"), "[driver] consumer did not finish within 120 s; giving up", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
