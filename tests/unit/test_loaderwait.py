"""A culprit stuck outside collectives that waits for a DataLoader batch: the verdict names
its workers that are inside the dataset and where (blind job tr_dl_fork_lock: a worker
forked while the rank's reporter thread held a lock blocks on it in __getitem__)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from ruleutil import check  # noqa: E402
from synth import R, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

RANK_WAITS = (
    "_PollLikeSelector.select /usr/lib/python3.11/selectors.py:415",
    "wait /usr/lib/python3.11/multiprocessing/connection.py:947",
    "Queue.get /usr/lib/python3.11/multiprocessing/queues.py:113",
    "_MultiProcessingDataLoaderIter._try_get_data /site-packages/torch/utils/data/dataloader.py:1291",
    "_MultiProcessingDataLoaderIter._get_data /site-packages/torch/utils/data/dataloader.py:1455",
    "_MultiProcessingDataLoaderIter._next_data /site-packages/torch/utils/data/dataloader.py:1494",
    "main job.py:123",
    "<module> job.py:146",
)
IN_DATASET = (
    "log_line job.py:69",
    "ForkLockDataset.__getitem__ job.py:83",
    "_MapDatasetFetcher.fetch.<locals>.<listcomp> /site-packages/torch/utils/data/_utils/fetch.py:54",
    "_MapDatasetFetcher.fetch /site-packages/torch/utils/data/_utils/fetch.py:54",
    "_worker_loop /site-packages/torch/utils/data/_utils/worker.py:374",
    "BaseProcess.run /usr/lib/python3.11/multiprocessing/process.py:108",
)
IDLE_WORKER = (
    "_PollLikeSelector.select /usr/lib/python3.11/selectors.py:415",
    "Queue.get /usr/lib/python3.11/multiprocessing/queues.py:113",
    "_worker_loop /site-packages/torch/utils/data/_utils/worker.py:334",
)
SAMPLER = ("hangtrace-memory", ("Condition.wait /usr/lib/python3.11/threading.py:331",))


def _job(worker_frames, worker_threads=(SAMPLER,), extra_user_thread=False):
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll("0", n=14)
    r0.wait("0")
    r1.set(stacks=stack(*RANK_WAITS, active=False), stack_source="py-spy")
    r0.set(
        stacks=stack("_engine_run_backward /site-packages/torch/autograd/graph.py:979", "main job.py:126"),
        stack_source="py-spy",
    )
    workers = []
    for pid in (2001, 2002):
        threads = list(worker_threads) + (
            [("reporter", ("reporter job.py:95",))] if extra_user_thread else []
        )
        w = R(1, 2, groups=[], pid=pid, phase=None).set(
            stacks=stack(*worker_frames, active=False, extra_threads=threads),
            stack_source="py-spy",
            meta={"rank_source": 0, "ppid": r1.pid},
        )
        workers.append(w)
    idle = R(0, 2, groups=[], pid=2003, phase=None).set(
        stacks=stack(*IDLE_WORKER, active=False),
        stack_source="py-spy",
        meta={"rank_source": 0, "ppid": r0.pid},
    )
    return diagnose(snap([r0, r1, idle] + workers))


def test_the_rank_waiting_for_a_batch_names_its_workers_inside_the_dataset():
    d = check(_job(IN_DATASET), "stuck-outside-collective", [1])
    text = d.details["loader_wait"]
    assert text.startswith(
        "rank 1 waits for a batch from its DataLoader (_MultiProcessingDataLoaderIter."
        "_try_get_data (dataloader.py:1291)); its workers pid 2001, 2002 are inside the dataset: "
        "log_line (job.py:69) < ForkLockDataset.__getitem__ (job.py:83)"
    ), text
    assert "forked" in text and "each one's only thread" in text  # our sampler thread is not theirs
    assert "Rank 1 waits for a batch" in d.summary and "log_line (job.py:69)" in d.summary, d.summary
    assert text in d.evidence and "2003" not in text  # rank 0's idle worker is not named


def test_a_worker_with_another_thread_or_a_known_wait_gets_no_fork_lock_hint():
    d = check(_job(IN_DATASET, extra_user_thread=True), "stuck-outside-collective", [1])
    assert "log_line (job.py:69)" in d.details["loader_wait"] and "forked" not in d.details["loader_wait"]
    sleeping = ("sleep job.py:70",) + IN_DATASET[1:]
    d = check(_job(sleeping), "stuck-outside-collective", [1])
    assert "(sleep in sleep (job.py:70))" in d.details["loader_wait"], d.details["loader_wait"]


def test_idle_workers_say_so_and_other_stuck_ranks_get_nothing():
    d = check(_job(IDLE_WORKER), "stuck-outside-collective", [1])
    assert d.details["loader_wait"].endswith("none of its 2 live workers is inside the dataset")
    # a rank stuck elsewhere (a queue of its own): no DataLoader sentence
    r0, r1 = R(0, 2), R(1, 2)
    for b in (r0, r1):
        b.coll("0", n=14)
    r0.wait("0")
    r1.set(stacks=stack("get /usr/lib/python3.11/queue.py:171", "main job.py:50"), stack_source="py-spy")
    d = check(diagnose(snap([r0, r1])), "stuck-outside-collective", [1])
    assert "loader_wait" not in d.details


def test_every_rank_waiting_for_its_dataloader_is_said_with_what_the_workers_do():
    """Blind helper 93: a slow first batch (a loaded machine) under --stall-s 10: nothing
    progressed and no rank is in a collective. The verdict says every rank waits for its
    DataLoader and what the workers do (running the dataset's code: a slow batch), with
    advice to raise --stall-s, not "read the stack classes"."""
    from hangtrace.tracer.report.advice import LOADER_WAIT_NEXT

    ranks_, workers = [], []
    for r in (0, 1):
        b = R(r, 2)
        b.coll("0", n=3)
        b.set(stacks=stack(*RANK_WAITS, active=False), stack_source="py-spy")
        ranks_.append(b)
        workers.append(
            R(r, 2, groups=[], pid=3000 + r, phase=None).set(
                stacks=stack(*IN_DATASET, active=True),
                stack_source="py-spy",
                meta={"rank_source": 0, "ppid": b.pid},
            )
        )
    d = diagnose(snap(ranks_ + workers))
    assert (d.kind, str(d.cause)) == ("unknown", "stalled-outside-collectives"), (d.kind, d.cause, d.summary)
    text = d.details["loader_wait"]
    assert text.startswith(
        "every rank waits for a batch from its DataLoader (_MultiProcessingDataLoaderIter."
        "_try_get_data (dataloader.py:1291)); their workers pid 3000, 3001 are inside the dataset: "
        "log_line (job.py:69) < ForkLockDataset.__getitem__ (job.py:83), running"
    ), text
    assert text in d.summary and LOADER_WAIT_NEXT in d.summary, d.summary
    # one rank elsewhere (not in its DataLoader): no such sentence
    ranks_[1].set(
        stacks=stack("get /usr/lib/python3.11/queue.py:171", "main job.py:50"), stack_source="py-spy"
    )
    assert "loader_wait" not in diagnose(snap(ranks_ + workers)).details
