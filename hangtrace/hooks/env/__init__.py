"""The environment record: what this process runs (executable mappings, libraries,
Python packages, the job's environment variables). Out: ``RUN_DIR/env/<host>-<pid>.json``.
"""
