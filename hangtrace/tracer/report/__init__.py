"""Report stage (pure rendering): a ``Diagnosis`` (and its ``Snapshot``) in, text out.

``paragraph.verdict_paragraph`` (the verdict a human reads first), ``advice`` (what to
look at next), ``text.text_report`` (the full text report), ``json.diagnosis_json``
(JSON schema 1, docs/DIAGNOSIS.md).
"""
