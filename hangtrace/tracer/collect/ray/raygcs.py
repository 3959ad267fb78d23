"""Is the Ray GCS at an address reachable? One TCP connect, before any ``ray.init``.

In: a GCS address (``HOST:PORT``, or ``ray://HOST:PORT`` for a Ray client server). Out:
why it cannot be reached (str), or None (reachable, or a form not checked: ``auto``).
Used by the watcher's collection (``rayjob.py``), ``dump --ray`` (``raycluster.py``) and
the pipeline. Impure (opens a socket).
"""

from __future__ import annotations

from typing import Optional


def gcs_unreachable(address: str, timeout_s: float = 3.0) -> Optional[str]:
    """Why the Ray GCS at ``address`` (HOST:PORT) cannot be reached by TCP, or None.

    ``ray.init`` to an address nobody listens on retries for minutes (measured here: more
    than 200 s), so the watcher checks first.
    """
    import socket

    if address.startswith("ray://"):
        address = address[len("ray://") :]  # Ray client: its server port is checked the same way
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "/" in host:
        return None  # 'auto', 'ray://…' or a form we do not parse: let Ray decide
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        return None
    except OSError as e:
        return "%s: %s" % (address, e)
