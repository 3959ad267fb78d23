"""Analysis (pure): a ``Snapshot`` in, one ``Diagnosis`` out (no I/O, no processes)."""
