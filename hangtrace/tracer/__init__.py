"""Public API and out-of-process tooling of hangtrace.

``from hangtrace import tracer``; ``with tracer.phase("train", step=3): ...``;
``tracer.step(n)``; ``tracer.heartbeat()``. This package's ``__init__`` stays light:
``hangtrace.hooks`` imports from it inside every traced process.
"""

from hangtrace.tracer.api import enabled, gauge, heartbeat, phase, step

__all__ = ["phase", "step", "heartbeat", "enabled", "gauge"]
