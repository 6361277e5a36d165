"""The component side: the WIT imports as a host, and the exports built
from an application. Importable only where componentize-py's `wit_world`
bindings are: inside a component, and while it builds one."""

import io
import random
import sys
import time

from componentize_py_types import Err
from wit_world.imports import host, later, types

from . import errors

_TO_WIT_ERROR = {
    errors.ApplicationError: types.CallError_Application,
    errors.BadArgumentsError: types.CallError_BadArguments,
    errors.UnknownObjectError: types.CallError_UnknownObject,
    errors.UnknownFunctionError: types.CallError_UnknownFunction,
    errors.NotAllowedError: types.CallError_NotAllowed,
}
_FROM_WIT_ERROR = {wit: sdk for sdk, wit in _TO_WIT_ERROR.items()}

_LOG_LEVELS = {
    "debug": types.LogLevel.DEBUG,
    "info": types.LogLevel.INFO,
    "notice": types.LogLevel.NOTICE,
    "warning": types.LogLevel.WARNING,
}
_FIELD_KINDS = {
    "cell": types.FieldKind.CELL,
    "map": types.FieldKind.MAP,
    "multi-map": types.FieldKind.MULTI_MAP,
    "set": types.FieldKind.SET,
}
_FUNCTION_KINDS = {
    "constructor": types.FunctionKind.CONSTRUCTOR,
    "method": types.FunctionKind.METHOD,
    "static": types.FunctionKind.STATIC,
}
_KIND_NAMES = {wit: name for name, wit in _FUNCTION_KINDS.items()}


def from_wit_error(error) -> errors.CallError:
    return _FROM_WIT_ERROR[type(error)](error.value)


def _checked(f, *args):
    """Calls an import whose WIT result is `result<_, call-error>`: its
    error is raised as `Err(call-error)`, which becomes the SDK's class."""
    try:
        return f(*args)
    except Err as e:
        raise from_wit_error(e.value) from None


class WitHost:
    """The `host` and `later` imports, with SDK types at the boundary."""

    def self_id(self):
        return host.self_id()

    def get(self, field, key):
        return host.get(field, key)

    def put(self, field, key, value):
        host.put(field, key, value)

    def delete(self, field, key):
        return host.delete(field, key)

    def scan(self, field, start, end, limit, backward):
        direction = types.Direction.BACKWARD if backward else types.Direction.FORWARD
        return [(e.key, e.value) for e in host.scan(field, start, end, limit, direction)]

    def call(self, target, function, args):
        return _checked(host.call, target, function, args)

    def map_call(self, targets, function, args):
        outcomes = []
        for target, outcome in host.map_call(targets, function, args):
            value = outcome.value
            outcomes.append((target, from_wit_error(value) if isinstance(outcome, Err) else value))
        return outcomes

    def create(self, type_name, args):
        return _checked(host.create, type_name, args)

    def call_static(self, type_name, function, args):
        return _checked(host.call_static, type_name, function, args)

    def spawn(self, target, function, args):
        _checked(host.spawn, target, function, args)

    def spawn_at(self, target, function, args, at_micros):
        _checked(later.spawn_at, target, function, args, at_micros)

    def set_timer(self, name, at_micros, function, args):
        _checked(later.set_timer, name, at_micros, function, args)

    def clear_timer(self, name):
        _checked(later.clear_timer, name)

    def now_micros(self):
        return host.now_micros()

    def random_u64(self):
        return host.random_u64()

    def log(self, level, message):
        host.log(_LOG_LEVELS[level], message)


def describe(app) -> "types.AppDesc":
    """The `describe` export of `app`."""
    desc = app.describe()
    return types.AppDesc(
        sdk=desc.sdk,
        types=[
            types.TypeDesc(
                name=t.name,
                fields=[types.FieldDesc(name=f.name, kind=_FIELD_KINDS[f.kind]) for f in t.fields],
                functions=[
                    types.FunctionDesc(
                        name=f.name, kind=_FUNCTION_KINDS[f.kind], protected=f.protected, readonly=f.readonly
                    )
                    for f in t.functions
                ],
            )
            for t in desc.types
        ],
    )


def dispatch(app, kind, type_name, function, object_id, args) -> str:
    """The `dispatch` export of `app`: a failure is raised as `Err(call-error)`,
    which componentize-py returns as the WIT result's error."""
    if sys.platform == "wasi":  # in a component (not in the bindings' tests)
        _use_the_host()
    try:
        return app.dispatch(_KIND_NAMES[kind], type_name, function, object_id, args)
    except errors.CallError as e:
        raise Err(_TO_WIT_ERROR[type(e)](e.value)) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class _LogStream(io.TextIOBase):
    """`sys.stdout` or `sys.stderr` in a component: each line goes to the
    lambda log at `level`, under the log's limits (the component's WASI
    streams are stubs)."""

    def __init__(self, level):
        self.level = _LOG_LEVELS[level]
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


def _now():
    return host.now_micros() / 1e6


def _now_ns():
    return host.now_micros() * 1000


def _use_the_host():
    """Points what the standard library would ask WASI for at the host, for
    this call: the component's WASI imports are stubs that trap, and the
    host's clock and random numbers are the workflow's, which a run replayed
    on another node of a Citus cluster draws again. `print` writes to the
    lambda log; `time.time()` and the monotonic clocks read the host's
    clock; `random` is seeded from the host (or every call would draw the
    numbers of the interpreter snapshot taken at build time)."""
    sys.stdout = _LogStream("info")
    sys.stderr = _LogStream("warning")
    time.time = time.monotonic = time.perf_counter = _now
    time.time_ns = time.monotonic_ns = time.perf_counter_ns = _now_ns
    random.seed(host.random_u64())
