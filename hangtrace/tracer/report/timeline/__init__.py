"""Timeline (issue 11): every traced process of a run on one clock-aligned Perfetto trace.

``build_timeline(snapshot, diagnosis, deep, options)`` is pure (snapshot in, Chrome
trace-event JSON dict out); ``load`` reads a run directory or snapshot and writes the
file. Format and tracks: ``docs/TIMELINE.md``.
"""

from hangtrace.tracer.report.timeline.build import DeepTrace, build_timeline
from hangtrace.tracer.report.timeline.model import DEFAULT_MAX_EVENTS, TimelineOptions

__all__ = ["DEFAULT_MAX_EVENTS", "DeepTrace", "TimelineOptions", "build_timeline"]
