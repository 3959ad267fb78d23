"""The torch.distributed instrumentor: wrappers around the public collectives and p2p
ops (``torch_dist``, described by ``torch_specs``, state in ``torch_state``), async
completion (``torch_completion``), process-group creation (``torch_groups``) and the
Flight Recorder agent (``fr_agent``). In: the program's calls. Out: records in the ring,
Flight Recorder dumps on request.
"""
