"""Where a rank is, told user-first (pure, issue 41): the innermost frame of the user's own
code, the library call it made there (``Queue.get``, ``all_reduce``, ``Trainer.fit``), and
the innermost frame, the library internals between them folded.

In: a thread's frames, innermost first (``stackmodel/threads.py``: py-spy's or a traceback's
``{'name', 'filename', 'line'}``). Out: a :data:`Place` dict, stored in the verdict's
``details['place']`` (JSON schema 1, an added key) and rendered by :func:`place_text`::

    {'user': 'Job.rollout (train_faults.py:267)',   # innermost frame of the user's code
     'call': 'Queue.get (queues.py:103)' | None,    # the frame it called (None: it is innermost)
     'folded': 2,                                   # frames between the call and 'inner'
     'inner': '_recv (connection.py:384)' | None}   # the innermost frame (None: it is the call)

    place_text(...) == 'Job.rollout (train_faults.py:267) > Queue.get (queues.py:103) > (2 more)
                        > _recv (connection.py:384)'   (outer > inner, one line)

Which frames are the user's: ``stackmodel/usercode.py`` (not an installed package, the
standard library or a call-forwarding wrapper).
"""

from typing import Any, Dict, List, Optional

from hangtrace.tracer.analyze.stuck.stacktree import frame_label
from hangtrace.tracer.stackmodel.usercode import user_call, wrapper_frame

#: see the module docstring
Place = Dict[str, Any]


def place_of(frames: Optional[List[Any]]) -> Optional[Place]:
    """The :data:`Place` of a stack (frames innermost first), or None when no frame of it
    is the user's own code."""
    shown = [f for f in frames or () if isinstance(f, dict) and not wrapper_frame(f)]
    found = user_call(shown)
    if found is None:
        return None
    i, j = found
    return {
        "user": frame_label(shown[i]),
        "call": frame_label(shown[j]) if j is not None else None,
        "folded": max((j or 0) - 1, 0),
        "inner": frame_label(shown[0]) if j else None,
    }


def place_text(place: Optional[Place]) -> str:
    """One line, outer > inner: ``'user > call > (N more) > inner'`` ('' for None)."""
    if not place or not place.get("user"):
        return ""
    parts = [str(place["user"])]
    if place.get("call"):
        parts.append(str(place["call"]))
    if place.get("folded"):
        parts.append("(%d more)" % place["folded"])
    if place.get("inner"):
        parts.append(str(place["inner"]))
    return " > ".join(parts)
