"""Reports (pure rendering): a ``Diagnosis`` (+ its ``Snapshot``) in, text / JSON out.
"""
