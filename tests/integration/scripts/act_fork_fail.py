"""A forked child that cannot create its own ring must not write into its parent's.

The parent moves its run directory away (its ring stays mapped), forks; the child's
ring cannot be created, so the child runs untraced: it enters a phase, has an uncaught
exception in a thread and in its main thread. The parent then prints 'checked-in' and
waits on stdin, so the test reads the parent's ring before the parent writes its exit.
"""

import os
import sys
import threading

from hangtrace import tracer

run = os.environ["HANGTRACE_DIR"]
os.rename(run, run + "-moved")
pid = os.fork()
if pid == 0:
    with tracer.phase("child-phase"):
        tracer.step(99)
    t = threading.Thread(target=lambda: 1 / 0, name="child-thread")
    t.start()
    t.join()
    raise RuntimeError("child failure")
_, status = os.waitpid(pid, 0)
print("child", pid, os.waitstatus_to_exitcode(status), flush=True)
print("checked-in", flush=True)
sys.stdin.read()
