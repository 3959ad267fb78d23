"""Ranks that poll for a condition while others wait for them in a collective (pure).

A rank asleep in ``time.sleep`` inside a ``while`` loop polls for the loop's condition
(``while not os.path.exists(marker):``, ``analyze/stuck/blocking.py`` ``poll_wait``). When the
ranks that wait for it in a collective use one of the condition's names in the lines right
after that collective (``open(marker, "w")``: the step the pollers wait for), the job is a
cycle: the pollers wait for a step the other rank takes only after they join its
collective (blind helper 62: rank 0's "to be safe" ``barrier()`` before it writes the
marker file ranks 1-3 poll for).

In: the diagnosis and the context (each rank's main-thread frames with the source facts of
``collect/sourcelines.py``: ``'loop'``, ``'next'``). Out: ``details['waiter_at']`` (where
the ranks waiting for the culprits are, user-first: ``analyze/stuck/place.py``), ``details['poll_wait']`` (the
polling loop's condition) and ``details['poll_cycle']`` (the sentence), each also an
evidence line. Never raises on odd data.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from hangtrace.tracer.analyze.stuck.blocking import poll_loop, sleeping
from hangtrace.tracer.analyze.stuck.place import place_of, place_text
from hangtrace.tracer.analyze.context import Ctx
from hangtrace.tracer.stackmodel.usercode import user_frame
from hangtrace.tracer.analyze.stuck.stacktree import format_ranks, process_frames
from hangtrace.tracer.diagnosis import Diagnosis, Kind

_KEYWORDS = frozenset(
    {"while", "not", "and", "or", "in", "is", "None", "True", "False", "if", "else", "lambda"}
)
_NAME = re.compile(r"\.?[A-Za-z_]\w*")


def condition_names(loop_code: str) -> List[str]:
    """The names a ``while`` header polls: ``'while not os.path.exists(marker):'`` ->
    ``['marker']``, ``'while not self.ready:'`` -> ``['.ready']`` (an attribute); calls,
    modules and keywords are left out."""
    body = loop_code.strip()
    body = body[len("while") :] if body.startswith("while") else body
    body = body.rstrip(":")
    out: List[str] = []
    for m in _NAME.finditer(body):
        tok, nxt = m.group(), body[m.end() : m.end() + 1]
        if nxt in "(." and nxt or tok.lstrip(".") in _KEYWORDS:
            continue  # (a call, a module or object whose attribute is read, a keyword)
        if tok not in out:
            out.append(tok)
    return out


def _uses(code: str, names: List[str]) -> Optional[str]:
    for n in names:
        pat = re.escape(n) + r"\b" if n.startswith(".") else r"(?<![\w.])" + re.escape(n) + r"\b"
        if re.search(pat, code):
            return n.lstrip(".")
    return None


def _frames(ctx: Ctx, r: int) -> Any:
    v = ctx.views.get(r)
    return process_frames(v.proc) if v is not None else (None, None)


def poll_waits(ctx: Ctx, d: Diagnosis) -> None:
    """Adds ``waiter_at``, ``poll_wait`` and ``poll_cycle`` to a stuck-outside-collective
    diagnosis with culprit ranks (module docstring)."""
    if d.kind != Kind.STUCK_OUTSIDE_COLLECTIVE or not d.culprit_ranks:
        return
    try:
        _poll_waits(ctx, d)
    except Exception:  # a detail: never lose the verdict for it
        return


def _poll_waits(ctx: Ctx, d: Diagnosis) -> None:
    waiters = [
        r for r in (d.details.get("direct_waiters") or d.waiting_ranks or []) if r not in d.culprit_ranks
    ]
    at: Dict[int, Any] = {}
    for w in waiters[:16]:
        frames, _th = _frames(ctx, w)
        uf = user_frame(frames or [])
        if uf is not None:
            at[w] = uf
    # where they wait, user-first (issue 41: a Lightning rank waits in DDP's backward, far
    # below its only own frame, `main`'s `trainer.fit` line)
    labels = {place_text(place_of(_frames(ctx, w)[0])) for w in at}
    if at and len(labels) == 1 and len(at) == len(waiters[:16]):
        d.details["waiter_at"] = labels.pop()
    polls = {}
    for r in d.culprit_ranks[:16]:
        frames, th = _frames(ctx, r)
        found = poll_loop(frames) if frames and sleeping(frames, th) else None
        if found is not None:
            polls[r] = found
    if not polls:
        return
    pollers = sorted(polls)
    lf, line, code = polls[pollers[0]]
    d.details["poll_wait"] = code
    names = condition_names(code)
    for w, uf in sorted(at.items()):
        for item in uf.get("next") or ():
            try:
                n, text = int(item[0]), str(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            used = _uses(text, names)
            if used is None:
                continue
            who = ("rank " if len(pollers) == 1 else "ranks ") + format_ranks(pollers, 12)
            d.details["poll_cycle"] = (
                "rank %d uses `%s` right after that collective (%s:%d: `%s`): if that is what %s %s for, this is a "
                "cycle: %s for a step rank %d takes only after %s its collective"
                % (
                    w,
                    used,
                    os.path.basename(str(uf.get("filename") or "?")),
                    n,
                    text,
                    who,
                    "polls" if len(pollers) == 1 else "poll",
                    "it waits" if len(pollers) == 1 else "they wait",
                    w,
                    "it joins" if len(pollers) == 1 else "they join",
                )
            )
            ctx.add(d.details["poll_cycle"])
            return
