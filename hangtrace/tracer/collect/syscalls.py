"""Linux system call tables: number -> name and what each argument is. Data only.

In: a syscall number as ``/proc/PID/task/TID/syscall`` prints it, and the machine
(``platform.machine()``). Out: ``syscall_table(machine)`` -> ``{nr: (name, argument
kinds)}`` for x86_64 and aarch64 (calls a hung thread is seen in only), read by
``kernelwait.py`` to name a blocked thread's call and decode its arguments.
"""

from __future__ import annotations

import platform
from typing import Mapping, Optional, Tuple

#: A blocking call (poll, nanosleep, ...) interrupted by a signal or a debugger's stop - py-spy's
#: ptrace attach is one - resumes as ``restart_syscall``: its own arguments are gone
#: (restart_syscall(2)). :func:`read_syscalls` reads the calls before py-spy stops the process.
RESTART = "restart_syscall"

#: syscall number -> (name, what its arguments are: 'f' fd, 'p' path pointer, 'd' dirfd,
#: 'P' a pollfd array (with the count next), 'w' a pid to wait for, '-' anything else).
#: Numbers from the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl and
#: include/uapi/asm-generic/unistd.h (aarch64); only calls a hung thread is seen in.
_X86_64: Mapping[int, Tuple[str, str]] = {
    0: ("read", "f"),
    1: ("write", "f"),
    2: ("open", "p"),
    3: ("close", "f"),
    4: ("stat", "p"),
    5: ("fstat", "f"),
    6: ("lstat", "p"),
    7: ("poll", "P"),
    16: ("ioctl", "f"),
    17: ("pread64", "f"),
    18: ("pwrite64", "f"),
    19: ("readv", "f"),
    20: ("writev", "f"),
    21: ("access", "p"),
    23: ("select", "-"),
    35: ("nanosleep", "-"),
    40: ("sendfile", "ff"),
    42: ("connect", "f"),
    43: ("accept", "f"),
    44: ("sendto", "f"),
    45: ("recvfrom", "f"),
    46: ("sendmsg", "f"),
    47: ("recvmsg", "f"),
    56: ("clone", "-"),
    57: ("fork", "-"),
    58: ("vfork", "-"),  # a parent caught blocked until its child execs (a loaded machine)
    61: ("wait4", "w"),
    72: ("fcntl", "f"),
    73: ("flock", "f"),
    74: ("fsync", "f"),
    75: ("fdatasync", "f"),
    76: ("truncate", "p"),
    77: ("ftruncate", "f"),
    82: ("rename", "pp"),
    83: ("mkdir", "p"),
    84: ("rmdir", "p"),
    87: ("unlink", "p"),
    89: ("readlink", "p"),
    202: ("futex", "-"),
    230: ("clock_nanosleep", "-"),
    232: ("epoll_wait", "f"),
    247: ("waitid", "-w"),
    257: ("openat", "dp"),
    258: ("mkdirat", "dp"),
    262: ("newfstatat", "dp"),
    263: ("unlinkat", "dp"),
    264: ("renameat", "dpdp"),
    270: ("pselect6", "-"),
    271: ("ppoll", "P"),
    281: ("epoll_pwait", "f"),
    285: ("fallocate", "f"),
    288: ("accept4", "f"),
    299: ("recvmmsg", "f"),
    307: ("sendmmsg", "f"),
    316: ("renameat2", "dpdp"),
    332: ("statx", "dp"),
    437: ("openat2", "dp"),
    435: ("clone3", "-"),
    441: ("epoll_pwait2", "f"),
    219: (RESTART, "-"),
}
_AARCH64: Mapping[int, Tuple[str, str]] = {
    22: ("epoll_pwait", "f"),
    25: ("fcntl", "f"),
    29: ("ioctl", "f"),
    32: ("flock", "f"),
    34: ("mkdirat", "dp"),
    35: ("unlinkat", "dp"),
    38: ("renameat", "dpdp"),
    46: ("ftruncate", "f"),
    47: ("fallocate", "f"),
    56: ("openat", "dp"),
    57: ("close", "f"),
    63: ("read", "f"),
    64: ("write", "f"),
    65: ("readv", "f"),
    66: ("writev", "f"),
    67: ("pread64", "f"),
    68: ("pwrite64", "f"),
    71: ("sendfile", "ff"),
    72: ("pselect6", "-"),
    73: ("ppoll", "P"),
    79: ("newfstatat", "dp"),
    80: ("fstat", "f"),
    82: ("fsync", "f"),
    83: ("fdatasync", "f"),
    95: ("waitid", "-w"),
    98: ("futex", "-"),
    101: ("nanosleep", "-"),
    115: ("clock_nanosleep", "-"),
    202: ("accept", "f"),
    203: ("connect", "f"),
    206: ("sendto", "f"),
    207: ("recvfrom", "f"),
    211: ("sendmsg", "f"),
    212: ("recvmsg", "f"),
    220: ("clone", "-"),
    242: ("accept4", "f"),
    243: ("recvmmsg", "f"),
    260: ("wait4", "w"),
    269: ("sendmmsg", "f"),
    276: ("renameat2", "dpdp"),
    291: ("statx", "dp"),
    435: ("clone3", "-"),
    437: ("openat2", "dp"),
    441: ("epoll_pwait2", "f"),
    128: (RESTART, "-"),
}
_TABLES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def syscall_table(machine: Optional[str] = None) -> Mapping[int, Tuple[str, str]]:
    """This machine's (or ``machine``'s, ``platform.machine()`` spelling) table; empty
    for an architecture not listed (its calls read as ``syscall N``)."""
    return _TABLES.get((machine or platform.machine()).lower(), {})
