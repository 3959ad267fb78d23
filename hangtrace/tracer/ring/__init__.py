"""The ring file: THE contract between traced processes and everything else.

In: a ring file ``ring-<host>-<pid>.htr`` (written by ``hooks/record/recorder.py``).
Out: ``reader.RingData`` (header dict, group definitions, events, meta) with a
``summary.RingSummary`` and, on request, every record (``records.py`` types).

``layout``: constants, slot/header structs and ring creation (imported by traced
processes: standard library only); ``records``: the decoded record types;
``reader``: validation and decoding; ``summary``: the compact per-process summary (numpy
index pass, pure-Python fallback). Format: docs/FORMAT.md.
"""
