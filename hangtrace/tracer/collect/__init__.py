"""Collection (impure).

In: a run directory (ring files, faulthandler stack files), the live processes of this
host (/proc, py-spy), the kernel log and cgroups, and Ray's state API.
Out: a frozen ``tracer.snapshot.Snapshot``, stored under RUN_DIR/snapshots/<time>/
(``rings.take_snapshot``) or read back from there (``rings.load_snapshot``); a Ray run
across its cluster: ``collect/ray/``.
Composed with analysis and reports only in ``tracer/pipeline.py``.
"""
