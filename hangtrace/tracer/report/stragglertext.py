"""The words for a straggler (issue 43): ``details['straggler']`` in, one phrase out. Pure.

Used by the paragraph of a progressing verdict (``rankparagraph.progressing_text``), the
watcher's log (``watch/stragglerwatch.py``) and the timeline's track name.
"""

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
    if st.get("since_step") is not None:
        s += ", since step %s" % st["since_step"]
    elif st.get("oldest_step") is not None:
        s += ", since before step %s (the oldest recorded)" % st["oldest_step"]
    return s


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
