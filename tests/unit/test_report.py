"""report: verdict paragraph, text report, JSON (schema_version 1) and its documentation."""

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from synth import COLL_STACK, group, ranks, snap, stack, world  # noqa: E402

from hangtrace.tracer.analyze.diagnose import diagnose  # noqa: E402
from hangtrace.tracer.diagnosis import Diagnosis  # noqa: E402
from hangtrace.tracer.report.text import SCHEMA_VERSION, diagnosis_json, text_report, verdict_paragraph  # noqa: E402

QUEUE = ("get queue.py:171", "next_batch loader.py:22", "train_step train.py:38", "main train.py:90")
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "DIAGNOSIS.md")


def stuck_case():
    g = [world(4), group("cp", range(4), desc="context_parallel")]
    b = ranks(4, groups=g, grp="cp")
    for r in (0, 1, 3):
        b[r].wait("cp")
        b[r].set(stacks=stack(*COLL_STACK))
    b[2].set(stacks=stack(*QUEUE), phase="rollout", step=7)
    procs = [x.build() for x in b]
    procs[2] = dataclasses.replace(procs[2], phase="rollout", step=7)
    s = snap(procs[:3] + procs[3:], errors=["/run/ring-h0-77.htr: truncated (remedy: copy it again)"])
    return s, diagnose(s)


def test_verdict_paragraph_names_everything():
    s, d = stuck_case()
    assert d.kind == "stuck-outside-collective" and d.culprit_ranks == [2]
    p = verdict_paragraph(d)
    assert "\n" not in p
    for part in (
        "rank 2",
        "group 'cp'",
        "context_parallel",
        "ranks 0-3",
        "seq 4",
        "all_reduce",
        "phase 'rollout'",
        "step 7",
        "get (queue.py:171)",
        "Ranks 0-1,3 wait",
        "Next:",
    ):
        assert part in p, (part, p)
    assert d.summary == p


def test_text_report_sections_and_table():
    s, d = stuck_case()
    t = text_report(d, s)
    assert t.startswith("hangtrace verdict: stuck-outside-collective   culprit rank 2\n")
    for sec in ("Evidence:", "Culprit top frames", "Stack classes", "Ranks:", "Errors"):
        assert sec in t
    rows = {
        ln.split()[0]: ln
        for ln in t.splitlines()[t.splitlines().index("Ranks:") + 2 :]
        if ln.strip() and ln.startswith("  ") and ln.split()[0].rstrip("*").isdigit()
    }
    assert set(rows) == {"0", "1", "2*", "3"}
    assert "h0:1002" in rows["2*"] and "cp/3/all_reduce/completed" in rows["2*"] and "rollout" in rows["2*"]
    assert "cp/4/all_reduce/issued" in rows["0"]
    assert "ring-h0-77.htr: truncated" in t


def test_text_report_missing_ranks_and_row_limit():
    b = ranks(40)
    for r in range(40):
        if r != 7:
            b[r].wait()
    procs = [x.build() for x in b if x.rank not in (30, 31)]
    s = snap(procs)
    d = diagnose(s)
    assert d.culprit_ranks == [7]
    t = text_report(d, s, max_rows=10)
    assert "7*" in t and "more ranks not shown" in t
    full = text_report(d, s, max_rows=None)
    no_file = [ln for ln in full.splitlines() if "no file" in ln]
    assert [ln.split()[0] for ln in no_file] == ["30", "31"]


def test_diagnosis_json_schema():
    s, d = stuck_case()
    js = diagnosis_json(d)
    assert js["schema_version"] == SCHEMA_VERSION == 1
    assert set(js) == {f.name for f in dataclasses.fields(Diagnosis)} | {"schema_version"}
    back = json.loads(json.dumps(js))
    assert back["kind"] == "stuck-outside-collective" and back["culprit_ranks"] == [2]
    assert back["errors"] == s.errors


def test_paragraph_every_kind():
    cases = {
        "collective-mismatch": dict(
            details={
                "signatures": [
                    {"op": "all_reduce", "dtype": "float32", "numel": 4, "peer": None, "ranks": [0, 1]},
                    {"op": "all_gather", "dtype": "float32", "numel": 4, "peer": None, "ranks": [2]},
                ]
            }
        ),
        "skipped-collective": dict(details={"culprit_reasons": {"2": "exited cleanly"}}),
        "cross-group-deadlock": dict(details={"cycle": {"ranks": [0, 1], "groups": ["A", "B"]}}),
        "stuck-outside-collective": {},
        "dead-rank": dict(cause="killed-without-record", details={"cause_text": "pid vanished"}),
        "transport-error": dict(details={"cause_text": "Connection reset by peer"}),
        "progressing": dict(culprit_ranks=[]),
        "unknown": dict(cause="no-data", culprit_ranks=[]),
    }
    for kind, kw in cases.items():
        args = dict(
            kind=kind,
            culprit_ranks=[2],
            group="g",
            group_ranks=[0, 1, 2],
            seq=5,
            op="all_reduce",
            phase="train",
            step=3,
            waiting_ranks=[0, 1],
        )
        args.update(kw)
        p = verdict_paragraph(Diagnosis(**args))
        assert p and "\n" not in p
        if kind not in ("progressing", "unknown"):
            assert "rank 2" in p and "Next:" in p, (kind, p)
    assert "dmesg" in verdict_paragraph(
        Diagnosis(kind="dead-rank", culprit_ranks=[1], cause="killed-without-record")
    )


def test_docs_describe_every_field():
    with open(DOC) as f:
        doc = f.read()
    for f_ in dataclasses.fields(Diagnosis):
        assert "`%s`" % f_.name in doc, f_.name
    for kind in (
        "collective-mismatch",
        "skipped-collective",
        "cross-group-deadlock",
        "stuck-outside-collective",
        "dead-rank",
        "transport-error",
        "progressing",
        "unknown",
        "schema_version",
    ):
        assert kind in doc


def test_paragraph_reaches_the_users_line_below_torch_frames():
    """A collective issued inside torch (DTensor redistribute, FSDP hooks, DDP's reducer):
    the three innermost frames are torch's; the paragraph adds the user's innermost line."""
    from hangtrace.tracer.stackmodel.usercode import user_frame
    from hangtrace.tracer.diagnosis import Diagnosis, Kind
    from hangtrace.tracer.report.paragraph import verdict_paragraph

    lib = "/usr/lib/python3.11/site-packages/torch/"
    frames = [
        {"name": "redispatch", "filename": lib + "_ops.py", "line": 882},
        {"name": "forward_no_grad", "filename": lib + "_library/autograd.py", "line": 41},
        {"name": "redistribute", "filename": lib + "distributed/tensor/_api.py", "line": 500},
        {"name": "<lambda>", "filename": "<frozen importlib._bootstrap>", "line": 1},
        {"name": "log_metrics", "filename": "/home/u/job/train.py", "line": 54},
        {"name": "main", "filename": "/home/u/job/train.py", "line": 90},
    ]
    assert user_frame(frames)["name"] == "log_metrics"
    assert user_frame(frames[:3]) is None
    d = Diagnosis(
        kind=Kind.COLLECTIVE_MISMATCH,
        culprit_ranks=[0],
        frames=["redispatch (_ops.py:882)"],
        details={"user_frame": "log_metrics (train.py:54)"},
    )
    # (a verdict stored without details['place'], re-rendered: user-first too, issue 41)
    assert "log_metrics (train.py:54) > ... > redispatch (_ops.py:882)" in verdict_paragraph(d)
    # the user frame right after the three shown: nothing left out, no '...' (blind helper 49)
    d.frames = ["a (x.py:1)", "b (x.py:2)", "save (serialization.py:1002)", "log_metrics (train.py:54)"]
    assert (
        "log_metrics (train.py:54) > save (serialization.py:1002) > b (x.py:2) > a (x.py:1)"
        in verdict_paragraph(d)
    ), verdict_paragraph(d)
    # analysed now: its place, the user's line and the call it made first, internals folded
    from hangtrace.tracer.analyze.stuck.place import place_of

    d.details["place"] = place_of(frames)
    assert (
        "it is in log_metrics (train.py:54) > <lambda> (<frozen importlib._bootstrap>:1) > (2 more) > "
        "redispatch (_ops.py:882)" in verdict_paragraph(d)
    ), verdict_paragraph(d)
