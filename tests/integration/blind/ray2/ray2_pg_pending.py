"""A controller places its inference worker in a placement group no node can satisfy.

Incident (serving controller copied from a TPU deployment): the driver starts a
ServeController actor, which reserves a placement group with one bundle {"CPU": 1, "TPU": 1}
for its InferenceWorker and creates the worker inside it (PlacementGroupSchedulingStrategy).
The controller waits 5 s for the group, logs "not ready yet, the autoscaler will add a node"
and hands the worker's handle to the driver anyway. This local cluster has no TPU resource and
no autoscaler, so the placement group stays PENDING and the worker never gets a process. The
driver blocks in ray.get(worker.load_model.remote()) while a background thread of the driver
pings the controller (which answers: it is healthy and idle). No process died, no collective.

EXPECTED verdict: kind unschedulable-actor; culprit_ranks []; culprit_actors
InferenceWorker 'infer-0' (asks for {CPU: 1, TPU: 1} through its placement group; no node has
TPU); cause none. The driver (in ray.get on InferenceWorker.load_model) waits for it; the
controller is not a culprit.
"""
import os
import threading
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

LAUNCH = "ray"
EXPECT = {"kind": "unschedulable-actor", "culprit_ranks": [],
          "culprit_actors": ["InferenceWorker 'infer-0'"], "cause": None}


def tracing_env():
    return {k: v for k, v in os.environ.items() if k.startswith("HANGTRACE")}


def log(msg):
    print(time.strftime("%H:%M:%S"), f"[driver] {msg}", flush=True)


@ray.remote
class InferenceWorker:
    def __init__(self, model_name):
        self.model_name = model_name
        self.model = None

    def load_model(self):
        import torch
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        return f"{self.model_name} loaded, {sum(p.numel() for p in self.model.parameters())} params"

    def infer(self, x):
        import torch
        with torch.no_grad():
            return self.model(torch.tensor(x)).argmax(-1).tolist()


@ray.remote
class ServeController:
    def __init__(self):
        self.workers = {}
        self.pgs = {}

    def start_worker(self, name, model_name):
        pg = placement_group([{"CPU": 1, "TPU": 1}], strategy="STRICT_PACK", name=f"pg-{name}")
        ready, _ = ray.wait([pg.ready()], timeout=5)
        if not ready:
            print(f"[controller] placement group for {name} not ready after 5 s; "
                  "creating the worker anyway, the autoscaler will add a node", flush=True)
        worker = InferenceWorker.options(
            name=name,
            num_cpus=1,
            resources={"TPU": 1},
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                 placement_group_bundle_index=0),
        ).remote(model_name)
        self.workers[name] = worker
        self.pgs[name] = pg
        return worker

    def health(self):
        return {"workers": list(self.workers), "time": time.time()}


def main():
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": tracing_env()})
    log(f"cluster resources: {ray.cluster_resources()}")
    controller = ServeController.options(name="serve-controller").remote()
    worker = ray.get(controller.start_worker.remote("infer-0", "tiny-llm-8b"), timeout=120)
    log("got worker handle infer-0 from the controller; loading the model ...")

    stop = threading.Event()

    def health_loop():
        while not stop.wait(15):
            try:
                h = ray.get(controller.health.remote(), timeout=10)
                log(f"health: controller ok, workers {h['workers']}")
            except Exception as e:  # noqa: BLE001
                log(f"health check failed: {type(e).__name__}")

    threading.Thread(target=health_loop, daemon=True, name="health").start()
    try:
        msg = ray.get(worker.load_model.remote(), timeout=120)
        log(f"model ready: {msg}")
        log(f"first answer {ray.get(worker.infer.remote([[0.1] * 64]), timeout=60)}")
    except ray.exceptions.GetTimeoutError:
        log("infer-0 never loaded its model within 120 s; giving up")
    stop.set()
    ray.shutdown()
    log("shut down")


if __name__ == "__main__":
    main()
