"""The Ray instrumentor: a traced Ray worker's identity and actor-method phases
(``ray_hooks``), actor calls and waits on their results (``ray_calls``), actor creation
requests (``ray_create``), all installed by ``ray_install``, and Ray's own infrastructure
actors (``ray_infra``). Out: records and the ring header's Ray identity.
"""
