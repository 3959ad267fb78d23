"""The instrumentor contract: one small object per thing hangtrace hooks in a process.

An instrumentor (lifecycle, torch.distributed, Ray, memory; ``bootstrap.INSTRUMENTORS``
lists them in install order) has four entry points, all called by ``bootstrap`` only:

* ``install(runtime)``: hook in for this process's ``Runtime``. Idempotent: a second call
  installs nothing more (no stacked wrappers) and writes one warning line to the run log.
* ``uninstall()``: restore what ``install`` replaced (tests, benchmarks).
* ``after_fork_child()``: in a forked child, from bootstrap's ONE ``os.register_at_fork``
  handler, after the runtime (the same object) got the child's own recorder.
* ``at_exit()``: from bootstrap's ONE exit handler, before the exit record is written:
  stop threads, flush pending completions.

None of them ever raises: a subclass implements ``_install``/``_uninstall``/
``_after_fork_child``/``_at_exit`` and the base class catches every exception and logs it
once (per instrumentor and entry point) to the run log. Modeled on OpenTelemetry's
``BaseInstrumentor`` (idempotent install with a warning on repeat, uninstall restores).
Standard library only: imported in every traced process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from hangtrace.hooks.bootstrap import Runtime


class Instrumentor:
    """Base of every instrumentor. ``name`` is used in run-log lines and keys."""

    name: str = "instrumentor"

    def __init__(self) -> None:
        self.runtime: Runtime | None = None
        self.installed: bool = False

    # -- the contract (never raises) -------------------------------------------------
    def install(self, runtime: Runtime) -> bool:
        """Hook in for ``runtime``; returns True when this call installed, False when it
        was installed already (one warning line in the run log) or failed (logged once)."""
        if self.installed:
            self._log(
                runtime,
                "instrumentor %s: install called again; nothing stacked" % self.name,
                "repeat-install",
            )
            return False
        self.runtime = runtime
        try:
            self._install(runtime)
        except Exception as e:
            self._log(runtime, "instrumentor %s: install failed: %r" % (self.name, e), "install")
            return False
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Restore what ``install`` replaced. A later ``install`` starts afresh."""
        if not self.installed:
            return
        self.installed = False
        self._guard(self._uninstall, "uninstall")

    def after_fork_child(self) -> None:
        """In a forked child: record into the child's own ring from now on."""
        if self.installed:
            self._guard(self._after_fork_child, "after-fork")

    def at_exit(self) -> None:
        """At interpreter exit, before the exit record: stop threads, flush."""
        if self.installed:
            self._guard(self._at_exit, "at-exit")

    # -- what subclasses implement --------------------------------------------------
    def _install(self, runtime: Runtime) -> None:
        raise NotImplementedError

    def _uninstall(self) -> None:
        pass

    def _after_fork_child(self) -> None:
        pass

    def _at_exit(self) -> None:
        pass

    # -- helpers --------------------------------------------------------------------
    def _guard(self, fn: Callable[[], Any], what: str) -> None:
        try:
            fn()
        except Exception as e:
            self._log(self.runtime, "instrumentor %s: %s failed: %r" % (self.name, what, e), what)

    def _log(self, runtime: Runtime | None, msg: str, key: str) -> None:
        try:
            if runtime is not None:
                runtime.log(msg, "%s-%s" % (self.name, key))
        except Exception:
            pass
