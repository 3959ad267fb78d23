"""Does not import torch. Starts one Python child; each prints which modules it has at exit.

Lines: ``modules <pid> <hangtrace?> <torch?> <ray?>`` (child first, then parent).
The child runs in the directory given as argv[1], if any.
"""

import atexit
import subprocess
import sys

REPORT = (
    "import os, sys; print('modules', os.getpid(), 'hangtrace' in sys.modules, "
    "'torch' in sys.modules, 'ray' in sys.modules, flush=True)"
)


def report():
    exec(REPORT)


atexit.register(report)
subprocess.run(
    [sys.executable, "-c", "import atexit\natexit.register(lambda: exec(%r))" % REPORT],
    check=True,
    cwd=sys.argv[1] if len(sys.argv) > 1 else None,
)
