"""Memory sampling inside a traced process: host, cgroup (v1 and v2), CUDA, gauges
(``memory``), the sampler's timer (``memclock``), CUDA figures (``memcuda``), a forked
child's take-over of its parent's sampler (``memfork``) and cgroup discovery (``cgroup``).
Out: memory samples in the ring (docs/MEMORY.md).
"""
