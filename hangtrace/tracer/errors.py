"""Errors meant for users: each names the thing, carries a remedy and an exit code.

``hangtrace.cli.main`` catches only ``HangtraceError``; anything else is a bug and keeps
its traceback.
"""

from typing import Optional


class HangtraceError(Exception):
    """Base class. ``str(e)`` is the message; ``e.remedy`` what to do; ``e.exit_code``."""

    exit_code = 2
    remedy = ""

    def __init__(self, message: str, remedy: Optional[str] = None) -> None:
        super().__init__(message)
        if remedy is not None:
            self.remedy = remedy

    def render(self) -> str:
        text = "hangtrace: error: %s" % self
        if self.remedy:
            text += "\n  remedy: %s" % self.remedy
        return text


class RingFormatError(HangtraceError):
    """A ring file that cannot be read: truncated, corrupt, foreign or another version."""

    exit_code = 3

    def __init__(self, path: str, problem: str, remedy: Optional[str] = None) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__("%s: %s" % (path, problem), remedy)


class TruncatedRingError(RingFormatError):
    remedy = (
        "the file was cut short (copied while written, disk full, or partial transfer); "
        "copy it again from the run directory, or remove it to analyse the other ranks"
    )


class ForeignFileError(RingFormatError):
    remedy = "this is not a hangtrace ring file; remove it from the run directory"


class UnsupportedVersionError(RingFormatError):
    remedy = (
        "the file was written by another hangtrace version; read it with that version "
        "(pip install hangtrace==<version that wrote it>)"
    )


class CorruptRingError(RingFormatError):
    remedy = "the header is inconsistent; the file was damaged. Remove it to analyse the other ranks"


class UnreadableRunError(HangtraceError):
    """Ring files were found, but none of them could be read."""

    exit_code = 3


class RunDirError(HangtraceError):
    """The run directory or snapshot is missing, empty or unreadable."""

    exit_code = 4


class NoProcessesError(HangtraceError):
    exit_code = 5
