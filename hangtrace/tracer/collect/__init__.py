"""Collection (impure): run directory, live processes, py-spy/faulthandler stacks,
Ray state -> a ``Snapshot`` (``hangtrace.tracer.snapshot``), stored under RUN_DIR/snapshots/.
"""
