"""The standard library as a lambda sees it. Inside a component,
componentize-py's `--stub-wasi` has turned every WASI import of the
interpreter into a stub that traps: a trap is a 38000 nobody can read or
catch. So what the standard library would ask WASI for is answered here:

- what a lambda may have comes from the host: `print` and the standard
  streams go to the lambda log; the clocks read the workflow's clock; the
  random numbers (`random`, `os.urandom`, `secrets`, `uuid.uuid4`) are the
  workflow's draws, from the server's cryptographic source. Clock and draws
  are what a run replayed on another node of a Citus cluster reads again.
- what it may not have (files, file descriptors, sockets, sleeping, a
  module the component does not hold) is a Python exception it may catch,
  as in a process without them; uncaught, the function's error (P0001).

A component installs it once, while its snapshot is taken, so every call
starts with it in place (`install`); the mock applies it for the length of
each workflow (`applied`), so a test sees what the server would do."""

import errno
import gc
import importlib.machinery
import io
import os
import random
import sys
import time
from contextlib import contextmanager
from types import SimpleNamespace

from . import host as sdk_host
from .errors import wire_text


def install():
    """Inside a component, for good: the last step of its snapshot, so
    that nothing before it (the application's imports included) is
    refused. `posix` too: importlib's loaders call it directly (`linecache`,
    for a traceback's source lines); and the path finder goes, as it would
    stat the build's directories."""
    global _refusing, seed_each_call
    for target, name, value in _replacements(sys.modules.get("posix")):
        setattr(target, name, value)
    seed_each_call = not _seed_at_first_draw()
    sys.meta_path[:] = [f for f in sys.meta_path if f is not importlib.machinery.PathFinder]
    sys.meta_path.append(_NotInTheComponent)
    _refusing = True
    sys.addaudithook(_refuse)


def start_call():
    """At a call's start inside a component (see `_seed_at_first_draw`)."""
    if seed_each_call:
        random.seed(sdk_host.current().random_u64())


@contextmanager
def applied():
    """For the mock: the same, in this process, for the length of one
    workflow, then put back. Modules are not checked (the process has
    them), nor what `posix` is asked directly; `random`'s module functions
    are seeded from the mock's draws at a workflow's first draw, and the
    process's generator is as it was afterwards."""
    global _refusing
    replacements = _replacements(None)
    saved = [(target, name, getattr(target, name)) for target, name, _ in replacements]
    state = random.getstate()
    for target, name, value in replacements:
        setattr(target, name, value)
    generator, methods, namespace = _random_functions()
    _seeding_wrappers(generator, methods, namespace)
    _refusing = True
    if not _hooked:
        _hook_for_the_mock()
    try:
        yield
    finally:
        _refusing = False
        namespace.update(methods)
        for target, name, value in reversed(saved):
            setattr(target, name, value)
        random.setstate(state)


# What the host gives ------------------------------------------------------


class _LogStream(io.TextIOBase):
    """`sys.stdout` or `sys.stderr` of a lambda: each line goes to the
    lambda log at `level`, under the log's limits."""

    def __init__(self, level):
        self.level = level
        self.pending = ""

    def writable(self):
        return True

    def write(self, text):
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            sdk_host.current().log(self.level, wire_text(line))
        return len(text)

    def flush(self):
        if self.pending:
            sdk_host.current().log(self.level, wire_text(self.pending))
            self.pending = ""


def now():
    """The workflow's clock, in seconds: it does not move during a call."""
    return sdk_host.current().now_micros() / 1e6


def now_ns():
    return sdk_host.current().now_micros() * 1000


def urandom(size):
    """`os.urandom`: `size` bytes of the workflow's draws."""
    if size < 0:
        raise ValueError("negative argument not allowed")
    draw = sdk_host.current().random_u64
    return b"".join(draw().to_bytes(8, "little") for _ in range((size + 7) // 8))[:size]


_CLOCKS = ("time", "monotonic", "perf_counter", "process_time", "thread_time")


def _clock_info(name):
    if name not in _CLOCKS:
        raise ValueError("unknown clock")
    return SimpleNamespace(
        implementation="the workflow's clock (lambdastore:lambda/host now-micros)",
        monotonic=False,
        adjustable=False,
        resolution=1e-06,
    )


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    if seconds:
        raise PermissionError(
            "a lambda may not sleep: its call holds its transaction open, and its clock does not move; "
            "schedule later work with spawn_at or a timer"
        )


def _replacements(posix):
    """(namespace, name, value) for each thing replaced, `posix`'s too if given."""
    stdout, stderr = _LogStream("info"), _LogStream("warning")
    r = [(sys, "stdout", stdout), (sys, "__stdout__", stdout), (sys, "stderr", stderr), (sys, "__stderr__", stderr)]
    stdin = io.StringIO()  # `input()` is EOFError: a lambda has no input
    r += [(sys, "stdin", stdin), (sys, "__stdin__", stdin)]
    r += [(time, name, now) for name in _CLOCKS if hasattr(time, name)]
    r += [(time, name + "_ns", now_ns) for name in _CLOCKS if hasattr(time, name + "_ns")]
    # Without a time, these ask C's clock, which is WASI's.
    gmtime, localtime, ctime, asctime, strftime = time.gmtime, time.localtime, time.ctime, time.asctime, time.strftime
    r += [
        (time, "clock_gettime", lambda clock: now()),
        (time, "clock_gettime_ns", lambda clock: now_ns()),
        (time, "get_clock_info", _clock_info),
        (time, "gmtime", lambda secs=None: gmtime(now() if secs is None else secs)),
        (time, "localtime", lambda secs=None: localtime(now() if secs is None else secs)),
        (time, "ctime", lambda secs=None: ctime(now() if secs is None else secs)),
        (time, "asctime", lambda t=None: asctime(localtime(now()) if t is None else t)),
        (time, "strftime", lambda format, t=None: strftime(format, localtime(now()) if t is None else t)),
        (time, "sleep", _sleep),
        # A lambda's process times: none of its own, and the workflow's clock.
        (os, "times", lambda: os.times_result((0.0, 0.0, 0.0, 0.0, now()))),
    ]
    # `random.seed()` and `random.Random()` seed from the operating
    # system's random source in C; `SystemRandom` (and so `secrets`) draws
    # from `random._urandom`, bound when `random` was imported.
    seed = random.Random.seed

    def seed_from_the_host(self, a=None, version=2):
        seed(self, int.from_bytes(urandom(32)) if a is None else a, version)

    r += [(os, "urandom", urandom), (random, "_urandom", urandom), (random.Random, "seed", seed_from_the_host)]
    r += [(random, "seed", seed_from_the_host.__get__(random._inst))]  # the module's, bound to the old method
    for module in [os] + ([posix] if posix is not None else []):
        r += [(module, name, _no_files) for name in _PATH_FUNCTIONS if hasattr(module, name)]
        r += [(module, name, _no_descriptors) for name in _DESCRIPTOR_FUNCTIONS if hasattr(module, name)]
        r += [(module, "isatty", lambda fd: False)]
    return r


# `random`'s generator: seeded from the host ---------------------------------

# Whether `start_call` seeds `random`'s generator (see `_seed_at_first_draw`).
seed_each_call = True


def _seed_at_first_draw():
    """Makes `random`'s module functions (bound methods of its hidden
    generator) seed the generator from the host at their first use in a
    call, so a call that draws nothing does not pay the seeding (about 10 µs
    in the interpreter); the flag is in the snapshot's memory, down again at
    every call's start. Only where nothing but the `random` module holds the
    generator or those methods: a name bound with `from random import ...`
    would bypass the wrappers and draw the snapshot's numbers at every call,
    so then `start_call` seeds the generator itself at every call (False)."""
    generator, methods, namespace = _random_functions()
    if held_elsewhere(generator, methods, namespace):
        return False
    _seeding_wrappers(generator, methods, namespace)
    return True


def _random_functions():
    """`random`'s hidden generator, its module functions by name, and the
    module's namespace."""
    generator = random._inst
    namespace = vars(random)
    methods = {}
    for name, value in namespace.items():
        if getattr(value, "__self__", None) is generator:
            methods[name] = value
    return generator, methods, namespace


def _seeding_wrappers(generator, methods, namespace):
    # Apart from `_seed_at_first_draw`: the closures' cells refer to the
    # generator, which `held_elsewhere` would count.
    seeded = [False]

    def seeding_first(method):
        def draw(*args, **kwargs):
            if not seeded[0]:
                seeded[0] = True
                generator.seed(sdk_host.current().random_u64())
                namespace.update(methods)  # the rest of the call goes straight to the generator
            return method(*args, **kwargs)

        return draw

    for name, method in methods.items():
        namespace[name] = seeding_first(method)


def held_elsewhere(generator, methods, namespace) -> bool:
    """Whether any object but `namespace` (and the methods themselves) refers
    to `generator` or one of `methods`, as far as the garbage collector can
    see: a module's global, a class attribute, a closure, a default. Errs
    towards True (a temporary reference counts too)."""
    # A tuple, passed on as the call's own arguments: CPython 3.14 (the
    # components') tracks the arguments of `get_referrers`, so the search
    # finds them. Once it did, as a tuple made from a list, and every
    # application was seeded at every call.
    targets = (generator, *methods.values())
    own = {id(namespace), id(methods), id(targets)}
    own.update(id(m) for m in methods.values())
    for referrer in gc.get_referrers(*targets):
        if id(referrer) not in own:
            return True
    return False


# What the sandbox does not give -------------------------------------------


class _NotInTheComponent:
    """The last finder of `sys.meta_path` at run time, in place of the
    path finder: a module the snapshot does not hold is one the component
    does not have."""

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

# Whether the audit hook refuses: always inside a component, during a
# workflow in the mock (a hook cannot be removed).
_refusing = False
_hooked = False


def _refuse(event, args):
    if not _refusing:
        return
    if event in _NO_FILES:
        _no_files(args[0] if args else "")
    if event in _NO_NETWORK:
        raise PermissionError("a lambda has no network")


def _hook_for_the_mock():
    global _hooked
    _hooked = True
    sys.addaudithook(_refuse)
