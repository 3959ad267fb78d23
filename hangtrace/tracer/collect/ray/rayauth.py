"""Ray's token authentication for the cluster-wide collection (``dump --ray``, the watcher).

Measured on Ray 2.60, the version here:

* A cluster started by ``ray.init()`` (``address='local'`` or none) or ``ray start``
  has token authentication on by default: the starting process sets
  ``RAY_AUTH_MODE=token`` in its own environment (the GCS, raylet and workers inherit
  it) and keeps the token in ``~/.ray/auth_token`` (generated on first use).
* A process that connects sends the token only when *its* auth mode is ``token``.
  ``ray.init`` switches that on by itself only for ``address=None`` or ``'auto'``
  ("an explicit address (argument or RAY_ADDRESS) never does", ``_private/worker.py``).
  With an explicit GCS address and no ``RAY_AUTH_MODE`` the GCS answers
  "Unauthenticated: InvalidAuthToken: Authentication token is missing or incorrect",
  ``ray.init`` retries for about 20 s and raises "Failed to connect to Ray cluster at
  ADDR". The watcher always passes an explicit address (the run's own cluster, from the
  workers' ``--gcs-address``): that is why the cluster-wide collection never worked on
  token-auth clusters.
* The token is read from ``RAY_AUTH_TOKEN`` (the token itself), else the file named by
  ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``.

:func:`plan` decides, before connecting, what to set: the user's ``RAY_AUTH_MODE`` is
never overridden; for a GCS of this machine the mode (and token file) are read from the
GCS process's own environment (same user only); otherwise, when a token is available,
token mode is switched on, as Ray itself does for ``address='auto'``. :func:`apply` sets
it in this process; :func:`connect_remedy` says exactly what to set when it still fails.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import socket
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["AuthPlan", "LocalGcs", "apply", "connect_remedy", "local_gcs", "plan", "token_source"]

MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
#: Where ``ray.init`` / ``ray start`` keep the token they generate (Ray 2.60).
DEFAULT_TOKEN_FILE = os.path.join("~", ".ray", "auth_token")


@dataclasses.dataclass
class AuthPlan:
    """What :func:`plan` decided for one cluster address."""

    address: str
    #: 'token', 'disabled', or None (unknown: nothing is set, Ray decides)
    mode: Optional[str]
    #: one line: where the decision comes from (shown in errors and logs)
    why: str
    #: variables to set in this process before ``ray.init`` (never the token itself)
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: where the token will be read from ('RAY_AUTH_TOKEN', a file path), or None
    token_from: Optional[str] = None
    #: pid of the local GCS process found for the address, or None
    gcs_pid: Optional[int] = None


def token_source(env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Where Ray would read the auth token from, in Ray's order: ``'RAY_AUTH_TOKEN'``
    (set in ``env``), the file of ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``; None
    when there is none (a named file that does not exist counts as none)."""
    env = dict(os.environ) if env is None else env
    if env.get(TOKEN, "").strip():
        return TOKEN
    path = env.get(TOKEN_PATH)
    if path:
        path = os.path.expanduser(path)
        return path if os.path.isfile(path) else None
    path = os.path.expanduser(DEFAULT_TOKEN_FILE)
    return path if os.path.isfile(path) else None


def _split(address: str) -> Optional[Tuple[str, int]]:
    if "://" in address:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _is_local_host(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname()):
        return True
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        addrs = set()
    if host in addrs:
        return True
    try:  # the address of the interface the default route uses (no packet is sent)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect((host, 9))
            return s.getsockname()[0] == host
        finally:
            s.close()
    except OSError:
        return False


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


@dataclasses.dataclass
class LocalGcs:
    """A GCS server process of this machine (:func:`local_gcs`)."""

    pid: int
    session_dir: str
    #: its ``RAY_AUTH_*`` variables; None when its environment is not readable (another user's)
    env: Optional[Dict[str, str]]


def local_gcs(port: int) -> Optional[LocalGcs]:
    """The GCS server process of this machine that listens on ``port``, or None.

    Found the way it can be without privileges: every ``gcs_server`` process's
    ``--log_dir`` is ``SESSION/logs``, and ``SESSION/gcs_server_port_<node id>`` holds its
    port (Ray 2.60).
    """
    for comm in glob.glob("/proc/[0-9]*/comm"):
        if (_read(comm) or b"").strip() != b"gcs_server":
            continue
        d = os.path.dirname(comm)
        argv = (_read(d + "/cmdline") or b"").split(b"\0")
        logs = [
            a[len(b"--log_dir=") :].decode("utf-8", "replace") for a in argv if a.startswith(b"--log_dir=")
        ]
        if not logs:
            continue
        session = os.path.dirname(logs[0].rstrip("/"))
        ports = set()
        for f in glob.glob(os.path.join(session, "gcs_server_port_*")):
            txt = (_read(f) or b"").strip()
            if txt.isdigit():
                ports.add(int(txt))
        if port not in ports:
            continue
        raw = _read(d + "/environ")
        env: Optional[Dict[str, str]] = None
        if raw is not None:
            env = {}
            for item in raw.split(b"\0"):
                k, eq, v = item.partition(b"=")
                if eq and k.startswith(b"RAY_AUTH_"):
                    env[k.decode()] = v.decode("utf-8", "replace")
        return LocalGcs(int(os.path.basename(d)), session, env)
    return None


def plan(address: Optional[str], env: Optional[Dict[str, str]] = None) -> AuthPlan:
    """Decide the auth settings for connecting to ``address`` (a GCS HOST:PORT, 'auto',
    None). ``env``: the environment to decide in (default ``os.environ``); not changed."""
    env = dict(os.environ) if env is None else env
    addr = address or "auto"
    if env.get(MODE):
        return AuthPlan(addr, env[MODE].lower(), "%s=%s is set" % (MODE, env[MODE]), {}, token_source(env))
    hp = _split(addr) if addr != "auto" else None
    gcs = local_gcs(hp[1]) if hp and _is_local_host(hp[0]) else None
    if gcs is not None and gcs.env is not None:
        genv = gcs.env
        mode = (genv.get(MODE) or "disabled").lower()
        why = "the cluster's GCS (pid %s, %s) runs with %s=%s" % (
            gcs.pid,
            gcs.session_dir,
            MODE,
            genv.get(MODE, "(unset: disabled)"),
        )
        if mode != "token":
            return AuthPlan(addr, mode, why, {}, None, gcs.pid)
        out = {MODE: "token"}
        if not env.get(TOKEN) and not env.get(TOKEN_PATH) and genv.get(TOKEN_PATH):
            out[TOKEN_PATH] = genv[TOKEN_PATH]  # the file the cluster reads its token from
        return AuthPlan(addr, "token", why, out, token_source({**env, **out}), gcs.pid)
    src = token_source(env)
    if src is None:
        return AuthPlan(
            addr,
            None,
            "no %s set and no token found (%s, %s, %s)" % (MODE, TOKEN, TOKEN_PATH, DEFAULT_TOKEN_FILE),
        )
    if addr == "auto":  # Ray switches token mode on by itself for 'auto'
        return AuthPlan(
            addr, None, "address 'auto': Ray uses the token in %s when the cluster needs it" % src, {}, src
        )
    why = (
        "a token is available (%s); Ray 2.60 sends it only for address 'auto', hangtrace switches "
        "%s=token on for %s too" % (src, MODE, addr)
    )
    if gcs is not None:
        why += (
            " (the cluster's GCS, pid %s, belongs to another user: its settings are not readable)" % gcs.pid
        )
    return AuthPlan(addr, "token", why, {MODE: "token"}, src, gcs.pid if gcs else None)


def apply(p: AuthPlan) -> None:
    """Set ``p.env`` in this process and make an already imported Ray see it (Ray caches
    the auth mode in its config and the token in a loader; ``ray.init`` does the same
    refresh when it switches token mode on)."""
    if not p.env:
        return
    os.environ.update(p.env)
    import importlib

    try:
        # Any: a compiled module whose stubs lack these names (Ray 2.60)
        raylet: Any = importlib.import_module("ray._raylet")
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # a Ray without token auth: nothing cached
        pass


def connect_remedy(p: AuthPlan, tcp_ok: Optional[bool]) -> str:
    """What to set when ``ray.init`` to ``p.address`` failed (``tcp_ok``: whether the
    address's port accepted a TCP connection; None when not checked)."""
    where = (
        "the token of the cluster (on its head node: `ray get-auth-token`, or the file %s of the "
        "user who started it)" % DEFAULT_TOKEN_FILE
    )
    lines: List[str] = []
    if tcp_ok is False:
        lines.append(
            "nothing listens at %s: pass --address HOST:PORT of the running cluster's GCS "
            "(`ray status` on its head, or ray.get_runtime_context().gcs_address in the driver) "
            "or set RAY_ADDRESS" % p.address
        )
        return "; ".join(lines)
    if p.mode == "token":
        lines.append(
            "the GCS at %s did not accept the connection with token auth (token from %s): set %s=<%s> "
            "or %s=<a file holding it>; if the cluster runs without token auth, set %s=disabled"
            % (p.address, p.token_from or "nowhere: none found", TOKEN, where, TOKEN_PATH, MODE)
        )
    elif p.mode == "disabled":
        lines.append(
            "connected without token auth (%s); if the cluster uses token auth (Ray 2.60's default "
            "for ray.init()/ray start), set %s=token and %s=<%s> or %s"
            % (p.why, MODE, TOKEN, where, TOKEN_PATH)
        )
    else:
        lines.append(
            "Ray 2.60 clusters started by ray.init()/ray start use token auth by default: set %s=token "
            "and %s=<%s> (or %s=<a file holding it>)" % (MODE, TOKEN, where, TOKEN_PATH)
        )
    if tcp_ok:
        lines.append("the port answers, so the address is right")
    else:
        lines.append(
            "check that %s is the GCS address of the running cluster (`ray status`, or "
            "ray.get_runtime_context().gcs_address in the driver), or set RAY_ADDRESS" % p.address
        )
    return "; ".join(lines)
