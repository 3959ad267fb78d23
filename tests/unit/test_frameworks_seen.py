"""Issue 37, bad input: the verdict names the training framework and the version it saw in the
environment records (``analyze/frameworks.py``), and says when that version is not one
hangtrace was tested with; the verdict itself comes from the general rules either way."""

import json
import os
import sys

from hangtrace.tracer import envfacts as E
from hangtrace.tracer.analyze.diagnose import diagnose
from hangtrace.tracer.analyze.frameworks import NOT_TESTED, frameworks_seen

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth  # noqa: E402


def _env(rank, pid, frameworks, **packages):
    return E.from_json(
        {
            "schema": E.SCHEMA,
            "host": "h0",
            "pid": pid,
            "reason": "join",
            "packages": dict(torch="2.13.0+cpu", **packages),
            "frameworks": frameworks,
        }
    )._replace(rank=rank)


def _hang():
    """Rank 1 never reached all_reduce seq 4 on the world group: a skipped collective."""
    rs = synth.ranks(2, steps=3)
    rs[0].wait("0", n=1)
    return synth.snap(rs)


def test_a_known_version_is_named_and_an_unknown_one_is_said_to_be_untested_with_the_same_verdict():
    tested = [_env(r, 100 + r, ["pytorch_lightning"], pytorch_lightning="2.6.6") for r in (0, 1)]
    newer = [_env(r, 100 + r, ["pytorch_lightning"], pytorch_lightning="2.9.1") for r in (0, 1)]
    plain = diagnose(_hang(), stall_s=15)
    a = diagnose(_hang(), stall_s=15, envs=tested)
    b = diagnose(_hang(), stall_s=15, envs=newer)
    # the general mechanisms: the same verdict with either version, or none recorded
    assert (a.kind, a.culprit_ranks) == (b.kind, b.culprit_ranks) == (plain.kind, plain.culprit_ranks)
    assert a.culprit_ranks == [1], a.summary
    fa, fb = a.details["frameworks"], b.details["frameworks"]
    assert [(f["name"], f["versions"], f["tested"], f["ranks"]) for f in fa] == [
        ("PyTorch Lightning", ["2.6.6"], True, [0, 1])
    ]
    assert [(f["name"], f["versions"], f["tested"]) for f in fb] == [("PyTorch Lightning", ["2.9.1"], False)]
    line_a = [ln for ln in a.evidence if ln.startswith("framework seen")]
    line_b = [ln for ln in b.evidence if ln.startswith("framework seen")]
    assert line_a == ["framework seen in the records: PyTorch Lightning 2.6.6"], a.evidence
    assert len(line_b) == 1 and "PyTorch Lightning 2.9.1 (%s; tested: 2.6.6)" % NOT_TESTED in line_b[0]
    assert "frameworks" not in plain.details and not any("framework" in ln for ln in plain.evidence)
    json.dumps(b.details["frameworks"])  # (schema 1: plain JSON)


def test_stacked_frameworks_older_records_and_a_missing_version():
    hf = _env(
        0, 7, ["transformers.trainer", "accelerate.accelerator"], transformers="5.25.0", accelerate="1.16.0"
    )
    rt = E.ProcessEnv(host="h0", pid=8, rank=1, ray="2.61.0", frameworks=("ray.train",))  # no packages
    odd = _env(2, 9, ["lightning.pytorch"])  # the unified package, its version not recorded
    old = E.from_json(
        {"schema": E.SCHEMA, "host": "h0", "pid": 10, "packages": {"pytorch-lightning": "2.6.6"}}
    )
    assert old.frameworks == ()  # a record of an older version: nothing said
    seen = {f["name"]: f for f in frameworks_seen([hf, rt, odd, old])}
    assert list(seen) == ["Ray Train", "Lightning", "Hugging Face Trainer", "Accelerate"]
    assert seen["Ray Train"]["versions"] == ["2.61.0"] and not seen["Ray Train"]["tested"]
    assert seen["Lightning"]["versions"] == [] and not seen["Lightning"]["tested"]
    assert seen["Hugging Face Trainer"]["tested"] and seen["Accelerate"]["tested"]
    d = diagnose(_hang(), stall_s=15, envs=[hf, rt])
    line = [ln for ln in d.evidence if ln.startswith("frameworks seen")]
    assert line == [
        "frameworks seen in the records: Ray Train 2.61.0 (%s; tested: 2.60.0), Hugging Face Trainer "
        "5.25.0, Accelerate 1.16.0; the general mechanisms apply, framework-specific knowledge may "
        "not fit this version" % NOT_TESTED
    ], d.evidence
    # the record round-trips through the file format
    assert E.from_json(E.to_json(hf)).frameworks == ("transformers.trainer", "accelerate.accelerator")


def test_the_environment_record_lists_the_framework_modules_loaded_at_its_time():
    import types

    from hangtrace.hooks.env import envcollect

    name = "accelerate.accelerator"
    had = sys.modules.get(name)
    sys.modules[name] = types.ModuleType(name)  # as `from accelerate import Accelerator` leaves it
    try:
        assert name in envcollect.collect_self("test").frameworks
    finally:
        if had is None:
            del sys.modules[name]
        else:
            sys.modules[name] = had
    assert name not in envcollect.collect_self("test").frameworks or had is not None


def test_the_tested_versions_are_the_pins_of_setup_cfgs_frameworks_extra():
    """analyze/frameworks.FRAMEWORKS copies the pins the blind corpus ran with: a pin moved in
    setup.cfg without the table would call the tested version untested."""
    import configparser
    import os
    import re

    from hangtrace.tracer.analyze.frameworks import FRAMEWORKS, _norm

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(__file__), "..", "..", "setup.cfg"))
    pins = {}
    for line in cfg["options.extras_require"]["frameworks"].split():
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)$", line)
        assert m, line
        pins[_norm(m.group(1))] = m.group(2)
    table = {fw.distribution: fw.tested for fw in FRAMEWORKS if fw.tested}
    assert {d: (v,) for d, v in pins.items()} == table
