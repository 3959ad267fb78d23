"""Two inference engine actors: one busy with long prefills (progressing), one wedged on a lock.

Incident (sglang #22511 in spirit): the driver waits on two engine actors. engine-A is slow but
healthy: long CPU "prefills" that advance chunk by chunk (tracer.phase per request and
tracer.heartbeat per chunk). engine-B is wedged: its scheduler thread took the engine lock,
crashed on a bad request and died without releasing it; every generate() on B blocks in
lock.acquire(). No collectives, no dead process. A good tool: stuck-outside-collective naming
engine-B, and does NOT blame the busy engine-A.
"""
import os
import threading
import time

import ray

LAUNCH = "ray"
EXPECT = {"kind": "stuck-outside-collective", "culprit_ranks": [], "culprit_actors": ["engine-B"],
          "cause": "blocked"}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


try:
    from hangtrace import tracer
except ImportError:  # tracing API is optional
    tracer = None


@ray.remote
class Engine:
    def __init__(self, name, crash_scheduler):
        import numpy as np
        self.name = name
        self.lock = threading.Lock()
        self.w = np.random.rand(256, 256).astype("float32")
        self.scheduler = threading.Thread(target=self._scheduler_loop, args=(crash_scheduler,),
                                          name="scheduler", daemon=True)
        self.scheduler.start()
        time.sleep(0.5)

    def _scheduler_loop(self, crash):
        for i in range(1000000):
            self.lock.acquire()
            if crash and i == 3:
                # bad request: the thread dies while holding the lock (no try/finally)
                raise RuntimeError("scheduler: malformed sampling params in request 3")
            self.lock.release()
            time.sleep(0.05)

    def _prefill(self, req, n_chunks):
        import numpy as np
        x = np.random.rand(64, 256).astype("float32")
        for _ in range(n_chunks):
            t_end = time.time() + 0.25
            while time.time() < t_end:
                x = np.tanh(x @ self.w)
            if tracer is not None:
                tracer.heartbeat()
        return float(x.sum())

    def generate(self, n_requests, chunks_per_request):
        out = []
        for req in range(n_requests):
            with self.lock:  # the engine lock guards the KV cache
                if tracer is not None:
                    with tracer.phase("prefill"):
                        out.append(self._prefill(req, chunks_per_request))
                else:
                    out.append(self._prefill(req, chunks_per_request))
            if req % 5 == 0:
                print(f"[{self.name}] request {req} done", flush=True)
        return len(out)


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": tracing_env()})
    a = Engine.options(name="engine-A").remote("engine-A", False)
    b = Engine.options(name="engine-B").remote("engine-B", True)
    # engine-A: 30 requests x 12 chunks x 0.25 s = ~90 s of busy prefills
    refs = {"engine-A": a.generate.remote(30, 12), "engine-B": b.generate.remote(30, 12)}
    t0 = time.time()
    pending = list(refs.values())
    while pending and time.time() - t0 < 140:
        done, pending = ray.wait(pending, timeout=5)
        for r in done:
            name = [k for k, v in refs.items() if v == r][0]
            print(time.strftime("%H:%M:%S"), f"[driver] {name} finished: {ray.get(r)} requests after {time.time() - t0:.0f} s", flush=True)
    for name, r in refs.items():
        if r in pending:
            print(time.strftime("%H:%M:%S"), f"[driver] {name} still has not answered after {time.time() - t0:.0f} s", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
