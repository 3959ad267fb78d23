"""Pure comparison of what the ranks were running (issue 12), and the crashing native frame.

Input: :class:`hangtrace.tracer.envfacts.ProcessEnv` records (rank joined from the ring).
Output: typed frozen results; nothing here reads files or processes (symbol lookup is
passed in as a function by the caller).

- :func:`diff_env` groups processes by each fact (every mapped shared object by name:
  path, build-id, stated version, ``analyze/libdiff.py``; the installed versions of the
  imported Python packages; job environment variable; Python/torch/ray version) and keeps
  the facts on which they disagree: "ranks 4–7 on host B: libnccl.so build-id 9f…, 2.21.5;
  the others: 2.23.4".
- :func:`envdiff_evidence` gives the verdict's evidence lines when the culprit differs
  from its peers.
- :func:`fatal_frame_library` names library and symbol of the frame that took a fatal
  signal, from the kernel's fault line and the mappings recorded while the process lived.
"""

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from hangtrace.tracer.analyze.libdiff import LibFile, build_id_known, files_of, files_text, library_line
from hangtrace.tracer.envfacts import Mapping, ProcessEnv
from hangtrace.tracer.envformat import matters

NOT_LOADED = "(not loaded)"
UNSET = "(unset)"


@dataclass(frozen=True)
class Member:
    rank: int
    host: str
    pid: int


@dataclass(frozen=True)
class Group:
    """Processes sharing one ``value`` of a fact; for a library, ``files`` are what they map
    under its name (None: not loaded; see ``analyze/libdiff.py``)."""

    value: str
    members: Tuple[Member, ...]
    files: Optional[Tuple[LibFile, ...]] = None

    @property
    def ranks(self) -> Tuple[int, ...]:
        return tuple(sorted(m.rank for m in self.members if m.rank >= 0))

    @property
    def hosts(self) -> Tuple[str, ...]:
        return tuple(sorted({m.host for m in self.members}))


@dataclass(frozen=True)
class Difference:
    """One fact on which processes disagree. ``kind``: 'library' | 'package' | 'version' |
    'environment'; ``name``: library key (``libnccl.so``), distribution, variable or
    version name; ``groups``: largest group last (the majority, rendered as "the others")."""

    kind: str
    name: str
    groups: Tuple[Group, ...]


@dataclass(frozen=True)
class EnvDiff:
    """``processes``: how many were compared (ranks when any are known, else all);
    ``facts``: how many facts were compared; ``differences`` in report order
    (libraries, packages, versions, environment)."""

    processes: int
    facts: int
    differences: Tuple[Difference, ...]


#: a fact's value in one process: a string, a library's files, or None (left out)
Value = Union[str, Tuple[LibFile, ...], None]
#: packages whose version is a fact of its own ("version" kind: the module's __version__)
_VERSIONED = ("torch", "ray")


def facts_of(pe: ProcessEnv) -> Dict[Tuple[str, str], str]:
    """``{(kind, name): value}`` for one process: versions, imported packages and job
    environment (kinds as in :class:`Difference`; libraries: :func:`library_facts`)."""
    out: Dict[Tuple[str, str], str] = {
        ("version", "python"): pe.python or UNSET,
        ("version", "torch"): pe.torch or "(not imported)",
        ("version", "ray"): pe.ray or "(not imported)",
    }
    for name, version in pe.packages:
        if name.lower() not in _VERSIONED:
            out[("package", name)] = version
    for k, val in pe.environ:
        out[("environment", k)] = val
    return out


def library_facts(procs: Sequence[ProcessEnv]) -> Dict[Tuple[str, str], List[Value]]:
    """``{("library", key): [files of each process]}``: what each of ``procs`` maps under
    each library key, build-ids compared only where known for every process mapping it;
    a process that does not map it is ``()`` ("(not loaded)") for the libraries that matter
    (``envformat.matters``) and None (left out of that comparison) for any other (ranks
    load plugins and extensions at different moments: presence alone is no difference)."""
    per: List[Dict[str, List[Any]]] = []
    for pe in procs:
        d: Dict[str, List[Any]] = {}
        for lb in pe.libraries:
            d.setdefault(lb.key, []).append(lb)
        per.append(d)
    out: Dict[Tuple[str, str], List[Value]] = {}
    for key in sorted({k for d in per for k in d}):
        ids = all(build_id_known(lb) for d in per for lb in d.get(key, ()))
        empty: Value = () if matters(key) else None
        out[("library", key)] = [files_of(d[key], ids) if key in d else empty for d in per]
    return out


def _text(kind: str, v: Value) -> str:
    if isinstance(v, tuple):
        return files_text(v) if v else NOT_LOADED
    return UNSET if v is None else v


_ORDER = {"library": 0, "package": 1, "version": 2, "environment": 3}
#: what a process without the fact is compared as (None: left out of that comparison)
_MISSING = {"environment": UNSET, "version": UNSET}


def _compared(envs: Sequence[ProcessEnv]) -> List[ProcessEnv]:
    ranked = [pe for pe in envs if pe.rank >= 0]
    return sorted(ranked or list(envs), key=lambda pe: (pe.rank, pe.host, pe.pid))


def diff_env(envs: Sequence[ProcessEnv]) -> EnvDiff:
    """Differences across the ranks (helpers with rank -1 are left out when ranks are
    known). An environment variable missing from a process counts as '(unset)', a library
    that matters as '(not loaded)'; other libraries and packages are compared among the
    processes that loaded them."""
    procs = _compared(envs)
    facts = [facts_of(pe) for pe in procs]
    table: Dict[Tuple[str, str], List[Value]] = library_facts(procs)
    for key in {k for f in facts for k in f}:
        table[key] = [f.get(key, _MISSING.get(key[0])) for f in facts]
    diffs = []
    for key in sorted(table, key=lambda k: (_ORDER.get(k[0], 9), k[1])):
        by_value: Dict[str, Tuple[Value, List[Member]]] = {}
        for pe, v in zip(procs, table[key]):
            if v is None and key[0] in ("library", "package"):
                continue
            got = by_value.setdefault(_text(key[0], v), (v, []))
            got[1].append(Member(pe.rank, pe.host, pe.pid))
        if len(by_value) < 2:
            continue
        groups = sorted(
            (Group(text, tuple(m), v if isinstance(v, tuple) else None) for text, (v, m) in by_value.items()),
            key=lambda g: (len(g.members), -min(x.rank for x in g.members)),
        )
        diffs.append(Difference(key[0], key[1], tuple(groups)))
    return EnvDiff(processes=len(procs), facts=len(table), differences=tuple(diffs))


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


def _who_ranks(ranks: Sequence[int]) -> str:
    return ("rank %d" % ranks[0]) if len(ranks) == 1 else "ranks %s" % rank_ranges(ranks)


def _alike(g: Group, culprits: Set[int]) -> str:
    """`` (as did ranks 4–6)``: the other ranks of a culprit's group, or ""."""
    others = sorted(set(g.ranks) - culprits)
    return " (as did %s)" % _who_ranks(others) if others else ""


def _against_peers(d: Difference, culprits: Set[int]) -> Optional[Tuple[List[Group], Group]]:
    """(the culprits' groups whose value differs from the peers', the peers' group: the one
    with most other ranks), or None when the culprits do not differ on ``d``."""
    peers = [(len(set(g.ranks) - culprits), g) for g in d.groups if set(g.ranks) - culprits]
    if not peers:
        return None
    peer = max(peers, key=lambda t: t[0])[1]
    mine = [g for g in d.groups if culprits & set(g.ranks) and g.value != peer.value]
    return (mine, peer) if mine else None


def envdiff_evidence(
    facts: Union[Sequence[ProcessEnv], EnvDiff], culprit_ranks: Sequence[int], limit: int = 4
) -> List[str]:
    """The evidence lines when the culprit ranks differ from their peers (the other ranks'
    majority value), else []: one line per library (issue 41: "rank 1 loaded libhtprobe.so
    from /a/lib (build-id 3f2a…) where ranks 0, 2–3 loaded it from /b/lib (build-id
    9c1e…)"), then one line for packages, versions and environment ("rank 1 runs
    differently from its peers: numpy 2.0.1 (peers: 1.26.4); NCCL_P2P_DISABLE=1 (peers:
    0)").

    ``facts``: the run's env records (rank joined, libraries as ``collect.elffacts``
    gives them) or a ready :class:`EnvDiff`; ``culprit_ranks``: global ranks from the
    verdict. At most ``limit`` library lines and ``limit`` differences in the last line;
    the rest are counted ("hangtrace env-diff" shows them)."""
    diff = facts if isinstance(facts, EnvDiff) else diff_env(facts)
    culprits = set(culprit_ranks)
    if not culprits:
        return []
    libs, parts = [], []
    for d in diff.differences:
        got = _against_peers(d, culprits)
        if got is None:
            continue
        mine, peer = got
        others = sorted(set(peer.ranks) - culprits)
        if d.kind == "library":
            who_files = [
                (_who_ranks(sorted(culprits & set(g.ranks))) + _alike(g, culprits), g.files) for g in mine
            ]
            libs.append(library_line(d.name, who_files, _who_ranks(others), peer.files))
            continue
        values = " / ".join(g.value for g in mine)
        label = d.name if d.kind != "environment" else "%s=" % d.name
        sep = "" if d.kind == "environment" else " "
        parts.append("%s%s%s (peers: %s)" % (label, sep, short(values), short(peer.value)))
    out = libs[:limit]
    if len(libs) > limit:
        out.append(
            "and %d more librar%s differ (hangtrace env-diff)"
            % (len(libs) - limit, "ies" if len(libs) - limit > 1 else "y")
        )
    if parts:
        more = "; and %d more (hangtrace env-diff)" % (len(parts) - limit) if len(parts) > limit else ""
        out.append(
            "rank%s %s run%s differently from %s peers: %s%s"
            % (
                "s" if len(culprits) > 1 else "",
                rank_ranges(sorted(culprits)),
                "" if len(culprits) > 1 else "s",
                "their" if len(culprits) > 1 else "its",
                "; ".join(parts[:limit]),
                more,
            )
        )
    return out


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
