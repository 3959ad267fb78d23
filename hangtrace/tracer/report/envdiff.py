"""Rendering of environment differences (issue 12): ``hangtrace env-diff`` and the text
report's "Environment differences" section."""

from typing import Any, Dict, List

from hangtrace.tracer.analyze.envdiff import Difference, EnvDiff, short, who

_TITLE = {"library": "library", "version": "version", "environment": "environment"}


def difference_line(d: Difference) -> str:
    """``libnccl.so: ranks 4–7 on host b: build-id 9f…, 2.21.5; the others (ranks 0–3 on
    host a): build-id 1c…, 2.23.4``. The largest group is "the others"."""
    *minor, major = d.groups
    parts = ["%s: %s" % (who(g), short(g.value)) for g in minor]
    parts.append("the others (%s): %s" % (who(major), short(major.value)))
    return "%s %s: %s" % (_TITLE.get(d.kind, d.kind), d.name, "; ".join(parts))


def render_text(diff: EnvDiff) -> str:
    """The ``env-diff`` console output."""
    if diff.processes == 0:
        return "no environment records (RUN_DIR/env/*.json): was the job traced by this hangtrace version?"
    head = "compared %d process(es) on %d fact(s): " % (diff.processes, diff.facts)
    if not diff.differences:
        return head + "no differences"
    lines = [head + "%d difference(s)" % len(diff.differences)]
    lines += ["  " + difference_line(d) for d in diff.differences]
    return "\n".join(lines)


def render_json(diff: EnvDiff) -> Dict[str, Any]:
    """JSON-ready dict: ``{processes, facts, differences: [{kind, name, groups: [{value,
    ranks, hosts, pids}]}]}``; full build-ids, majority group last."""
    return {
        "processes": diff.processes,
        "facts": diff.facts,
        "differences": [
            {
                "kind": d.kind,
                "name": d.name,
                "groups": [
                    {
                        "value": g.value,
                        "ranks": list(g.ranks),
                        "hosts": list(g.hosts),
                        "pids": [m.pid for m in g.members],
                    }
                    for g in d.groups
                ],
            }
            for d in diff.differences
        ],
    }


def environment_section(diff: EnvDiff, max_lines: int = 8) -> str:
    """The text report's short section ("" when nothing differs): a title and at most
    ``max_lines`` difference lines, libraries first."""
    if not diff.differences:
        return ""
    lines: List[str] = ["Environment differences (hangtrace env-diff RUN_DIR for all):"]
    lines += ["  " + difference_line(d) for d in diff.differences[:max_lines]]
    if len(diff.differences) > max_lines:
        lines.append("  ... %d more" % (len(diff.differences) - max_lines))
    return "\n".join(lines)
