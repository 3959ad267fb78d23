"""The verdict vocabulary is covered: every ``Kind`` and every ``Cause`` (and the
"exit-code N" family) has at least one scenario that produces it, with a non-empty
verdict paragraph, and every rule has its own test file (issue 8). Adding a member or a
rule without a scenario fails here.

The scenarios are the golden cases (``golden/*.out.json[.gz]``: every diagnosis the
analysis/report unit tests make, see test_golden.py).
"""

import glob
import gzip
import json
import os
from typing import Dict, List, Set, Tuple

from hangtrace.tracer.analyze.rules import ALL_RULES
from hangtrace.tracer.diagnosis import EXIT_CODE_PREFIX, Cause, Kind
from hangtrace.tracer.report.advice import DEAD_NEXT, NEXT

HERE = os.path.dirname(os.path.abspath(__file__))


def _golden_outputs() -> List[Tuple[str, Dict[str, object]]]:
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "golden", "*.out.json*"))):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            for case in json.load(f):
                out.append((os.path.basename(path), case))
    return out


CASES = _golden_outputs()


def _produced() -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
    kinds: Dict[str, Set[str]] = {}
    causes: Dict[str, Set[str]] = {}
    for name, case in CASES:
        d = case["diagnosis"]
        if not str(case["paragraph"]).strip():
            continue  # an empty explanation does not count
        kinds.setdefault(d["kind"], set()).add(name)
        if d["cause"] is not None:
            causes.setdefault(d["cause"], set()).add(name)
    return kinds, causes


def test_golden_scenarios_exist() -> None:
    assert len(CASES) > 100


def test_every_kind_has_a_scenario_and_an_explanation() -> None:
    kinds, _ = _produced()
    missing = [k.value for k in Kind if k.value not in kinds]
    assert not missing, "kinds without a scenario (add a test under tests/unit/rules/): %s" % missing


def test_every_cause_has_a_scenario_and_an_explanation() -> None:
    _, causes = _produced()
    missing = [c.value for c in Cause if c.value not in causes]
    assert not missing, "causes without a scenario (add a test under tests/unit/rules/): %s" % missing
    assert any(c.startswith(EXIT_CODE_PREFIX) for c in causes), "no 'exit-code N' scenario"


def test_every_kind_and_dead_cause_has_advice() -> None:
    for k in Kind:
        if k is not Kind.DEAD_RANK:
            assert NEXT.get(k.value), "no 'Next:' advice for kind %s" % k.value
    _, causes = _produced()
    dead = {
        c
        for name, case in CASES
        for c in [case["diagnosis"]["cause"]]
        if case["diagnosis"]["kind"] == Kind.DEAD_RANK.value and c and not c.startswith(EXIT_CODE_PREFIX)
    }
    assert dead, "no dead-rank scenario"
    assert not dead - set(DEAD_NEXT), "dead-rank causes without advice: %s" % sorted(dead - set(DEAD_NEXT))


def test_paragraph_names_the_kind() -> None:
    """Every paragraph opens with the words of its kind (not another kind's text); Ray
    actors without a rank (rule actors) read 'Stuck Ray actors' / 'Failed Ray actor'."""
    opening = {
        Kind.COLLECTIVE_MISMATCH.value: ("Collective mismatch",),
        Kind.SKIPPED_COLLECTIVE.value: ("Skipped collective",),
        Kind.CROSS_GROUP_DEADLOCK.value: ("Cross-group deadlock",),
        # Ray actors without a rank (rules actors, rankless_root) open with the actor
        Kind.STUCK_OUTSIDE_COLLECTIVE.value: ("Stuck outside collectives", "Stuck Ray actors"),
        Kind.DEAD_RANK.value: ("Dead rank", "Failed Ray actor"),
        Kind.TRANSPORT_ERROR.value: ("Transport error",),
        Kind.PROGRESSING.value: ("Progressing",),
        Kind.ACTOR_DEADLOCK.value: ("Actor deadlock",),
        Kind.UNSCHEDULABLE_ACTOR.value: ("Unschedulable Ray actor",),
        Kind.UNKNOWN.value: ("Unknown", "No traced process", "Ranks "),
    }
    assert set(opening) == {k.value for k in Kind}
    for name, case in CASES:
        d = case["diagnosis"]
        text = d["summary"] or case["paragraph"]
        assert str(text).startswith(opening[d["kind"]]), (name, d["kind"], text[:80])


def test_every_rule_has_its_test_file() -> None:
    for rule in ALL_RULES:
        path = os.path.join(HERE, "rules", "test_rule_%s.py" % rule.NAME)
        assert os.path.exists(path), "rule %s has no tests/unit/rules/test_rule_%s.py" % (
            rule.NAME,
            rule.NAME,
        )
