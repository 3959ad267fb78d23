"""The verdict as ``hangtrace run`` prints it on a terminal (pure but for the width, issue 41).

In: the verdict paragraph (``report.paragraph``: one str) and the snapshot's paths. Out:
the console block, lines wrapped to the terminal width:

    ==== hangtrace verdict ====
    <the verdict: who, what, where (user frames first), who waits - wrapped>
    Next: <the advice, wrapped, its later lines indented by 2>
    report:   <snapshot>/report.txt          (every detail: evidence, stacks, ranks)
    timeline: <snapshot>/timeline.json       (when written)
    next:     hangtrace analyze <snapshot>   (or --json)
              hangtrace records <run dir> --last 20

and the one line an incident gets before it (:func:`incident_line`: the first of its
lines, the count of the others; every line in the watcher log). The width is
:func:`console_width`: ``HANGTRACE_COLUMNS``, else the terminal's (``shutil``), 80 when
the stream is not a terminal; never below 40. A word longer than the width (a path) is
never broken.
"""

import os
import shutil
import textwrap
from typing import IO, List, Optional, Sequence

from hangtrace.tracer import config

#: below this many columns lines are wrapped at this width anyway
MIN_WIDTH = 40
#: width of a stream that is not a terminal (a log file, a pipe, CI)
DEFAULT_WIDTH = 80


def console_width(stream: Optional[IO[str]] = None) -> int:
    """Columns for ``stream``: ``HANGTRACE_COLUMNS`` when set to a number, else the
    terminal's width when ``stream`` is a terminal, else 80 (at least ``MIN_WIDTH``)."""
    try:
        forced = int(os.environ.get(config.COLUMNS, "") or 0)
    except ValueError:
        forced = 0
    if forced > 0:
        return max(forced, MIN_WIDTH)
    try:
        tty = stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return DEFAULT_WIDTH
    try:
        cols = os.get_terminal_size(stream.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        cols = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(cols or DEFAULT_WIDTH, MIN_WIDTH)


def _wrap(text: str, width: int, indent: str = "") -> List[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        width=width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [""]


def verdict_lines(paragraph: str, width: int) -> List[str]:
    """The paragraph in; its lines wrapped at ``width`` out: the verdict, then its
    ``Next:`` sentence on a line of its own (later lines indented by 2)."""
    text = " ".join(str(paragraph or "").split())
    body, sep, nxt = text.rpartition(" Next: ")
    if not sep:
        body, nxt = text, ""
    out = _wrap(body, width)
    if nxt:
        out += _wrap("Next: " + nxt, width, "  ")
    return out


def _path_line(label: str, path: str, note: str, width: int) -> List[str]:
    """'label path  (note)', the note on the next line when it does not fit."""
    head = "%-9s %s" % (label, path)
    if not note:
        return [head]
    if len(head) + 2 + len(note) <= width:
        return [head + "  " + note]
    return [head, " " * 10 + note]


def verdict_block(
    paragraph: str,
    snap_path: str,
    run_dir: str,
    width: int,
    timeline: Optional[str] = None,
    title: str = "hangtrace verdict",
) -> str:
    """The whole console block (module docstring): a str with a blank line before and after;
    ``title`` between the '====' (a revised verdict, the node watcher's)."""
    out = ["", "==== %s ====" % title]
    out += verdict_lines(paragraph, width)
    out += _path_line("report:", os.path.join(snap_path, "report.txt"), "", width)
    if timeline:
        out += _path_line("timeline:", timeline, "(hangtrace timeline --open)", width)
    out += _path_line("next:", "hangtrace analyze %s" % snap_path, "(or --json)", width)
    out += [" " * 10 + "hangtrace records %s --last 20" % run_dir, ""]
    return "\n".join(out) + "\n"


def incident_line(kind: str, lines: Sequence[str], width: int) -> str:
    """The one console line of an incident: ``'hangtrace: <kind> detected: <first line> (+N
    more: watcher log); collecting ...'``, the first line clipped to fit ``width`` (or to 84
    characters when that is more: a name cut short tells nothing)."""
    from hangtrace.tracer.report.clip import clip

    more = " (+%d more: watcher log)" % (len(lines) - 1) if len(lines) > 1 else ""
    head, tail = "hangtrace: %s detected: " % kind, "%s; collecting ..." % more
    room = max(width - len(head) - len(tail), 84)  # (a line a little too long beats a cut name)
    return head + clip(lines[0] if lines else "", room) + tail
