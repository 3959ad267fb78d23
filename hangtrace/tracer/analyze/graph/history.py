"""Which side of a tie changed, by each rank's own history (pure; issue 37).

When the members of a group post different collectives at one seq and no majority decides
(two-member groups: TP=2, a pipeline pair, 2-GPU DDP, a trainer-engine pair; or equal
halves), each rank's own earlier records still tell whether its current collective is
*routine* or *new* for it. A training loop issues the same collectives, in the same order,
at every step: Lightning broadcasts a SIGTERM flag every step, DDP all-reduces its buckets
(C++-issued: torch's Flight Recorder entries), a loop all-reduces its loss. A rank-0-only
``barrier()`` in a callback, a metric ``all_gather`` on one rank, or the first collective
after a loop that ended early is not in that pattern.

A rank's *steps* are, in this order:

* by its records' ``step`` (``tracer.step``): the collectives of each earlier step on the
  group, the current one's place in its step being its index there;
* else by the *period* of its collective stream: the shortest block of collectives that
  its last collectives on the group repeat, back to where the repetition stops (the loop's
  start). Lightning and HF Trainer record no step; their streams are periodic (measured
  2026-12-07: ``broadcast int64[1]`` then DDP's bucket ``all_reduce`` on every step).

A collective is keyed by its signature (op, dtype, numel, root) and, when every record
considered carries torch's stack (Flight Recorder ``frames``), its innermost frame outside
torch. Its status for the rank:

* ``routine``: every earlier step (two or more by the records' step, ``MIN_PERIODS`` or more
  by the period) issued it at this place;
* ``recurring``: not every step issues it, but its loop did before, at this place of a step
  or between two steps (HF Trainer gathers its logged loss every ``logging_steps``);
* ``new``: no earlier step of its loop issued it (it may have come before the loop: the
  set-up barriers);
* ``out-of-place``: the loop issues it, but not at this place (a collective skipped);
* ``unknown``: fewer than two earlier steps, or no repeating stream.

Without a repeating stream (an extra collective every few steps, cut before it repeated),
a loop is still seen where one collective is at least half of the stream from its first
issue on (``_by_frequency``): a collective never issued since is *new*, the loop's own one
*recurring* (Accelerate's rank-0-only ``wait_for_everyone`` at step 10 against DDP's bucket
all-reduce, measured 2026-12-07); a skipped step it cannot tell without steps.

The rank whose collective is new or out of place is the one that changed when every other
rank's is routine or recurring: the one waiting in a collective its every step issued is its victim. A
changed rank whose collective is outside the phases its loop's collectives ran in (its
phase ended) *left its loop early* (uneven inputs: its peers still issue the per-step
collective). Both new, both routine, or a history too short: undecidable, and the line says
why.

In: the context and each member's record at (group, seq). Out: ``Habit`` per rank and a
``Decision``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hangtrace.tracer.analyze.context import Ctx, history
from hangtrace.tracer.analyze.evidence import desc_rec, rk
from hangtrace.tracer.analyze.graph.waitgraph import signature
from hangtrace.tracer.analyze.rankview import Record

ROUTINE, RECURRING, NEW, OUT_OF_PLACE, UNKNOWN = "routine", "recurring", "new", "out-of-place", "unknown"
#: statuses of a collective its loop issues (the victim's side) and of one it does not
BENIGN, CHANGED = (ROUTINE, RECURRING), (NEW, OUT_OF_PLACE)
#: longest step (collectives on one group) the period search tries
MAX_PERIOD = 32
#: a repeating stream is a loop once it repeats this many times (records' steps: 2 suffice):
#: a run's first collectives are set-up (DDP's parameter broadcasts, barriers), and two
#: equal ones are a start, not yet a loop
MIN_PERIODS = 3
#: without a repeating step, a loop is one collective issued this many times or more, at
#: least half of the stream from its first issue on (``_by_frequency``)
MIN_LOOP_ISSUES = 4
_TORCH_PARTS = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3")

Key = Tuple[Any, ...]


@dataclass(frozen=True)
class Habit:
    """Rank ``rank``'s collective ``op`` at ``seq`` of ``group`` against its own earlier steps.

    ``status``: routine | new | out-of-place | unknown (module doc). ``steps``: earlier steps
    of its loop seen; ``per_step``: collectives per step on the group (the period); ``by``:
    'step' (records' step) or 'period' (the repeating stream); ``left_loop``: a changed
    collective outside its loop's phases; ``before_loop``: seq of its last such collective
    before the loop began (None: never); ``text``: the fact in words."""

    rank: int
    group: Any
    seq: int
    op: Any
    status: str
    steps: int
    per_step: int
    by: str
    left_loop: bool
    before_loop: Optional[int]
    text: str


@dataclass(frozen=True)
class Decision:
    """Who changed by history: ``culprits`` (sorted; every rank when undecided), ``decided``,
    ``left_loop`` (culprits that left their loop early) and the evidence ``text``."""

    culprits: List[int]
    decided: bool
    left_loop: List[int]
    text: str
    habits: Tuple[Habit, ...]


def _site(rec: Mapping[str, Any]) -> Optional[Tuple[Any, Any, Any]]:
    """The innermost frame of torch's stack of ``rec`` outside torch and installed packages."""
    for f in rec.get("frames") or ():
        fn = str(f.get("filename") or "")
        if not any(part in fn for part in _TORCH_PARTS):
            return (f.get("name"), fn.rsplit("/", 1)[-1], f.get("line"))
    return None


def _earlier(ctx: Ctx, r: int, group: Any, seq: int) -> List[Record]:
    """Rank ``r``'s collectives on ``group`` below ``seq``, by seq, back to the first gap in
    its numbering (a wrapped ring)."""
    v = ctx.views.get(r)
    if v is None:
        return []
    by_seq: Dict[int, Record] = {}
    for x in history(v.proc):
        s = x.get("seq")
        if x.get("kind") == "collective" and x.get("group") == group and isinstance(s, int) and s < seq:
            by_seq.setdefault(s, x)
    out: List[Record] = []
    for s in sorted(by_seq, reverse=True):
        if out and out[-1].get("seq") != s + 1:
            break
        out.append(by_seq[s])
    return out[::-1]


def _keyer(recs: Sequence[Mapping[str, Any]]) -> Any:
    with_site = bool(recs) and all(_site(x) is not None for x in recs)
    return lambda x: tuple(signature(x)) + ((_site(x),) if with_site else ())


def _steps_advance(before: List[Record], rec: Record) -> bool:
    """The records carry ``tracer.step`` and it changed before ``rec`` (a constant step, or
    none, leaves the stream's period to tell the steps)."""
    cur = rec.get("step")
    return isinstance(cur, int) and cur >= 0 and any(x.get("step") not in (None, cur) for x in before)


def _by_step(before: List[Record], rec: Record, key: Any) -> Tuple[List[List[Key]], int, int]:
    """(earlier steps' keys, this place, first seq of the loop) by the records' step; no
    steps when fewer than two complete earlier ones are kept."""
    cur = rec.get("step")
    steps: Dict[int, List[Record]] = {}
    for x in before:
        s = x.get("step")
        if isinstance(s, int) and s >= 0:
            steps.setdefault(s, []).append(x)
    earlier = sorted(s for s in steps if isinstance(cur, int) and s < cur)
    if len(earlier) > 2:
        earlier = earlier[1:]  # the ring may begin inside the first step seen
    if len(earlier) < 2:
        return [], 0, 0
    place = len(steps.get(cur, [])) if isinstance(cur, int) else 0
    first = int(steps[earlier[0]][0].get("seq") or 0)
    return [[key(x) for x in steps[s]] for s in earlier], place, first


def _by_period(before: List[Record], key: Any) -> Optional[Tuple[List[List[Key]], int, int]]:
    """(the loop's steps' keys, this place, first seq of the loop) by the stream's period: the
    loop begins where the step's block first occurs (steps with extras between them, such as
    a logging gather every few steps, are in it); its trailing repetition is its steps."""
    ks = [key(x) for x in before]
    n = len(ks)
    for p in range(1, min(MAX_PERIOD, n // 2) + 1):
        if ks[n - p :] == ks[n - 2 * p : n - p]:
            reps = 2
            while n - (reps + 1) * p >= 0 and ks[n - (reps + 1) * p : n - reps * p] == ks[n - p :]:
                reps += 1
            if reps < MIN_PERIODS:
                continue
            blocks = [ks[n - (j + 1) * p : n - j * p] for j in range(reps)][::-1]
            start = next(i for i in range(n - p + 1) if ks[i : i + p] == blocks[-1])
            return blocks, 0, int(before[start].get("seq") or 0)
    return None


def habit(ctx: Ctx, r: int, group: Any, rec: Record) -> Habit:
    """Rank ``r``'s collective ``rec`` on ``group`` against its earlier steps (module doc)."""
    seq = int(rec.get("seq") or 0)
    before = _earlier(ctx, r, group, seq)
    key = _keyer(before + [rec])
    found, by = None, "period"
    if _steps_advance(before, rec):  # the records' steps, and only them
        found, by = _by_step(before, rec, key), "step"
    else:
        found = _by_period(before, key)
    if found is None or not found[0]:
        freq = _by_frequency(r, group, rec, before, key) if by == "period" else None
        if freq is not None:  # (records with steps but too few of them: unknown, as before)
            return freq
        return Habit(
            r, group, seq, rec.get("op"), UNKNOWN, 0, 0, "", False, None, _unknown_text(r, rec, before)
        )
    steps, place, first = found
    k = key(rec)
    loop = [x for x in before if int(x.get("seq") or 0) >= first]
    status = _status(steps, place, k, {key(x) for x in loop})
    prior = [int(x.get("seq") or 0) for x in before if key(x) == k and int(x.get("seq") or 0) < first]
    phases = {x.get("phase") for x in loop}
    left = status != ROUTINE and rec.get("phase") not in phases and any(ph is not None for ph in phases)
    per = len(steps[-1])
    h = Habit(r, group, seq, rec.get("op"), status, len(steps), per, by, left, max(prior, default=None), "")
    return replace(h, text=_text(h, rec, loop))


def _by_frequency(r: int, group: Any, rec: Record, before: List[Record], key: Any) -> Optional[Habit]:
    """No repeating step (a loop with an extra collective every few steps, cut before it
    repeated ``MIN_PERIODS`` times: Accelerate's gather every 5 steps, a job that went wrong
    at step 10), yet a loop: one collective (DDP's bucket all-reduce) is at least half of
    the stream from its first issue on, ``MIN_LOOP_ISSUES`` times or more. Then a collective
    never issued since that start is *new* (a rank-0-only barrier; the set-up barriers came
    before), the loop's own collective or one issued twice or more since is *recurring*;
    anything else stays unknown (None). Never *out-of-place*: without a step, a place is
    not known."""
    ks = [key(x) for x in before]
    if not ks:
        return None
    main = max(set(ks), key=ks.count)
    start = ks.index(main)
    loop = ks[start:]
    n_main = loop.count(main)
    if n_main < MIN_LOOP_ISSUES or 2 * n_main < len(loop):
        return None
    k = key(rec)
    seq = int(rec.get("seq") or 0)
    first = int(before[start].get("seq") or 0)
    main_desc = desc_rec(before[start])
    if k not in loop:
        prior = [int(x.get("seq") or 0) for x in before[:start] if key(x) == k]
        text = (
            "rank %d's %s was issued by none of its %d collective(s) since its loop began "
            "(no repeating step; its loop's collective, %s, from seq %d, %d times)"
            % (r, desc_rec(rec), len(loop), main_desc, first, n_main)
        )
        if prior:
            text += "; its last one was seq %d, before that loop" % max(prior)
        return Habit(
            r, group, seq, rec.get("op"), NEW, n_main, 0, "frequency", False, max(prior, default=None), text
        )
    if k == main or loop.count(k) >= 2:
        text = "rank %d's %s is one its loop issued %d time(s) since seq %d (no repeating step; %s)" % (
            r,
            desc_rec(rec),
            loop.count(k),
            first,
            "its loop's own collective" if k == main else "its loop's collective is %s" % main_desc,
        )
        return Habit(r, group, seq, rec.get("op"), RECURRING, n_main, 0, "frequency", False, None, text)
    return None


def _status(steps: List[List[Key]], place: int, k: Key, in_loop: Any) -> str:
    """The status of key ``k`` at ``place`` against the loop's ``steps`` (module doc)."""
    at_place = [len(s) > place and s[place] == k for s in steps]
    if all(at_place):
        return ROUTINE
    if any(at_place) or (k in in_loop and not any(k in s for s in steps)):
        return RECURRING
    return OUT_OF_PLACE if any(k in s for s in steps) else NEW


def _unknown_text(r: int, rec: Record, before: List[Record]) -> str:
    return "rank %d's %s: its history on the group (%d earlier collective(s)) shows no repeating step" % (
        r,
        rec.get("op"),
        len(before),
    )


def _text(h: Habit, rec: Record, loop: List[Record]) -> str:
    how = (
        "steps by its records' step"
        if h.by == "step"
        else "a repeating step of %d collective(s)" % h.per_step
    )
    if h.status == ROUTINE:
        return "rank %d's %s is the collective each of its %d earlier steps issued at this place (%s)" % (
            h.rank,
            desc_rec(rec),
            h.steps,
            how,
        )
    if h.status == RECURRING:
        return (
            "rank %d's %s is one its loop issued before, though not in every step (%s, its loop from seq %s)"
            % (
                h.rank,
                desc_rec(rec),
                how,
                loop[0].get("seq") if loop else "?",
            )
        )
    if h.status == OUT_OF_PLACE:
        return "rank %d's %s comes at another place in its step than in its %d earlier steps (%s)" % (
            h.rank,
            desc_rec(rec),
            h.steps,
            how,
        )
    s = "rank %d's %s was issued by none of its %d earlier steps (%s, its loop from seq %s)" % (
        h.rank,
        desc_rec(rec),
        h.steps,
        how,
        loop[0].get("seq") if loop else "?",
    )
    if h.before_loop is not None:
        s += "; its last one was seq %d, before that loop" % h.before_loop
    if h.left_loop:
        s += "; its phase %r is none of its loop's (%s): it left its loop early" % (
            rec.get("phase"),
            ", ".join(sorted(repr(x.get("phase")) for x in {x.get("phase"): x for x in loop}.values())),
        )
    return s


def decide(ctx: Ctx, group: Any, recs: Mapping[int, Record], classes: Sequence[Sequence[int]]) -> Decision:
    """Which of the signature ``classes`` (lists of ranks, the tie) changed, by history."""
    habits = {r: habit(ctx, r, group, recs[r]) for rs in classes for r in rs if r in recs}
    changed = [rs for rs in classes if rs and all(habits[r].status in CHANGED for r in rs)]
    routine = [rs for rs in classes if rs and all(habits[r].status in BENIGN for r in rs)]
    every = sorted(habits)
    hs = tuple(habits[r] for r in every)
    if len(changed) == 1 and len(routine) == len(classes) - 1 and len(habits) == sum(map(len, classes)):
        culprits = sorted(changed[0])
        left = [r for r in culprits if habits[r].left_loop]
        text = "%s; %s: %s waits in what its loop issues, its victim" % (
            "; ".join(habits[r].text for r in culprits),
            "; ".join(habits[r].text for rs in routine for r in rs),
            rk([r for rs in routine for r in rs], 8),
        )
        if left:
            text += (
                "; %s left its loop early (uneven inputs per rank: its loop ended before its peers')"
                % rk(left, 8)
            )
        return Decision(culprits, True, left, text, hs)
    return Decision(every, False, [], _undecided(habits), hs)


def _undecided(habits: Mapping[int, Habit]) -> str:
    st = {h.status for h in habits.values()}
    if st <= set(CHANGED) and st:
        why = "each rank's collective is new to its own loop: both changed path"
    elif st <= set(BENIGN):
        why = "each rank's collective is one its own loop issues: their loops differ"
    elif UNKNOWN in st:
        why = "a rank's history shows no loop to compare with"
    else:
        why = "the ranks' histories do not single one out"
    return "history cannot decide which rank changed (%s): %s; naming all" % (
        why,
        "; ".join(h.text for _, h in sorted(habits.items())),
    )


#: ``HISTORY_PREFIX + Decision.text`` is the evidence line of a tie history broke
HISTORY_PREFIX = "tie broken by each rank's own history: "


def details(dec: Decision) -> Dict[str, Any]:
    """``details['changed_by_history']`` of a verdict a decided ``dec`` gave: {'ranks',
    'left_loop', 'victims', 'ops' (str(rank) -> op), 'steps' (str(rank) -> earlier steps
    seen), 'status' (str(rank) -> routine | recurring | new | out-of-place), 'text'}."""
    return {
        "ranks": list(dec.culprits),
        "left_loop": list(dec.left_loop),
        "victims": [h.rank for h in dec.habits if h.rank not in dec.culprits],
        "ops": {str(h.rank): h.op for h in dec.habits},
        "steps": {str(h.rank): h.steps for h in dec.habits},
        "status": {str(h.rank): h.status for h in dec.habits},
        "text": dec.text,
    }
