"""The machine rendering of a ``Diagnosis``: JSON schema 1 (docs/DIAGNOSIS.md)."""

from typing import Any, Dict

from hangtrace.tracer.diagnosis import Diagnosis

SCHEMA_VERSION = 1


def diagnosis_json(diag: Diagnosis) -> Dict[str, Any]:
    """``diag.to_dict()`` plus ``schema_version`` (int, currently 1): a JSON-ready dict
    (kind and cause as strings)."""
    d = diag.to_dict()
    d["schema_version"] = SCHEMA_VERSION
    return d
