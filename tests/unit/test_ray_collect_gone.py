"""The watcher's cluster-wide collection gives up as soon as the Ray cluster goes away.

Found by a blind Ray job (4 actors, a gloo mismatch, the driver's ``ray.get`` raising
``ActorDiedError`` and its ``ray.shutdown()`` stopping the cluster it had started): the
death was seen within a second, but the verdict came 100 s later, when the collector
child, retrying ``ray.init`` against the stopped GCS, was killed at its time limit. Here a
real TCP listener stands in for the GCS port and a real child process for the collector
(Ray itself is not needed: what is tested is the watcher's wait)."""

import socket
import time

from hangtrace.tracer.collect.ray import rayjob


def test_collection_gives_up_when_the_gcs_stops_answering(monkeypatch, tmp_path):
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen(16)
    address = "127.0.0.1:%d" % gcs.getsockname()[1]
    monkeypatch.setattr(
        rayjob, "_RAY_COLLECT_CODE", "import time; time.sleep(120)"
    )  # a collector stuck in ray.init
    monkeypatch.setattr(rayjob, "GCS_CHECK_S", 0.3)
    lines = []
    t0 = time.monotonic()
    import threading

    threading.Timer(1.0, gcs.close).start()  # the driver's ray.shutdown(): the GCS port closes
    assert (
        rayjob.ray_collect(str(tmp_path), "request", log=lines.append, address=address, timeout_s=60) is None
    )
    took = time.monotonic() - t0
    assert took < 10, took
    assert (
        len(lines) == 1 and "the cluster went away during the collection" in lines[0] and address in lines[0]
    ), lines


def test_collection_still_waits_for_a_cluster_that_answers(monkeypatch, tmp_path):
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen(64)
    address = "127.0.0.1:%d" % gcs.getsockname()[1]
    monkeypatch.setattr(rayjob, "_RAY_COLLECT_CODE", "import time; time.sleep(120)")
    monkeypatch.setattr(rayjob, "GCS_CHECK_S", 0.3)
    lines = []
    t0 = time.monotonic()
    try:
        assert (
            rayjob.ray_collect(str(tmp_path), "request", log=lines.append, address=address, timeout_s=3)
            is None
        )
    finally:
        gcs.close()
    assert time.monotonic() - t0 >= 2.9
    assert len(lines) == 1 and "did not finish in 3 s" in lines[0], lines
