"""Memory sampling inside a traced process: host, cgroup (v1 and v2), CUDA, gauges
(``sampler``, started and stopped by ``memory``), the sampler's timer (``memclock``), CUDA
figures (``memcuda``; ``torchcuda``: whether CUDA is in use), a forked
child's take-over of its parent's sampler (``memfork``) and cgroup discovery (``cgroup``).
Out: memory samples in the ring (docs/MEMORY.md).
"""
