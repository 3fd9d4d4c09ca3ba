"""The test runner's jail and the privileges it gives up (runner.py imports this file from beside it
before its own folder leaves sys.path; like runner.py it uses the standard library only).

`enter_jail` builds the file system the tests see and drops every privilege over it;
`limit_processes` caps how many processes the tests may start; `block_network` makes ordinary
network calls fail clearly; `undumpable` keeps the runner out of reach of the tests' processes
(no ptrace, no /proc/PID/mem); `die_with` ends a test's process with the runner.
"""

import ctypes
import os
import resource
import shutil
import signal
import socket

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 1 << 14, 1 << 18
# A read-only remount must keep the flags the mount already has: in a user namespace the kernel
# refuses to clear them (statvfs flag -> mount flag).
KEPT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: 1 << 10,
    os.ST_NODIRATIME: 1 << 11,
    os.ST_RELATIME: 1 << 21,
}
CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1
DEVICES = ("null", "zero", "random", "urandom")
libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """OSError naming `what` and errno's message when a libc call returned nonzero."""
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    def c_string(text):
        return None if text is None else text.encode()

    result = libc.mount(c_string(source), c_string(target), c_string(fstype), flags, c_string(data))
    check(result, f"mount {target}")


def enter_jail(root: str, work: str, read_only: list[str]) -> None:
    """Make `root` (an empty folder) this process's whole file system and drop every privilege.

    Runs as root of the fresh user, mount, PID, network, IPC and UTS namespaces `unshare` made:
      /usr, /lib*, /bin, /sbin, Python's prefix   read-only binds (`read_only`; a symlink copied)
      /work                                       the task's copy (`work`), on a 64 MB tmpfs
      /tmp                                        a fresh 64 MB tmpfs
      /dev/{null,zero,random,urandom}, /proc      the devices, and this PID namespace's processes
    then / itself is remounted read-only and the process enters a user namespace of its own, where it
    holds no capability over the mounts, network and processes above (CLONE_NEWUSER: the uid it shows
    is the overflow uid; the kernel still checks files against the user who started the sandbox).
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates back out
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in read_only:
        target = root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(path):  # Debian's /bin -> usr/bin
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, exist_ok=True)
        _mount(path, target, None, MS_BIND | MS_REC)
        kept = sum(flag for st, flag in KEPT_FLAGS.items() if os.statvfs(path).f_flag & st)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)
    os.makedirs(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/work")  # a copy on a tmpfs of its own: the tests cannot fill the disk
    _mount("tmpfs", root + "/work", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0755")
    shutil.copytree(work, root + "/work", symlinks=True, dirs_exist_ok=True)
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    os.makedirs(root + "/proc")
    try:  # some container runtimes forbid a new proc mount; the tests rarely need /proc
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    os.chdir(root)
    _mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/work")
    check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")


def limit_processes(count: int | None) -> None:
    """RLIMIT_NPROC in the jail: counted in its own user namespace, so the user's processes
    elsewhere do not count; root is exempt (sandbox.py's watchdog is not)."""
    if not count:
        return
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    count = count if hard == resource.RLIM_INFINITY else min(count, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (count, count))


def block_network() -> None:
    """A clear error for ordinary network calls (in the jail the network namespace is empty anyway;
    without it this is all there is, and `_socket`, ctypes or a subprocess get past it)."""

    def no_network(*args, **kwargs):
        raise OSError("network disabled in the sandbox")

    socket.socket.connect = socket.socket.connect_ex = socket.socket.sendto = no_network
    socket.create_connection = socket.getaddrinfo = no_network


def undumpable() -> None:
    """PR_SET_DUMPABLE 0: the tests' processes, forked from this one, cannot ptrace it or read its
    memory through /proc."""
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def die_with(parent: int) -> None:
    """In a test's forked process: SIGKILL when the runner (`parent`, its PID) ends, so a test does
    not outlive a killed trainer (PR_SET_PDEATHSIG, Linux; the signal follows the thread that
    forked, the runner's only one), and at once when the runner ended before the call took hold."""
    prctl = getattr(libc, "prctl", None)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
