"""The standard library inside a component. componentize-py's `--stub-wasi`
turns every WASI import of the interpreter into a stub that traps: a trap
is a 38000 nobody can read or catch. So what the standard library would
ask WASI for is answered here, once, while the snapshot is taken (every
call starts with it in place):

- what a lambda may have comes from the host: `print` and the standard
  streams go to the lambda log; the clocks read the workflow's clock; the
  random numbers (`random`, `os.urandom`, `secrets`, `uuid.uuid4`) are the
  workflow's draws from the server's cryptographic source. Clock and draws
  are what a run replayed on another node of a Citus cluster reads again.
- what it may not have (files, file descriptors, sockets, sleeping, a
  module the component does not hold) is a Python exception it may catch,
  as in a process without them; uncaught, the function's error (P0001).

Importable only where componentize-py's `wit_world` bindings are."""

import errno
import importlib.machinery
import io
import os
import random
import sys
import time
from types import SimpleNamespace

from wit_world.imports import host, types


def install():
    """Points the standard library at the host, and refuses what the
    sandbox does not give. Called last while the snapshot is taken, so
    that nothing before it (the application's imports included) is
    refused."""
    _use_the_host()
    _refuse_what_the_sandbox_lacks()


# What the host gives ------------------------------------------------------


class _LogStream(io.TextIOBase):
    """`sys.stdout` or `sys.stderr` in a component: each line goes to the
    lambda log at `level`, under the log's limits."""

    def __init__(self, level):
        self.level = level
        self.pending = ""

    def writable(self):
        return True

    def write(self, text):
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            host.log(self.level, line)
        return len(text)

    def flush(self):
        if self.pending:
            host.log(self.level, self.pending)
            self.pending = ""


def now():
    """The workflow's clock, in seconds: it does not move during a call."""
    return host.now_micros() / 1e6


def now_ns():
    return host.now_micros() * 1000


def urandom(size):
    """`os.urandom`: `size` bytes of the workflow's draws."""
    if size < 0:
        raise ValueError("negative argument not allowed")
    words = b"".join(host.random_u64().to_bytes(8, "little") for _ in range((size + 7) // 8))
    return words[:size]


def _use_the_host():
    sys.stdout = sys.__stdout__ = _LogStream(types.LogLevel.INFO)
    sys.stderr = sys.__stderr__ = _LogStream(types.LogLevel.WARNING)
    sys.stdin = sys.__stdin__ = io.StringIO()  # `input()` is EOFError: a lambda has no input
    _use_the_host_clock()
    _use_the_host_draws()


def _use_the_host_clock():
    clocks = ("time", "monotonic", "perf_counter", "process_time", "thread_time")
    for name in clocks:
        setattr(time, name, now)
        setattr(time, name + "_ns", now_ns)
    time.clock_gettime = lambda clock: now()
    time.clock_gettime_ns = lambda clock: now_ns()

    def clock_info(name):
        if name not in clocks:
            raise ValueError("unknown clock")
        return SimpleNamespace(
            implementation="the workflow's clock (lambdastore:lambda/host now-micros)",
            monotonic=False,
            adjustable=False,
            resolution=1e-06,
        )

    time.get_clock_info = clock_info
    # Without a time, these ask C's clock, which is WASI's.
    gmtime, localtime, ctime, asctime, strftime = time.gmtime, time.localtime, time.ctime, time.asctime, time.strftime
    time.gmtime = lambda secs=None: gmtime(now() if secs is None else secs)
    time.localtime = lambda secs=None: localtime(now() if secs is None else secs)
    time.ctime = lambda secs=None: ctime(now() if secs is None else secs)
    time.asctime = lambda t=None: asctime(localtime(now()) if t is None else t)
    time.strftime = lambda format, t=None: strftime(format, localtime(now()) if t is None else t)
    time.sleep = _sleep
    # A lambda's process times: none of its own, and the workflow's clock.
    os.times = lambda: os.times_result((0.0, 0.0, 0.0, 0.0, now()))


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if seconds:
        raise PermissionError(
            "a lambda may not sleep: its call holds its transaction open, and its clock does not move; "
            "schedule later work with spawn_at or a timer"
        )


def _use_the_host_draws():
    # `random.seed()` and `random.Random()` seed from the operating
    # system's random source in C; `SystemRandom` (and so `secrets`) draws
    # from `random._urandom`, bound when `random` was imported.
    os.urandom = random._urandom = urandom
    seed = random.Random.seed

    def seed_from_the_host(self, a=None, version=2):
        seed(self, int.from_bytes(urandom(32)) if a is None else a, version)

    random.Random.seed = seed_from_the_host
    random.seed = random._inst.seed  # the module's function, bound to the old method


# What the sandbox does not give -------------------------------------------


class _NotInTheComponent:
    """The last finder of `sys.meta_path` at run time, in place of the
    path finder: a module the snapshot does not hold is one the component
    does not have (the path finder would stat the build's directories)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        raise ModuleNotFoundError(
            f"No module named {name!r} in this component: a lambda imports at run time only what its "
            "modules imported when the component was built (import it at the top of app.py)",
            name=name,
        )


def _no_files(path=".", *args, **kwargs):
    # No errno: WASI numbers them its own way (its EACCES is 2).
    raise PermissionError(f"a lambda has no files: {path!r}")


def _no_descriptors(*args, **kwargs):
    raise OSError(errno.EBADF, "a lambda has no file descriptors")


# `os` functions that take a path, and those that take a descriptor: with
# no audit event for most of them, each would reach a stub.
_PATH_FUNCTIONS = (
    "access chdir chmod chown chroot lchmod lchown link listdir lstat mkdir mkfifo mknod open readlink remove "
    "rename replace rmdir scandir stat statvfs symlink truncate unlink utime"
).split()
_DESCRIPTOR_FUNCTIONS = (
    "close closerange device_encoding dup dup2 fchdir fchmod fchown fdatasync fpathconf fstat fstatvfs fsync "
    "ftruncate get_blocking get_inheritable lseek posix_fadvise posix_fallocate pread preadv pwrite pwritev read "
    "readv sendfile set_blocking set_inheritable ttyname write writev"
).split()

# Audit events (sys.audit) asking for what the sandbox does not give: the
# ways in that do not go through `os`'s functions (`open`, `io.open`).
_NO_FILES = frozenset({"open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rename", "os.rmdir"})
_NO_NETWORK = frozenset({"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo"})


def _refuse(event, args):
    if event in _NO_FILES:
        _no_files(args[0] if args else "")
    if event in _NO_NETWORK:
        raise PermissionError("a lambda has no network")


def _refuse_what_the_sandbox_lacks():
    sys.meta_path[:] = [f for f in sys.meta_path if f is not importlib.machinery.PathFinder]
    sys.meta_path.append(_NotInTheComponent)
    # `posix` too: importlib's loaders call it directly (`linecache`, for
    # a traceback's source lines).
    for module in {os, sys.modules.get("posix", os)}:
        for name in _PATH_FUNCTIONS:
            if hasattr(module, name):
                setattr(module, name, _no_files)
        for name in _DESCRIPTOR_FUNCTIONS:
            if hasattr(module, name):
                setattr(module, name, _no_descriptors)
        module.isatty = lambda fd: False
    sys.addaudithook(_refuse)
