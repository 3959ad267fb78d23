"""Rule timeout_waiter: a rank gave up waiting in a collective the rings never saw (DDP's
C++ all-reduce) - its timeout the first failure - while the rank it waited for was outside
collectives by its SIGTERM dump (torchrun's teardown). A job written from such an incident
(2026-12-04): the verdict was "rank 1 died first (sigterm-external): find who sent SIGTERM"."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ruleutil import check  # noqa: E402
from synth import MS, S, ranks, snap  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402

TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
    "15000ms for recv operation to complete"
)
IN_LOADER = (
    "Current thread 0x00007f10a9a7fb80 (most recent call first):\n"
    '  File "/usr/lib/python3.11/selectors.py", line 415 in select\n'
    '  File "/usr/lib/python3.11/multiprocessing/connection.py", line 947 in wait\n'
    '  File "/usr/lib/python3.11/multiprocessing/connection.py", line 440 in _poll\n'
    '  File "/site-packages/torch/utils/data/dataloader.py", line 1291 in _try_get_data\n'
    '  File "/site-packages/torch/utils/data/dataloader.py", line 1454 in _get_data\n'
    '  File "/site-packages/torch/utils/data/dataloader.py", line 1505 in _next_data\n'
    '  File "/job/train.py", line 21 in main\n'
)
IN_ALLREDUCE = (
    "Current thread 0x00007f10a9a7fb80 (most recent call first):\n"
    '  File "/site-packages/torch/distributed/distributed_c10d.py", line 2500 in all_reduce\n'
    '  File "/job/train.py", line 30 in main\n'
)


def _job(peer_stack=IN_LOADER, peer_first=False):
    b = ranks(2, steps=3)
    t = b[0].t + 20 * S
    b[0].set(
        state="exited",
        exit_code=1,
        events=[{"event": "exception", "type": "RuntimeError", "message": TIMEOUT, "wall_ns": t}],
    )
    term = t - 5 * S if peer_first else t + 300 * MS  # torchrun's teardown, 0.3 s after rank 0 exited
    b[1].set(state="killed", signals={"sigterm": {"wall_ns": term, "text": peer_stack}})
    return diagnose(snap(b, reason="death"))


def test_the_rank_a_timed_out_rank_waited_for_is_stuck_outside_collectives():
    d = check(_job(), "stuck-outside-collective", [1])
    assert d.waiting_ranks == [0] and d.details["timed_out"]["rank"] == 0
    assert "select() on sockets/files" in d.details["culprit_reasons"]["1"]
    assert "Rank 1 waits for a batch from its DataLoader (_try_get_data (dataloader.py:1291))" in d.summary, (
        d.summary
    )
    assert "Rank 0 gave up waiting for it in a collective: RuntimeError: " in d.summary, d.summary
    assert [c["rank"] for c in d.cascade] == [0, 1]
    assert "sigterm-external" not in d.summary and "find who sent SIGTERM" not in d.summary
    assert "rank 1 (its last stack, dumped as it died): select()" in "\n".join(d.evidence), d.evidence
    assert any("torn down after the timeout" in e for e in d.evidence), d.evidence


def test_a_peer_that_died_first_is_the_root_not_a_timeout():
    d = check(_job(peer_first=True), "dead-rank", [1])
    assert d.cause in ("sigterm", "sigterm-external"), d.cause


def test_a_peer_inside_a_collective_is_not_named_by_this_rule():
    d = _job(peer_stack=IN_ALLREDUCE)
    assert "timed_out" not in d.details, d.summary


IN_RECV = (
    "Current thread 0x00007f10a9a7fb80 (most recent call first):\n"
    '  File "/job/train.py", line 59 in fetch_shard\n'
    '  File "/job/train.py", line 90 in main\n'
)


def test_a_dumped_stack_in_a_c_call_is_not_called_busy_and_gloos_position_is_cut():
    """Blind helper 89: rank 3 blocked in a socket's recv (a C call, no Python frame for it);
    after the teardown only its SIGTERM dump is left: the reason said "busy, or in C code"."""
    d = check(_job(peer_stack=IN_RECV), "stuck-outside-collective", [1])
    why = d.details["culprit_reasons"]["1"]
    assert why.startswith("no blocking call its stack can name (dumped as it was stopped"), why
    assert "a socket or file read" in why
    assert (
        d.details["timed_out"]["text"]
        == "RuntimeError: Timed out waiting 15000ms for recv operation to complete"
    ), d.details["timed_out"]
