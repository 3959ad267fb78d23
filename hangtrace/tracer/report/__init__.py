"""Report stage (pure rendering): a ``Diagnosis`` (and its ``Snapshot``) in, text out.

``paragraph.verdict_paragraph`` (the verdict a human reads first; its sentences per kind
in ``collparagraph``, ``rankparagraph``, ``rayparagraph`` over ``phrases``), ``advice`` (the
texts of what to look at next) and ``nextstep`` (which one fits), ``text.text_report`` (the
full text report), ``json.diagnosis_json`` (JSON schema 1, docs/DIAGNOSIS.md).
"""
