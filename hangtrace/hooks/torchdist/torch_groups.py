"""Process-group operations (``init_process_group``, ``new_group``,
``destroy_process_group``) and the groups that exist when tracing begins: durable group
definitions in the ring, and the rank this process joined as (``Recorder.set_rank``).
In: the program's group calls (wrapped by ``torch_install``); out: group records in the
ring (``torch_dist._state``'s recorder) and the start of the Flight Recorder agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

from hangtrace.hooks.torchdist import torch_dist as _td

if TYPE_CHECKING:
    from hangtrace.hooks.torchdist.torch_state import State


def _describe(pg: Any, op: str) -> Dict[str, Any]:
    """Group definition dict for the ring's durable group table."""
    st = _td._state
    assert st is not None  # group operations only (never per collective), while recording
    dist = st.dist
    c10d = dist.distributed_c10d
    info: Dict[str, Any] = {"op": op, "order": st.order}
    st.order += 1
    if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
        info["member"] = False
        info["name"] = None
        return info
    info["member"] = True
    for key, fn in (
        ("name", lambda: c10d._get_process_group_name(pg)),
        ("desc", lambda: getattr(pg, "group_desc", None)),
        ("backend", lambda: str(dist.get_backend(pg))),
        ("ranks", lambda: list(dist.get_process_group_ranks(pg))),
    ):
        try:
            info[key] = fn()
        except Exception:
            info[key] = None
    return info


def _group_op_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    name = wrapped.__name__
    if name == "init_process_group" and _td._state is not None:
        _join_request(_td._state, wrapped, args, kwargs)
        _joining(_td._state)  # before the rendezvous, which may be what hangs
    result = wrapped(*args, **kwargs)
    st = _td._state
    if st is None:
        return result
    try:
        if name == "init_process_group":
            dist = st.dist
            st.clear_groups()
            st.rec.set_rank(dist.get_rank(), _local_rank(), dist.get_world_size())
            _record_launch(st)
            st.rec.group_created(_describe(dist.distributed_c10d._get_default_group(), name))
            _start_fr_agent(st)
            _td._probe_tensor_layout(st)
        elif name == "new_group":
            info = _describe(result, name)
            if info.get("member") is False:
                ranks = kwargs.get("ranks", args[0] if args else None)
                info["ranks"] = sorted(int(r) for r in ranks) if ranks is not None else None
            st.rec.group_created(info)
        elif name == "destroy_process_group":
            st.clear_groups()
            st.rec.event("destroy_process_group")
    except Exception as e:
        st.log("recording %s failed: %r" % (name, e), "rec-" + name)
    return result


def join_request(
    wrapped: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Dict[str, Any]:
    """What a call of ``init_process_group`` asks for, resolved as torch's rendezvous
    handlers resolve it (``torch/distributed/rendezvous.py``): ``rank`` and ``world_size``
    from the arguments, else the ``init_method`` URL's query, else (``env://``, the
    default) RANK and WORLD_SIZE at the call (-1: unknown); ``master``: the store's
    address (``MASTER_ADDR:MASTER_PORT`` at the call for ``env://``, the URL's host:port for
    ``tcp://``, the path for ``file://``, ``store`` for a store passed in); ``init``: the
    URL's scheme; ``backend``; ``env_world_size``: WORLD_SIZE at the call. Raises nothing it
    can avoid (unknown parts are -1 or '?')."""
    import inspect
    import os
    from urllib.parse import parse_qs, urlparse

    try:
        bound = dict(inspect.signature(wrapped).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        bound = dict(kwargs)
    init, store = bound.get("init_method"), bound.get("store")
    url = urlparse(init) if isinstance(init, str) else None
    query = {k: v[-1] for k, v in parse_qs(url.query).items()} if url is not None else {}
    scheme = "store" if store is not None else (url.scheme if url is not None else "env")

    def pick(arg: str, env: str) -> int:
        v = bound.get(arg, -1)
        if v is None or (isinstance(v, int) and v < 0):
            v = query.get(arg, os.environ.get(env) if scheme == "env" else None)
        try:
            return int(v)
        except (TypeError, ValueError):
            return -1

    if scheme == "env":
        master = "%s:%s" % (os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?"))
    elif scheme == "tcp" and url is not None:
        master = url.netloc
    else:
        master = "store" if store is not None else str(init).split("?")[0]
    env_world = os.environ.get("WORLD_SIZE", "")
    return {
        "rank": pick("rank", "RANK"),
        "world_size": pick("world_size", "WORLD_SIZE"),
        "master": master,
        "init": scheme,
        "backend": str(bound.get("backend")),
        "env_world_size": int(env_world) if env_world.isdigit() else -1,
    }


def _join_request(
    st: State, wrapped: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> None:
    """Before the rendezvous: a durable ``join`` event with what this call asks for
    (:func:`join_request`), and the rank asked for in the ring header (``RANK_FROM_JOIN``):
    a process stuck in the rendezvous is that rank, whatever RANK it inherited (a spawn
    child of a parent that set RANK, a Ray actor). Never raises."""
    try:
        req = join_request(wrapped, args, kwargs)
        st.rec.event("join", **req)
        if req["rank"] >= 0:  # (the world size the environment gives: how many ranks there are)
            world = req["env_world_size"] if req["env_world_size"] > 0 else req["world_size"]
            st.rec.set_rank(req["rank"], _local_rank(), world, joined=False)
    except Exception as e:
        st.log("recording the join request failed: %r" % (e,), "join-request")


def _joining(st: State) -> None:
    """This process is joining a group (it is becoming a rank): its pending environment
    record is written (``envrecord.joined``; before the rendezvous, so a rank that hangs
    in it has one for env-diff), and the memory sampler's thread starts if it still waits
    (``memclock.kick``). Never raises."""
    try:
        from hangtrace.hooks.env import envrecord
        from hangtrace.hooks.mem import memclock

        memclock.kick()
        envrecord.joined()
    except Exception as e:
        st.log("environment record at join failed: %r" % (e,), "env-join")


def _start_fr_agent(st: State) -> None:
    """This process joined a group: serve Flight Recorder dump requests (``fr_agent``;
    off with ``HANGTRACE_FR=0``). Never raises."""
    try:
        from hangtrace.hooks.torchdist import fr_agent

        fr_agent.start(st.rec.run_dir, st.log)
    except Exception as e:
        st.log("flight recorder agent not started: %r" % (e,), "fr-start")


def _local_rank() -> int:
    import os

    try:
        return int(os.environ.get("LOCAL_RANK", "-1"))
    except ValueError:
        return -1


#: (ring meta key, environment variables read in order): the launcher's word on this rank's
#: node and the job's store (issue 39; torchelastic sets GROUP_RANK/GROUP_WORLD_SIZE and
#: TORCHELASTIC_RUN_ID, Slurm SLURM_NODEID/SLURM_NNODES, other launchers NODE_RANK/NNODES)
LAUNCH_VARS = (
    ("node_rank", ("GROUP_RANK", "NODE_RANK", "SLURM_NODEID")),
    ("node_count", ("GROUP_WORLD_SIZE", "NNODES", "SLURM_NNODES")),
    ("store_addr", ("MASTER_ADDR",)),
    ("store_port", ("MASTER_PORT",)),
    ("elastic_run_id", ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")),
    ("elastic_restart", ("TORCHELASTIC_RESTART_COUNT",)),
)


def _record_launch(st: Any) -> None:
    """Ring meta ``launch_*``: the launcher's node identity and the job's store of this rank
    (:data:`LAUNCH_VARS`), read by the node watcher to meet the other nodes (issue 39).
    Nothing when none is set."""
    import os

    facts = {}
    for key, names in LAUNCH_VARS:
        v = next((os.environ[n] for n in names if os.environ.get(n)), None)
        if v is not None:
            facts["launch_" + key] = v
    if facts:
        st.rec.set_meta(**facts)


def record_existing_groups() -> None:
    """Record the process groups that exist already (tracing began after init)."""
    st = _td._state
    assert st is not None  # called by install(), which set it
    dist = st.dist
    if not dist.is_available() or not dist.is_initialized():
        return
    c10d = dist.distributed_c10d
    st.rec.set_rank(dist.get_rank(), _local_rank(), dist.get_world_size())
    _record_launch(st)
    pgs = list(getattr(c10d._world, "pg_names", {}).keys())
    default = c10d._get_default_group()
    if default in pgs:
        pgs.remove(default)
    for pg in [default] + pgs:
        st.rec.group_created(_describe(pg, "existing"))
    _joining(st)
    _start_fr_agent(st)
