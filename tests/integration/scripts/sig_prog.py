"""One small program per mode, for signal and exit tests (no torch).

Modes: sleep (prints 'ready' then sleeps in ``wait_in_sleep``), thread_signal (a
thread's signal.signal call fails with ValueError first), handler (same, with the
program's own SIGTERM handler that prints and exits 3), abort, segv, exit0, exit7,
raise (uncaught exception in the main thread), thread_raise (in a thread, then exit 0).
"""

import os
import signal
import sys
import threading
import time


def wait_in_sleep():
    print("ready", flush=True)
    time.sleep(600)


def on_term(signum, frame):
    print("got sigterm %d" % signum, flush=True)
    sys.exit(3)


def crash_with_abort():
    os.abort()


def crash_with_segv():
    import ctypes

    ctypes.string_at(0)


def fail_in_main():
    raise ValueError("bad value 42")


def fail_in_thread():
    raise KeyError("missing-key")


mode = sys.argv[1]
if mode == "sleep":
    wait_in_sleep()
elif mode == "thread_signal":
    # signal.signal outside the main thread raises ValueError; the program carries on
    def set_in_thread():
        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError as e:
            print("error", e, flush=True)

    t = threading.Thread(target=set_in_thread)
    t.start()
    t.join()
    wait_in_sleep()
elif mode == "handler":
    old = signal.signal(signal.SIGTERM, on_term)
    print("previous handler %r" % (old,), flush=True)
    wait_in_sleep()
elif mode == "abort":
    crash_with_abort()
elif mode == "segv":
    crash_with_segv()
elif mode == "exit0":
    print("bye", flush=True)
elif mode == "exit7":
    sys.exit(7)
elif mode == "raise":
    fail_in_main()
elif mode == "thread_raise":
    t = threading.Thread(target=fail_in_thread, name="worker-1")
    t.start()
    t.join()
    print("thread done", flush=True)
