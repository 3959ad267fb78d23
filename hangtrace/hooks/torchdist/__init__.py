"""The torch.distributed instrumentor: wrappers around the public collectives and p2p
ops (``torch_dist``: the state and the recording call, described by ``torch_specs``, state
type in ``torch_state``), installed by ``torch_install``; async completion
(``torch_completion``), ``batch_isend_irecv`` (``torch_batch``), process-group creation
(``torch_groups``) and the Flight Recorder agent (``fr_agent``). In: the program's calls.
Out: records in the ring, Flight Recorder dumps on request.
"""
