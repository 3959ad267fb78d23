"""The recorders: this process's ring file and the records written into it.

``recorder`` (pure Python; its non-hot-path records in ``entries``) and ``fastrecorder``
(the C hot path, ``hooks/_fastrec.c``),
chosen in one place (``recorder.choose``); rings sized by role (``ringsize``); where a
tensor keeps its sizes and dtype (``tensor_layout``). In: calls from the instrumentors.
Out: ``RUN_DIR/ring-<host>-<pid>.htr`` (docs/FORMAT.md).
"""
