import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:  # the traced processes of the tests run our modules from the start-up bundle, as installed
    from hangtrace.hooks import preload

    preload.refresh()
except Exception:
    pass
