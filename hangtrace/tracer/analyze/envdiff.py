"""Pure comparison of what the ranks were running (issue 12), and the crashing native frame.

Input: :class:`hangtrace.tracer.envfacts.ProcessEnv` records (rank joined from the ring).
Output: typed frozen results; nothing here reads files or processes (symbol lookup is
passed in as a function by the caller).

- :func:`diff_env` groups processes by each fact (library build-id and stated version,
  job environment variable, Python/torch/ray version) and keeps the facts on which they
  disagree: "ranks 4–7 on host B: libnccl.so build-id 9f…, 2.21.5; the others: 2.23.4".
- :func:`envdiff_evidence` gives the verdict's evidence line when the culprit differs
  from its peers.
- :func:`fatal_frame_library` names library and symbol of the frame that took a fatal
  signal, from the kernel's fault line and the mappings recorded while the process lived.
"""

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from hangtrace.tracer.envfacts import Mapping, ProcessEnv

NOT_LOADED = "(not loaded)"
UNSET = "(unset)"


@dataclass(frozen=True)
class Member:
    rank: int
    host: str
    pid: int


@dataclass(frozen=True)
class Group:
    """Processes sharing one ``value`` of a fact."""

    value: str
    members: Tuple[Member, ...]

    @property
    def ranks(self) -> Tuple[int, ...]:
        return tuple(sorted(m.rank for m in self.members if m.rank >= 0))

    @property
    def hosts(self) -> Tuple[str, ...]:
        return tuple(sorted({m.host for m in self.members}))


@dataclass(frozen=True)
class Difference:
    """One fact on which processes disagree. ``kind``: 'library' | 'environment' |
    'version'; ``name``: library key (``libnccl.so``), variable or package name;
    ``groups``: largest group last (the majority, rendered as "the others")."""

    kind: str
    name: str
    groups: Tuple[Group, ...]


@dataclass(frozen=True)
class EnvDiff:
    """``processes``: how many were compared (ranks when any are known, else all);
    ``facts``: how many facts were compared; ``differences`` in report order
    (libraries, versions, environment)."""

    processes: int
    facts: int
    differences: Tuple[Difference, ...]


def _lib_value(libs: List[Any]) -> str:
    parts = []
    for lb in sorted(libs, key=lambda x: x.path):
        v = "build-id %s" % lb.build_id if lb.build_id else "no build-id, %s (%d bytes)" % (lb.path, lb.size)
        if lb.version:
            v += ", %s" % lb.version
        parts.append(v)
    return "; ".join(parts)


def facts_of(pe: ProcessEnv) -> Dict[Tuple[str, str], str]:
    """``{(kind, name): value}`` for one process (kinds as in :class:`Difference`)."""
    out: Dict[Tuple[str, str], str] = {
        ("version", "python"): pe.python or UNSET,
        ("version", "torch"): pe.torch or "(not imported)",
        ("version", "ray"): pe.ray or "(not imported)",
    }
    libs: Dict[str, List[Any]] = {}
    for lb in pe.libraries:
        libs.setdefault(lb.key, []).append(lb)
    for k, group in libs.items():
        out[("library", k)] = _lib_value(group)
    for k, val in pe.environ:
        out[("environment", k)] = val
    return out


def _missing(kind: str) -> str:
    return NOT_LOADED if kind == "library" else UNSET


_ORDER = {"library": 0, "version": 1, "environment": 2}


def _compared(envs: Sequence[ProcessEnv]) -> List[ProcessEnv]:
    ranked = [pe for pe in envs if pe.rank >= 0]
    return sorted(ranked or list(envs), key=lambda pe: (pe.rank, pe.host, pe.pid))


def diff_env(envs: Sequence[ProcessEnv]) -> EnvDiff:
    """Differences across the ranks (helpers with rank -1 are left out when ranks are
    known). A fact missing from a process counts as '(not loaded)' / '(unset)'."""
    procs = _compared(envs)
    facts = [facts_of(pe) for pe in procs]
    keys = sorted({k for f in facts for k in f}, key=lambda k: (_ORDER.get(k[0], 9), k[1]))
    diffs = []
    for key in keys:
        by_value: Dict[str, List[Member]] = {}
        for pe, f in zip(procs, facts):
            by_value.setdefault(f.get(key, _missing(key[0])), []).append(Member(pe.rank, pe.host, pe.pid))
        if len(by_value) < 2:
            continue
        groups = sorted(
            (Group(v, tuple(m)) for v, m in by_value.items()),
            key=lambda g: (len(g.members), -min(x.rank for x in g.members)),
        )
        diffs.append(Difference(key[0], key[1], tuple(groups)))
    return EnvDiff(processes=len(procs), facts=len(keys), differences=tuple(diffs))


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0,1,2,3,7]`` -> ``"0–3, 7"`` (en dash)."""
    rs = sorted(set(ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else "%d–%d" % (rs[i], rs[j]))
        i = j + 1
    return ", ".join(out)


def who(group: Group) -> str:
    """``"ranks 4–7 on host b"`` / ``"pid 12 on host a"``."""
    ranks = group.ranks
    if ranks:
        head = ("rank %d" % ranks[0]) if len(ranks) == 1 else "ranks %s" % rank_ranges(ranks)
    else:
        head = "pid%s %s" % (
            "s" if len(group.members) > 1 else "",
            ", ".join(str(m.pid) for m in group.members),
        )
    hosts = group.hosts
    return "%s on host%s %s" % (head, "s" if len(hosts) > 1 else "", ", ".join(hosts))


def short(value: str, width: int = 12) -> str:
    """Build-ids shortened to ``width`` hex digits followed by '…'."""
    return re.sub(r"build-id ([0-9a-f]{%d})[0-9a-f]+" % width, r"build-id \1…", value)


def envdiff_evidence(
    facts: Union[Sequence[ProcessEnv], EnvDiff], culprit_ranks: Sequence[int], limit: int = 4
) -> List[str]:
    """One evidence line when the culprit ranks' libraries, versions or job environment
    differ from their peers' (the majority value of the other ranks), else [].

    ``facts``: the run's env records (rank joined) or a ready :class:`EnvDiff`;
    ``culprit_ranks``: global ranks from the verdict. At most ``limit`` differences are
    named, libraries first."""
    diff = facts if isinstance(facts, EnvDiff) else diff_env(facts)
    culprits = set(culprit_ranks)
    if not culprits:
        return []
    parts = []
    for d in diff.differences:
        mine = [g for g in d.groups if culprits & set(g.ranks)]
        peers = [(len(set(g.ranks) - culprits), g) for g in d.groups if set(g.ranks) - culprits]
        if not mine or not peers:
            continue
        peer = max(peers, key=lambda t: t[0])[1]
        values = [g.value for g in mine if g.value != peer.value]
        if not values:
            continue
        label = d.name if d.kind != "environment" else "%s=" % d.name
        sep = "" if d.kind == "environment" else " "
        parts.append("%s%s%s (peers: %s)" % (label, sep, short(" / ".join(values)), short(peer.value)))
    if not parts:
        return []
    more = "; and %d more (hangtrace env-diff)" % (len(parts) - limit) if len(parts) > limit else ""
    return [
        "rank%s %s run%s differently from %s peers: %s%s"
        % (
            "s" if len(culprits) > 1 else "",
            rank_ranges(sorted(culprits)),
            "" if len(culprits) > 1 else "s",
            "their" if len(culprits) > 1 else "its",
            "; ".join(parts[:limit]),
            more,
        )
    ]


@dataclass(frozen=True)
class KernelFault:
    """A fatal-fault line of the kernel log. ``ip``: faulting instruction address;
    ``name``: the file the kernel names; ``file_offset``: ip's offset in that file
    (kernels since 6.2 print it, older ones print only ``base``); ``what``:
    'segfault' or the trap's name ('divide error', 'invalid opcode', ...)."""

    comm: str
    pid: int
    what: str
    ip: int
    name: Optional[str]
    file_offset: Optional[int]
    base: Optional[int]


_SEGV = re.compile(
    r"(?P<comm>\S+)\[(?P<pid>\d+)\]: segfault at \S+ ip (?P<ip>[0-9a-f]+) .*?"
    r"(?: in (?P<name>[^\s\[]+)\[(?:(?P<off>[0-9a-f]+),)?(?P<base>[0-9a-f]+)\+[0-9a-f]+\])?"
    r"(?: likely|$)"
)
_TRAP = re.compile(
    r"(?P<comm>\S+)\[(?P<pid>\d+)\] (?:trap )?(?P<what>[a-z][a-z ]+?) ip:(?P<ip>[0-9a-f]+) .*?"
    r"(?: in (?P<name>[^\s\[]+)\[(?:(?P<off>[0-9a-f]+),)?(?P<base>[0-9a-f]+)\+[0-9a-f]+\])?"
    r"(?: likely|$)"
)


def parse_kernel_faults(text: str) -> List[KernelFault]:
    """Every segfault/trap line in ``text`` (kernel ``show_signal_msg`` / ``do_trap``
    formats, arch/x86/mm/fault.c and arch/x86/kernel/traps.c)."""
    out = []
    for line in text.splitlines():
        m = _SEGV.search(line)
        what = "segfault"
        if m is None:
            m = _TRAP.search(line)
            if m is None:
                continue
            what = m.group("what").strip()
        off = m.group("off")
        out.append(
            KernelFault(
                m.group("comm"),
                int(m.group("pid")),
                what,
                int(m.group("ip"), 16),
                m.group("name"),
                int(off, 16) if off else None,
                int(m.group("base"), 16) if m.group("base") else None,
            )
        )
    return out


def locate(fault: KernelFault, maps: Sequence[Mapping]) -> Optional[Tuple[str, int]]:
    """``(path, file offset)`` of the faulting instruction: the recorded mapping that
    holds ``ip``, else the kernel's own file offset with the path of the recorded
    mapping of that file name; None when neither is known."""
    for m in maps:
        if m.start <= fault.ip < m.end:
            return m.path, fault.ip - m.start + m.offset
    if fault.name and fault.file_offset is not None:
        for m in maps:
            if m.path.rsplit("/", 1)[-1] == fault.name:
                return m.path, fault.file_offset
        return fault.name, fault.file_offset
    return None


def fatal_frame_library(
    signal_text: str,
    maps: Sequence[Mapping],
    symbolize: Optional[Callable[[str, int], Optional[str]]] = None,
    pid: Optional[int] = None,
) -> Optional[str]:
    """``"libcrash.so, crash_here+0x9 (segfault; /path/libcrash.so +0x1109)"``: the library
    and symbol of the native frame that took the fatal signal, or None.

    ``signal_text``: text holding the kernel's fault line (``kernel_fault_text``; the
    faulthandler dump has only Python frames); ``maps``: the process's executable
    mappings recorded while it lived; ``symbolize(path, file_offset)`` -> ``symbol+0xN``
    or None (``collect.forensics.symbolize`` reads the ELF symbol tables); ``pid``
    restricts to that process's lines. SIGABRT and SIGBUS from a mapped file leave no
    kernel line: None then."""
    faults = [f for f in parse_kernel_faults(signal_text) if pid is None or f.pid == pid]
    if not faults:
        return None
    f = faults[-1]
    where = locate(f, maps)
    if where is None:
        return None
    path, off = where
    sym = symbolize(path, off) if symbolize is not None else None
    name = path.rsplit("/", 1)[-1]
    return "%s%s (%s; %s +0x%x)" % (name, ", " + sym if sym else "", f.what, path, off)
