"""The words for a straggler (issue 43): ``details['straggler']`` in, one phrase out. Pure.

Used by the paragraph of a progressing verdict (``rankparagraph.progressing_text``), the
watcher's log (``watch/stragglerwatch.py``) and the timeline's track name.
"""

import time
from typing import Any, Mapping


def _ms(x: float) -> str:
    return "%.0f" % x if abs(x) >= 10 else "%.1f" % x


def straggler_phrase(st: Mapping[str, Any]) -> str:
    """``rank 2 is slow: +30 ms per step (+75 %), in phase 'train', since step 20`` (the parts
    not known left out; a straggler slow from before the oldest recorded step: ``since
    before step N``)."""
    s = "rank %s is slow: +%s ms per step" % (st.get("rank"), _ms(float(st.get("added_ms_per_step") or 0.0)))
    if st.get("added_pct") is not None:
        s += " (+%.0f %%)" % float(st["added_pct"])
    if st.get("phase"):
        s += ", in phase '%s'" % st["phase"]
    return s + _since(st)


def _clock(wall_ns: Any) -> str:
    """``14:02:11 UTC`` of a wall time in ns since the epoch."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(int(wall_ns) / 1e9))


def _since(st: Mapping[str, Any]) -> str:
    """``, since step 20`` / ``, since step 20 (first seen by the watcher at 14:02:11 UTC)`` /
    ``, since before step 41 (the oldest step still recorded)`` / nothing (docs/STRAGGLERS.md)."""
    seen = st.get("first_seen_wall_ns")
    if st.get("since_step") is not None:
        if st.get("since_source") == "watcher" and seen:
            return ", since step %s (first seen by the watcher at %s)" % (st["since_step"], _clock(seen))
        return ", since step %s" % st["since_step"]
    before = st.get("before_step", st.get("oldest_step"))
    if before is None:
        return ""
    if seen and st.get("oldest_step") is not None and before < st["oldest_step"]:
        return ", since before step %s (the oldest step the watcher had when it first saw it at %s)" % (
            before,
            _clock(seen),
        )
    return ", since before step %s (the oldest step still recorded)" % before


def straggler_sentence(st: Mapping[str, Any]) -> str:
    """The sentence after the phrase: how often it was last, by what margin, in which group."""
    return (
        "It issued last in %s of the newest %s steps (%s of %s collectives of group '%s', %s ranks), a median %s ms "
        "after the others (their noise %s ms); the others wait for it there."
        % (
            st.get("last_steps"),
            st.get("window_steps"),
            st.get("collectives"),
            st.get("window_collectives"),
            st.get("group"),
            st.get("group_size"),
            _ms(float(st.get("margin_ms") or 0.0)),
            _ms(float(st.get("noise_ms") or 0.0)),
        )
    )
