"""A culprit blocked on a local TCP connection: who is at the other end, and what it does. Pure.

The kernel's word on a blocked ``recv`` names the socket's other end by pid
(collect/kernelwait.py: ``"peer pid 11614 (python from multiprocessing.spawn ...)"``).
When that pid is a process of the snapshot, it is named by what it is in the job (``rank
0``), and its other threads say why it does not answer: a blind job (2026-12-04, issue 9)
had rank 2 blocked in ``recv`` on rank 0's config service, whose thread waited in
``queue.get`` for a value rank 0's main loop never put; the verdict named rank 2's
``recvfrom`` and the peer only by pid and command line, although every snapshot held the
service thread's stack.

Which threads of the peer: those that are neither its main thread nor ours, with a frame
of the user's code (a server loop, a handler), at most two; each with its blocking reason
and the line it waits at.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence

from hangtrace.tracer.analyze.actors.actorgraph import label
from hangtrace.tracer.analyze.stuck.blocking import blocking_reason, c_lock_frame, code_text, collective_frame
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.analyze.evidence import program_frames
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import frame_label, threads_of
from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.process_model import ProcessRoles, assign_roles, process_argv
from hangtrace.tracer.snapshot import ProcessInfo

#: ``peer pid N (command line)`` (a socket's other end) or ``held by pid N (command line)``
#: (a file lock's holder, collect/filelocks.py ``lock_holders``): the command line may hold
#: one level of parentheses
PEER = re.compile(r"(peer|held by) pid (\d+) \((?:[^()]|\([^()]*\))*\)")
_MAX_THREADS = 2


def peer_pids(text: str) -> List[int]:
    """The pids of the socket peers named in ``text``, in order."""
    return [int(m.group(2)) for m in PEER.finditer(text or "")]


def name_peers(text: str, labels: Dict[int, str]) -> str:
    """``'peer pid 812 (python3 job.py)'`` becomes ``'peer pid 812: rank 0'`` for each pid
    in ``labels`` (pid -> what the process is in the job); others are left as they are."""

    def sub(m: "re.Match[str]") -> str:
        pid = int(m.group(2))
        return "%s pid %d: %s" % (m.group(1), pid, labels[pid]) if pid in labels else m.group(0)

    return PEER.sub(sub, text or "")


def _thread_line(th: Dict[str, Any]) -> Optional[str]:
    frames = program_frames(th)
    user = user_frame(frames)
    if user is None:
        return None
    why = blocking_reason(frames, thread=th)
    name = th.get("thread_name") or th.get("os_thread_id")
    if why and frame_label(user) in why:  # (the reason names the user's line already)
        return "thread '%s': %s" % (name, why)
    return "thread '%s' in %s%s%s" % (
        name,
        frame_label(user),
        code_text(user),
        ": %s" % why if why else " (running)",
    )


def _cycle_text(threads: List[Dict[str, Any]]) -> str:
    """``"; its main thread holds that lock (`with state_lock:` at job.py:40) while in all_reduce
    (distributed_c10d.py:2500)"`` when another thread of the peer waits at a ``with`` line
    its main thread is inside (collect/sourcelines.py ``enclosing_blocks``): the peer's server
    waits for its own main thread, which waits in turn (a collective for the culprit: a
    cycle across processes); '' otherwise."""
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    if main is None:
        return ""
    held = {
        str(item[1]): "%s:%s" % (os.path.basename(str(f.get("filename") or "?")), item[0])
        for f in program_frames(main)
        for item in f.get("with") or ()
        if isinstance(item, (list, tuple)) and len(item) > 1
    }
    for t in threads:
        if t is main:
            continue
        fs = program_frames(t)
        f = c_lock_frame(fs, t) if fs else None
        code = str((f or {}).get("code") or "")
        if code and code in held:
            mf = program_frames(main)
            doing = collective_frame(mf) or (blocking_reason(mf, thread=main) if mf else None) or "running"
            return (
                "; its main thread most likely holds that lock (it is inside `%s` at %s) while in %s: %s"
                % (code, held[code], doing, _CYCLE)
            )
    return ""


def helper_label(q: ProcessInfo, roles: ProcessRoles) -> Optional[str]:
    """``"rank 0's child process reward_server.py"`` for a helper of a rank (a child that
    inherited its RANK: blind helper 94's reward server was called "rank 0"), else None."""
    of = roles.helper_of.get(q.key)
    if of is None:
        return None
    argv = [a for a in process_argv(q) if not os.path.basename(a).startswith("python")]
    prog = next((os.path.basename(a) for a in argv if not a.startswith("-")), "")
    return "rank %d's child process%s" % (of, " " + prog if prog else "")


def _lock_order_text(threads: List[Dict[str, Any]]) -> str:
    """``"; threads 'request' and 'cache-refresher' are deadlocked: each waits for a lock the
    other holds (`with lock_model:` inside `with lock_cache:`, and the other way round): a
    lock-order deadlock"`` when two threads of the peer each wait at a ``with`` line the other
    is inside (collect/sourcelines.py ``enclosing_blocks``); '' otherwise."""
    waits = []
    for t in threads:
        fs = program_frames(t)
        f = c_lock_frame(fs, t) if fs else None
        code = _with_expr((f or {}).get("code"))
        if code:
            held = {
                _with_expr(item[1])
                for fr in fs
                for item in fr.get("with") or ()
                if isinstance(item, (list, tuple)) and len(item) > 1
            } - {code}
            waits.append((str(t.get("thread_name") or t.get("thread_id") or "?"), code, held))
    for i, (a, ca, ha) in enumerate(waits):
        for b, cb, hb in waits[i + 1 :]:
            if ca in hb and cb in ha:
                return (
                    "; threads '%s' and '%s' are deadlocked: each waits for a lock the other holds (`with %s:` "
                    "inside `with %s:`, and the other way round): %s" % (a, b, ca, cb, _DEADLOCK)
                )
    return ""


def _with_expr(code: Any) -> str:
    """``'self.lock_cache'`` of the line ``with self.lock_cache:  # A`` (comment and spaces
    dropped: the held and the awaited line are compared by what they lock); '' otherwise."""
    text = str(code or "").split("#", 1)[0].strip()
    if not text.startswith("with ") or not text.endswith(":"):
        return ""
    return " ".join(text[5:-1].split())


def peer_text(peer: ProcessInfo, label: str) -> Optional[str]:
    """``"The other end, rank 0 (pid 11614): its thread 'config-service' in config_service
    (launcher.py:58): `step, lr = lr_q.get()`: queue.get/put (...) in Queue.get (queue.py:171)"``:
    what the peer's own threads (not its main thread, not ours) do; None without such a thread."""
    lines = []
    threads = [t for t in threads_of(peer) or () if isinstance(t, dict)]
    for th in threads:
        if th.get("thread_name") == "MainThread" or str(th.get("thread_name") or "").startswith("hangtrace"):
            continue
        line = _thread_line(th)
        if line:
            lines.append(line)
    if not lines:
        return None
    return "The other end, %s (pid %d): its %s%s%s" % (
        label,
        peer.pid,
        "; its ".join(lines[:_MAX_THREADS]),
        "; and %d more thread(s)" % (len(lines) - _MAX_THREADS) if len(lines) > _MAX_THREADS else "",
        _cycle_text(threads) or _lock_order_text(threads),
    )


#: ``details['peer_role']``: what the process named in ``details['peer_wait']`` is to the culprit
SOCKET_PEER, SOCKET_PEER_CYCLE, LOCK_HOLDER = "socket-peer", "socket-peer-cycle", "lock-holder"
SOCKET_PEER_DEADLOCK = "socket-peer-deadlock"  # two threads of the peer in a lock-order deadlock
_CYCLE = "a cycle across the two processes"
_DEADLOCK = "a lock-order deadlock"


def peer_wait(
    text: str, host: str, procs: Sequence[ProcessInfo], label: Callable[[ProcessInfo], Optional[str]]
) -> Optional[Dict[str, str]]:
    """For a culprit's reason ``text`` naming a socket peer or a file lock's holder on
    ``host`` that is one of ``procs``: ``{'reason': text with it named by label(p), 'peer':
    peer_text or holder_text or '', 'role': SOCKET_PEER, SOCKET_PEER_CYCLE, SOCKET_PEER_DEADLOCK or
    LOCK_HOLDER}``;
    None when none of ``text`` is a process of the snapshot (or ``label`` gives None)."""
    by_pid = {p.pid: p for p in procs if p.host == host}
    labels: Dict[int, str] = {}
    for pid in peer_pids(text):
        p = by_pid.get(pid)
        name = label(p) if p is not None else None
        if name:
            labels[pid] = name
    if not labels:
        return None
    pid = next(iter(labels))
    if any(m.group(1) == "held by" and int(m.group(2)) == pid for m in PEER.finditer(text)):
        return {
            "reason": name_peers(text, labels),
            "peer": holder_text(by_pid[pid], labels[pid]) or "",
            "role": LOCK_HOLDER,
        }
    peer = peer_text(by_pid[pid], labels[pid]) or ""
    return {
        "reason": name_peers(text, labels),
        "peer": peer,
        "role": SOCKET_PEER_CYCLE
        if peer.endswith(_CYCLE)
        else SOCKET_PEER_DEADLOCK
        if peer.endswith(_DEADLOCK)
        else SOCKET_PEER,
    }


def holder_text(holder: ProcessInfo, label: str) -> Optional[str]:
    """``"The lock's holder, rank 0 (pid 812): its main thread is in all_reduce (...)"``: what
    the process holding the file lock does (its main thread); None without its stack."""
    threads = [t for t in threads_of(holder) or () if isinstance(t, dict)]
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), None)
    fs = program_frames(main) if main is not None else []
    if not fs:
        return None
    rdzv = next((f for f in fs if f.get("name") == "init_process_group"), None)
    coll = collective_frame(fs)
    why = blocking_reason(fs, thread=main)
    doing = (
        "in init_process_group (the rendezvous: it waits for every rank)"
        if rdzv is not None
        else "in %s" % coll
        if coll
        else "%s" % why
        if why
        else "running"
    )
    user = user_frame(fs)
    return "The lock's holder, %s (pid %d): its main thread is %s%s" % (
        label,
        holder.pid,
        doing,
        ", at %s" % frame_label(user) if user else "",
    )


def peer_waits(ctx: Ctx, d: Diagnosis) -> None:
    """For the first culprit whose reason names a socket peer that is a process of the
    snapshot: the peer named in ``details['culprit_reasons']`` (``rank 0``, a Ray actor's
    class, ``driver``) and ``details['peer_wait']`` (what the peer's own threads do, also
    an evidence line). Never raises on odd data."""
    roles: List[ProcessRoles] = []

    def name(q: ProcessInfo) -> str:
        v = ctx.views.get(q.rank) if q.rank >= 0 else None
        if v is not None and v.proc.key == q.key:  # (the process model's rank, not a child with its RANK)
            return "rank %d" % q.rank
        if not roles:
            roles.append(assign_roles(ctx.snap.processes))  # (ctx.roles covers the ranks only; the driver)
        return helper_label(q, roles[0]) or label(q, roles[0])

    def keep(pw: Dict[str, str]) -> None:
        if pw["peer"]:
            d.details["peer_wait"], d.details["peer_role"] = pw["peer"], pw["role"]
            ctx.add(pw["peer"])

    reasons = d.details.get("culprit_reasons") or {}
    for r in d.culprit_ranks[:4]:
        v = ctx.views.get(r)
        text = reasons.get(str(r))
        pw = (
            peer_wait(text, v.proc.host, ctx.snap.processes, name)
            if v is not None and isinstance(text, str) and peer_pids(text)
            else None
        )
        if pw is not None:
            reasons[str(r)] = pw["reason"]
            keep(pw)
            return
    key, doing = d.details.get("culprit_process"), d.details.get("actor_doing")
    if d.culprit_ranks or not key or not isinstance(doing, str) or not peer_pids(doing):
        return  # (a Ray actor without a rank: what its method waits for, rules actors/actor_waits)
    p = next((q for q in ctx.snap.processes if q.key == key), None)
    pw = peer_wait(doing, p.host, ctx.snap.processes, name) if p is not None else None
    if pw is not None:  # blind helper 60: a rollout actor in an HTTP call to a RewardServer actor's handler
        d.details["actor_doing"] = pw["reason"]
        keep(pw)
