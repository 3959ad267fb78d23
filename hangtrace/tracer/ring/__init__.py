"""The ring file: THE contract between traced processes and everything else.

In: a ring file ``ring-<host>-<pid>.htr`` (written by ``hooks/record/recorder.py``).
Out: ``reader.RingData`` (header dict, group definitions, events, meta) with a
``summary.RingSummary`` and, on request, every record (``records.py`` types).

``layout``: constants, slot/header structs and ring creation (imported by traced
processes: standard library only); ``records``: the decoded record types and slot
decoding; ``reader``: validation and decoding; ``summary``: the compact per-process summary
(pure Python), ``slotsummary``: the same from the slot array (numpy index pass).
Format: docs/FORMAT.md.

Torch's Flight Recorder entries in the same record shape (pure, shared by collection and
analysis): ``frentries`` the typed dump, ``frrecords`` entries as record dicts and merged
with ours (``frcands``: a group's entries indexed by launch time), ``frjoin`` dumps joined
into processes.
"""
