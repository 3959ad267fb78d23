"""Failures caught at their source inside a framework (``hooks/process/failures.py``,
``FRAMEWORK_CATCHES``): Ray Train V2 catches ``train_func``'s exception in its training thread
and hands it to ``construct_user_exception_with_traceback``; the hook records the user's own
exception there - type, message, the raising thread - and passes everything through."""

import sys
import threading
import types

from hangtrace.hooks.process import failures


class _Rec:
    def __init__(self):
        self.events = []

    def event(self, kind, **fields):
        self.events.append((kind, fields))


def test_ray_train_catch_point_records_the_users_exception_in_its_thread():
    mod_name, fn_name, by = failures.FRAMEWORK_CATCHES[0]
    assert mod_name.startswith("ray.train.v2") and by == "ray-train"
    seen = []
    mod = types.ModuleType("fake_thread_runner")
    mod.__dict__[fn_name] = lambda e, exclude_frames=0: seen.append((e, exclude_frames)) or "wrapped"
    rec = _Rec()
    failures.configure(lambda: rec, lambda *a: None)
    try:
        failures.IMPORT_HOOKS[mod_name](mod)
        failures.IMPORT_HOOKS[mod_name](mod)  # twice: no stacked wrappers
        out = []

        def train_func():
            try:
                raise RuntimeError("non-finite loss nan at step 10 on rank 1")
            except BaseException as e:
                out.append(getattr(mod, fn_name)(e, exclude_frames=3))

        t = threading.Thread(target=train_func, name="TrainingThread(train_func)")
        t.start()
        t.join()
        assert out == ["wrapped"] and seen[0][1] == 3  # passed through unchanged
        assert len(rec.events) == 1
        kind, f = rec.events[0]
        assert kind == "exception" and f["type"] == "RuntimeError" and f["caught_by"] == "ray-train"
        assert "non-finite loss nan" in f["message"] and f["thread"] == "TrainingThread(train_func)"
        assert "raise RuntimeError" in f["traceback"]
        getattr(mod, fn_name)(SystemExit(0))  # a stop is no failure
        assert len(rec.events) == 1
    finally:
        failures.configure(lambda: None, lambda *a: None)
    _ = sys
