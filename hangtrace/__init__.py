"""hangtrace: which rank broke, where, and why — for distributed PyTorch and Ray jobs.

Imported by the ``.pth`` activation line in every traced process: keep it light
(standard library only, nothing at import time).
"""

__version__ = "0.1.0"
