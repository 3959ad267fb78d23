"""Instrumentors of the libraries a traced program may import: torch.distributed and Ray.

Each is a light façade: ``install`` only registers a post-import hook
(``hooks/importhook.py``); the wrapping code (``torchdist.torch_install`` and
``ray_hooks``) is imported when the program imports the library, so a process that never
imports torch or Ray pays nothing for them. A library already imported at install time
is hooked at once.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from hangtrace.hooks import importhook, preload
from hangtrace.hooks.instrument import Instrumentor


class TorchDistInstrumentor(Instrumentor):
    """torch.distributed collectives, p2p and group creation (``hooks/torchdist/torch_install.py``)."""

    name = "torch"

    def __init__(self) -> None:
        super().__init__()
        self.hooked = False  # True once torch.distributed is wrapped in this process

    def _install(self, runtime: Any) -> None:
        from hangtrace.tracer import config

        if config.configure_fr_env():  # before any process group reads it
            runtime.log(
                "%s=%s set (torch's Flight Recorder on)" % (config.FR_BUFFER_ENV, config.FR_DEFAULT_ENTRIES),
                "fr-env",
            )
        importhook.when_imported("torch.distributed", self._on_import)

    def _on_import(self, module: ModuleType) -> None:
        rt = self.runtime
        if rt is None:
            return
        try:
            dist = sys.modules.get("torch.distributed", module)
            if not getattr(dist, "is_available", lambda: False)():
                return
            preload.load("torch")  # (the modules' code from one file: hooks/preload.py)
            from hangtrace.hooks.torchdist import torch_install

            rec = rt.recorder
            rec.on_grow.append(self._ring_grown)
            torch_install.install(dist, rec, rt.log)
            self.hooked = True
        except Exception as e:
            rt.log("hooking torch.distributed failed: %r" % (e,), "hook-torch")

    @staticmethod
    def _ring_grown(recorder: Any) -> None:
        """The recorder replaced its ring: the C wrappers must take its new C Ring."""
        td = sys.modules.get("hangtrace.hooks.torchdist.torch_dist")
        if td is not None:
            td.reset_after_fork(recorder)  # sets State.rec, which re-reads the recorder's Ring

    def _uninstall(self) -> None:
        ti = sys.modules.get("hangtrace.hooks.torchdist.torch_install")
        if ti is not None:
            ti.uninstall()
        self.hooked = False

    def _after_fork_child(self) -> None:
        td = sys.modules.get("hangtrace.hooks.torchdist.torch_dist")
        if td is not None and self.runtime is not None:
            rec = self.runtime.recorder
            rec.on_grow.append(self._ring_grown)
            td.reset_after_fork(rec)

    def _at_exit(self) -> None:
        tc = sys.modules.get("hangtrace.hooks.torchdist.torch_completion")
        if tc is not None:
            tc.flush()


class RayInstrumentor(Instrumentor):
    """Ray worker identity and actor-method phases, actor calls and creations
    (``hooks/rayhooks/ray_install.py``)."""

    name = "ray"

    def _install(self, runtime: Any) -> None:
        importhook.when_imported("ray", self._on_import)

    def _on_import(self, module: ModuleType) -> None:
        rt = self.runtime
        if rt is None:
            return
        try:
            preload.load("ray")
            from hangtrace.hooks.rayhooks import ray_hooks, ray_install

            ray = sys.modules.get("ray", module)
            ray_install.install(ray, rt.recorder, rt.log)
        except Exception as e:
            rt.log("hooking ray failed: %r" % (e,), "hook-ray")
            return
        try:  # actor calls, waits on them, creation requests (issue 9)
            ray_install.install_calls(ray, ray_hooks._current, rt.log)
        except Exception as e:
            rt.log("hooking ray actor calls failed: %r" % (e,), "hook-ray-calls")

    def _uninstall(self) -> None:
        ri = sys.modules.get("hangtrace.hooks.rayhooks.ray_install")
        if ri is not None:
            ri.uninstall()
            ri.uninstall_calls()

    def _after_fork_child(self) -> None:
        rh = sys.modules.get("hangtrace.hooks.rayhooks.ray_hooks")
        if rh is not None and self.runtime is not None:
            setattr(rh, "_rec", self.runtime.recorder)  # (a module from sys.modules: typed ModuleType)
