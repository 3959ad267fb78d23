"""What one process maps under one library name, as env-diff compares it (issue 41). Pure.

Every mapped shared object of a rank is compared with the same library name
(``Library.key``: the file name, or the soname ``collect/elffacts.py`` set, without its
version suffix) of the other ranks by path and GNU build-id. A build-id is compared only when it is known for every compared process
mapping that name (read in the process for the libraries that matter, at analysis time by
``collect/elffacts.py`` for the others); otherwise the paths alone are compared, and the
reason is one of env-diff's notes. ``no GNU build-id`` is known, and compared.
"""

import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from hangtrace.tracer.envfacts import Library

#: ``Library.note`` of a file read with no build-id note (``collect/elffacts.NO_BUILD_ID``)
NO_BUILD_ID = "no GNU build-id"


@dataclass(frozen=True)
class LibFile:
    """One mapped file as compared: ``build_id`` (hex) when compared and known; ``known``
    False when build-ids are not compared for this name (paths only); ``version`` as the
    library states it or its file name does (``libnccl.so.2.21.5`` -> ``2.21.5``)."""

    path: str
    build_id: Optional[str]
    known: bool
    version: Optional[str]

    def text(self) -> str:
        """``/a/lib/libx.so (build-id 3f…, 1.2.3)`` / ``(no build-id)`` / ``/a/lib/libx.so``."""
        facts = []
        if self.known:
            facts.append("build-id %s" % self.build_id if self.build_id else "no build-id")
        if self.version:
            facts.append(self.version)
        return self.path + (" (%s)" % ", ".join(facts) if facts else "")


def build_id_known(lb: Library) -> bool:
    """True when ``lb``'s build-id was read (present, or read and absent)."""
    return lb.build_id is not None or lb.note == NO_BUILD_ID


def files_of(libs: Sequence[Library], compare_ids: bool) -> Tuple[LibFile, ...]:
    """The files one process maps under one name, by path; build-ids when ``compare_ids``."""
    return tuple(
        LibFile(lb.path, lb.build_id if compare_ids else None, compare_ids, lb.version)
        for lb in sorted(libs, key=lambda x: x.path)
    )


def files_text(files: Sequence[LibFile]) -> str:
    """The compared value of :func:`files_of`: the files' texts joined with ``"; "``."""
    return "; ".join(f.text() for f in files)


def _short_id(bid: str, width: int = 12) -> str:
    return bid[:width] + "…" if len(bid) > width else bid


def _where(f: LibFile, name: str) -> str:
    """``from /a/lib (build-id 3f2a1b2c3d4e…)`` when the file is called ``name``, else
    ``libx.so.2 from /a/lib (...)``."""
    d, base = os.path.split(f.path)
    facts = []
    if f.known:
        facts.append("build-id %s" % _short_id(f.build_id) if f.build_id else "no build-id")
    if f.version and f.version not in base:
        facts.append(f.version)
    tail = " (%s)" % ", ".join(facts) if facts else ""
    return "%sfrom %s%s" % ("" if base == name else base + " ", d or "/", tail)


def _loaded(files: Optional[Sequence[LibFile]], name: str, pronoun: bool) -> str:
    if not files:
        return "did not load %s" % ("it" if pronoun else name)
    where = " and ".join(_where(f, name) for f in files)
    if all(os.path.basename(f.path) == name for f in files):
        return "loaded %s %s" % ("it" if pronoun else name, where)
    return "loaded %s" % where  # (each file named: libnccl.so.2.21.5 from ...)


def library_line(
    name: str,
    mine: Sequence[Tuple[str, Optional[Sequence[LibFile]]]],
    peers: str,
    peer_files: Optional[Sequence[LibFile]],
) -> str:
    """The verdict's evidence line for one library: ``rank 1 loaded libhtprobe.so from /a/lib
    (build-id 3f2a…) where ranks 0, 2–3 loaded it from /b/lib (build-id 9c1e…)``.

    ``mine``: (who, files) of each culprit group ("rank 1"; files None or empty: not
    loaded); ``peers``: who the peers are ("ranks 0, 2–3"); ``peer_files``: theirs."""
    parts = []
    for i, (who, files) in enumerate(mine):
        parts.append("%s %s" % (who, _loaded(files, name, pronoun=i > 0)))
    return "%s where %s %s" % (", ".join(parts), peers, _loaded(peer_files, name, pronoun=True))
