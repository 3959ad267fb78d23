"""A small Ray job whose one actor dies (issue 41: the console of `hangtrace run`).

The driver starts a local Ray (2 CPUs), one ``Worker`` actor named ``worker-0`` that does
two steps of work and then SIGKILLs itself in its third (as a host OOM kill would); the
driver's ``ray.get`` fails with Ray's actor-died error, it holds ``--hold-s`` seconds (so
the actor's death is collected while Ray still answers), shuts Ray down, lives
``--after-s`` seconds more and exits 1. Ray's workers ending at the shutdown (and pooled
idle workers retired on the way) are the lifecycle chatter that belongs in the watcher log.
"""

import argparse
import os
import signal
import sys
import time

import ray


@ray.remote
class Worker:
    def step(self, n: int) -> int:
        time.sleep(0.2)
        if n == 2:
            print("worker pid %d: SIGKILL myself in step %d" % (os.getpid(), n), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-s", type=float, default=8.0)
    ap.add_argument(
        "--after-s", type=float, default=4.0, help="seconds the driver lives after ray.shutdown()"
    )
    a = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    w = Worker.options(name="worker-0").remote()
    try:
        for n in range(5):
            print("step %d done: %s" % (n, ray.get(w.step.remote(n), timeout=60)), flush=True)
    except Exception as e:  # RayActorError: the actor died
        print("driver: step failed: %s" % type(e).__name__, flush=True)
        time.sleep(a.hold_s)  # (Ray still answers the collection)
        ray.shutdown()  # its workers end while the driver lives on: no new incident
        time.sleep(a.after_s)
        return 1
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
