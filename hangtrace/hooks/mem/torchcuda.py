"""``torch.cuda`` when the program uses it: in, ``sys.modules`` (torch is looked up, never
imported; CUDA is never initialised here); out, the module or None. Shared by the sampler
(``sampler.py``, which imports ``memcuda`` only once this says CUDA is in use) and
``memcuda.py``. Standard library only: imported at start-up.
"""

from __future__ import annotations

import sys
from typing import Any


def torch_cuda() -> Any:
    """``torch.cuda`` when torch is imported and has initialised CUDA, else None (torch is
    looked up in ``sys.modules``, never imported; CUDA is never initialised here)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:
        return None
