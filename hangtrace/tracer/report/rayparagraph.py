"""The verdict texts about Ray actors (pure): a culprit's actor identity and Ray's own death
text (issue 4), actors without a rank that are stuck or failed (issue 9), actor-call cycles,
chains and unschedulable actors. Split from ``paragraph.py``, which composes them."""

from typing import Any, Dict, Optional

from hangtrace.tracer.diagnosis import Diagnosis
from hangtrace.tracer.report.nextstep import self_call
from hangtrace.tracer.report.clip import clip
from hangtrace.tracer.report.words import ranks_text as _ranks, verb as _verb


def ray_actor_label(a: Dict[str, Any]) -> str:
    """ "Trainer 't0'" for a Ray actor identity dict."""
    return "%s%s" % (a.get("class") or "actor", " '%s'" % a["name"] if a.get("name") else "")


def ray_text(diag: Diagnosis) -> str:
    d = diag.details or {}
    out = ""
    acts = d.get("culprit_actors") or []
    if acts:
        out += " Ray actor%s: %s." % (
            "s" if len(acts) > 1 else "",
            ", ".join("rank %s = %s" % (a.get("rank"), ray_actor_label(a)) for a in acts[:4]),
        )
    says = d.get("ray_says") or {}
    for r in diag.culprit_ranks[:2]:
        x = says.get(str(r))
        if x and not _quoted(diag, x):
            src = x.get("source")
            where = ", its session log" if src and src != "state-api" else ""
            out += ' Ray says (rank %s%s): "%s".' % (r, where, clip(str(x.get("text")), 240))
    return out


def call(x: Dict[str, Any]) -> str:
    """``RewardServer in score is blocked in ray.get on PolicyTrainer.policy_version``; with
    no known target (an object passed to it): ``Learner in train is blocked in ray.get at
    Learner.train (driver.py:64) on an object passed to it``."""
    if not x.get("waits_on"):
        return "%s%s is blocked in %s%s on an object passed to it" % (
            x.get("actor"),
            " in %s" % x["method"] if x.get("method") else "",
            _api(x.get("api")),
            " at %s" % x["at"] if x.get("at") else "",
        )
    return "%s%s is blocked in %s on %s.%s" % (
        x.get("actor"),
        " in %s" % x["method"] if x.get("method") else "",
        _api(x.get("api")),
        x.get("waits_on"),
        x.get("target_method"),
    )


def _api(api: Optional[str]) -> str:
    """``ray.get``, ``ray.wait``, ``await`` (a wait record's api)."""
    return "await" if api == "await" else "ray.%s" % (api or "get")


def actor_deadlock(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """Kind actor-deadlock (rules/actor_waits.py): the cycle, each wait's line, its waiters."""
    items = d.get("actor_cycle") or []
    loops = {x.get("actor") for x in items if x.get("blocks_loop")}  # rules/actor_waits.py: the wait's site

    def member(x: Dict[str, Any]) -> str:
        s = call(x)
        if x.get("at"):
            s += " at %s%s" % (x["at"], ": `%s`" % x["code"] if x.get("code") else "")
        if x.get("blocks_loop"):
            s += (
                ", a blocking call inside its asyncio event loop (an async actor: none of its other methods runs "
                "until it returns)"
            )
        if x.get("target_started") is False:
            s += ", which has not started (%s is inside %s%s)" % (
                x.get("waits_on"),
                x.get("target_inside") or "no method",
                ", its event loop blocked" if x.get("waits_on") in loops else "",
            )
        return s

    if self_call(d):  # a call to itself (blind helper 61)
        x = dict(items[0], target_started=None)
        s = (
            "Actor deadlock: Ray actor %s waits on its own method: %s, which cannot start while %s runs (a call "
            "to itself through its own handle queues behind the call that waits for it)."
            % (x.get("actor"), member(x), x.get("method") or "its current method")
        )
    else:
        s = "Actor deadlock: Ray actors %s wait on each other's methods in a cycle: %s." % (
            ", ".join(diag.culprit_actors[:6]),
            "; ".join(member(x) for x in items[:6]),
        )
    waiters = d.get("actor_waiters") or []
    if waiters:
        s += " Waiting on the cycle: %s." % "; ".join(call(x) for x in waiters[:4])
    return s


def unschedulable(diag: Diagnosis, who: str, coll: str, d: Dict[str, Any]) -> str:
    """Kind unschedulable-actor (rules/unschedulable.py)."""
    req = d.get("actor_request") or {}
    res = req.get("resources") or {}
    ask = (
        ", ".join(
            "%s: %g" % (k, v)
            for k, v in sorted(res.items())
            if v and not k.startswith("node:") and k not in ("memory", "object_store_memory")
        )
        or "?"
    )
    nodes = d.get("cluster_nodes") or []
    short = req.get("short_of") or []
    s = (
        "Unschedulable Ray actor: %s asks for {%s}%s and no node of the cluster (%d) offers %s; it never "
        "got a process."
        % (
            ", ".join(diag.culprit_actors[:2]),
            ask,
            " in placement group %s" % str(req["placement_group"])[:12] if req.get("placement_group") else "",
            len(nodes),
            " and ".join(short) or "it",
        )
    )
    waiters = d.get("actor_waiters") or []
    if waiters:
        s += " Waiting for it: %s." % "; ".join(
            "%s%s, in %s on its %s"
            % (
                x.get("actor"),
                " in %s" % x["method"] if x.get("method") else "",
                _api(x.get("api")),
                x.get("target_method"),
            )
            for x in waiters[:4]
        )
    says = next(iter((d.get("ray_says") or {}).values()), None)
    if says:
        s += " Ray says: %s." % says.get("text")
    return s


def actor_stuck(diag: Diagnosis, d: Dict[str, Any]) -> str:
    """Ray actors without a rank inside a method while nothing progressed (rules/actors.py), or
    the end of a chain of waits on actor calls (rules/actor_waits.py)."""
    meth = d.get("actor_methods") or {}
    chain = d.get("actor_chain") or []
    idle = _ranks_idle(d)
    if chain:  # rules/actor_waits.py: the end of a chain of waits on actor calls
        lock = "".join(" %s." % (d[k][:1].upper() + d[k][1:]) for k in ("lock_wait", "peer_wait") if d.get(k))
        return (
            "Stuck outside collectives: Ray actor %s (no rank) is %s and waits on no other actor%s, while "
            "a chain of actor calls waits on it: %s.%s%s"
            % (
                ", ".join(diag.culprit_actors),
                "in %s" % ", ".join(sum(meth.values(), [])) if any(meth.values()) else "inside no method",
                " (%s)" % d["actor_doing"] if d.get("actor_doing") else "",
                "; ".join(call(x) for x in chain[:6]),
                lock,
                idle,
            )
        )
    extra = "".join(
        " %s." % (d[k][:1].upper() + d[k][1:]) for k in ("lock_wait", "peer_wait", "driver_wait") if d.get(k)
    )
    doing = d.get("actor_doing")
    listed = ["%s in %s" % (a, ", ".join(m)) for a, m in list(meth.items())[:6]]
    if doing and len(listed) > 1:  # the first actor's wait; "each" when all wait alike (rules/actors.py)
        listed[0] += "" if d.get("actor_doing_all") else " (%s)" % doing
        doing = "each: %s" % doing if d.get("actor_doing_all") else None
    return "Stuck Ray actors (no rank), each inside a method while nothing progressed: %s%s.%s%s" % (
        "; ".join(listed) or "a method",
        " (%s)" % doing if doing else "",
        extra,
        idle,
    )


def _ranks_idle(d: Dict[str, Any]) -> str:
    """`` Ranks 0-1 (Ray actors) are idle between method calls, in no collective.`` when the
    verdict names a rank-less actor while every rank waits for its next call (diagnose's
    ``details['ranks_idle']``)."""
    idle = d.get("ranks_idle") or []
    if not idle:
        return ""
    return " %s (Ray actors) %s idle between method calls, in no collective." % (
        _cap(_ranks(idle)),
        "is" if len(idle) == 1 else "are",
    )


def actor_dead(diag: Diagnosis, d: Dict[str, Any]) -> str:
    """A Ray actor without a rank failed first (rules/actors.py, rankless_root.py)."""
    text = d.get("cause_text") or ""
    casc = diag.cascade or []
    s = "Failed Ray actor: %s (no rank) failed first (cause: %s%s)." % (
        ", ".join(diag.culprit_actors[:6]),
        diag.cause,
        (": " + text) if text else "",
    )
    waits = d.get("rank_waits") or {}
    if waits:  # rules/rankless_root.py: ranked processes wait afterwards
        s += " No rank progressed after it; %s %s (cascade): %s." % (
            _ranks(diag.waiting_ranks),
            _verb(diag.waiting_ranks),
            "; ".join("rank %s %s" % (r, clip(w, 120)) for r, w in list(waits.items())[:3]),
        )
    lives = d.get("actor_lives_on")
    if lives:  # rules/actors.py: its asyncio task died unseen, the actor lives on
        s += " It lives on%s%s." % (
            " in %s" % lives["method"] if lives.get("method") else ", inside no method",
            ": %s" % lives["doing"] if lives.get("doing") else "",
        )
        waiters = d.get("actor_waiters") or []
        if waiters:
            s += " %s." % _cap("; ".join(call(x) for x in waiters[:3]))
        elif d.get("driver_wait"):
            s += " " + _cap(d["driver_wait"]) + "."
    if casc:
        s += " %d later failure(s) (cascade, e.g. %s: %s)." % (
            len(casc),
            casc[0].get("actor") or "rank %s" % casc[0].get("rank"),
            clip(casc[0].get("text") or casc[0].get("cause") or "", 100),
        )
    return s + _ranks_idle(d)


def _cap(text: str) -> str:
    """``text`` as the start of a sentence ("driver ..." reads "The driver ...")."""
    return "The " + text if text.startswith("driver ") else text[:1].upper() + text[1:]


def _quoted(diag: Diagnosis, x: Dict[str, Any]) -> bool:
    """True when the cause text already quotes Ray's detail (the memory monitor's kill)."""
    det = " ".join(str(x.get("exit_detail") or "").split())[:60]
    return bool(det) and det in " ".join((diag.summary or "").split())
