"""Ranks polling for a condition while another waits for them in a collective (blind helper
62: rank 0's "to be safe" barrier before it writes the marker file ranks 1-3 poll for; the
verdict said "blocked in the system call clock_nanosleep" and named no cycle)."""

import os
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules"))

from ruleutil import check  # noqa: E402
from synth import ranks, snap, stack  # noqa: E402

from hangtrace.tracer.analyze.stuck.blocking import blocking_reason  # noqa: E402
from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.analyze.stuck.pollwait import condition_names  # noqa: E402
from hangtrace.tracer.collect.sourcelines import add_source_lines, enclosing_blocks, following_lines  # noqa: E402

JOB = textwrap.dedent("""\
    import os, time
    import torch.distributed as dist


    def save_checkpoint(rank, marker):
        if rank == 0:
            dist.barrier()  # "to be safe"
            with open(marker, "w") as f:
                f.write("ok")
            print("wrote", marker)
        return marker


    def wait_for_checkpoint(marker):
        while not os.path.exists(marker):
            time.sleep(0.05)
        print("found")
    """)
SLEEP = {"syscall": "clock_nanosleep", "wchan": "hrtimer_nanosleep", "args": []}


def _write(tmp_path):
    p = tmp_path / "job.py"
    p.write_text(JOB)
    return str(p)


def test_collection_reads_the_loop_around_a_sleep_and_the_lines_after_a_wait(tmp_path):
    path = _write(tmp_path)
    assert enclosing_blocks(path, 16) == ([], [15, "while not os.path.exists(marker):"])
    assert following_lines(path, 7) == [
        [8, 'with open(marker, "w") as f:'],
        [9, 'f.write("ok")'],
        [10, 'print("wrote", marker)'],
        [11, "return marker"],
    ]
    assert following_lines(path, 17) == []  # the end of the file and the function
    threads = [
        {
            "active": False,
            "frames": [
                {"name": "wait_for_checkpoint", "filename": path, "line": 16},
                {"name": "<module>", "filename": path, "line": 20},
            ],
        }
    ]
    f = add_source_lines(threads)[0]["frames"][0]
    assert f["code"] == "time.sleep(0.05)" and f["loop"] == [15, "while not os.path.exists(marker):"]
    assert f["next"] == [[17, 'print("found")']]


def test_condition_names_keep_what_is_polled_not_calls_or_modules():
    assert condition_names("while not os.path.exists(marker):") == ["marker"]
    assert condition_names("while not self.ready:") == [".ready"]
    assert condition_names("while not Path(done_file).exists() and tries < 10:") == ["done_file", "tries"]
    assert condition_names("while q.empty():") == []


def test_a_sleep_in_a_loop_is_named_as_polling_and_a_sleep_alone_as_asleep():
    fr = [
        {
            "filename": "/job/job.py",
            "name": "wait_for_checkpoint",
            "line": 16,
            "code": "time.sleep(0.05)",
            "loop": [15, "while not os.path.exists(marker):"],
        }
    ]
    assert blocking_reason(fr, thread={"active": False, "kernel": dict(SLEEP)}) == (
        "polling in a loop: `while not os.path.exists(marker):` (job.py:15) sleeps at `time.sleep(0.05)` "
        "in wait_for_checkpoint (job.py:16)"
    )
    del fr[0]["loop"]
    assert (
        blocking_reason(fr, thread={"active": False, "kernel": dict(SLEEP)})
        == "asleep in wait_for_checkpoint (job.py:16): `time.sleep(0.05)`"
    )


def _job(rank0_next):
    b = ranks(4, steps=6)
    b[0].wait("0", op="barrier")
    r0 = stack(
        "barrier /site-packages/torch/distributed/distributed_c10d.py:5356",
        "save_checkpoint /job/job.py:7",
        "worker /job/job.py:40",
        active=False,
    )
    r0[0]["frames"][1]["next"] = rank0_next
    b[0].set(stacks=r0, stack_source="py-spy")
    for r in (1, 2, 3):
        s = stack("wait_for_checkpoint /job/job.py:16", "worker /job/job.py:42", active=False)
        s[0].update(kernel=dict(SLEEP))
        s[0]["frames"][0].update(code="time.sleep(0.05)", loop=[15, "while not os.path.exists(marker):"])
        b[r].set(stacks=s, stack_source="py-spy")
    return diagnose(snap(b, reason="stall"))


def test_pollers_and_a_waiter_that_writes_what_they_poll_for_right_after_its_collective_are_a_cycle():
    d = check(
        _job([[8, 'with open(marker, "w") as f:'], [9, 'f.write("ok")']]),
        "stuck-outside-collective",
        [1, 2, 3],
    )
    assert "polling in a loop: `while not os.path.exists(marker):` (job.py:15)" in d.summary, d.summary
    assert "Rank 0 waits for them in barrier" in d.summary and (
        "at save_checkpoint (job.py:7) > barrier (distributed_c10d.py:5356)."
        in d.summary  # issue 41: user-first
    ), d.summary
    assert d.details["poll_cycle"] == (
        'rank 0 uses `marker` right after that collective (job.py:8: `with open(marker, "w") as f:`): if that is '
        "what ranks 1-3 poll for, this is a cycle: they wait for a step rank 0 takes only after they join its "
        "collective"
    ), d.details["poll_cycle"]
    assert "Next: take the step the polling ranks wait for before the collective named above" in d.summary


def test_pollers_whose_waiter_does_not_touch_the_condition_get_no_cycle():
    d = check(_job([[8, "model.step()"]]), "stuck-outside-collective", [1, 2, 3])
    assert "poll_cycle" not in d.details and d.details["poll_wait"] == "while not os.path.exists(marker):"
    assert "Next: find what makes the polling loop's condition named above true" in d.summary, d.summary
