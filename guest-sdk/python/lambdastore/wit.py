"""The component side: the WIT imports as a host, and the exports built
from an application. Importable only where componentize-py's `wit_world`
bindings are: inside a component, and while it builds one."""

import sys

from componentize_py_types import Err
from wit_world.imports import host, later, types

from . import errors
from . import host as sdk_host
from . import sandbox
from .failures import run_function
from .fields import Field
from .jsontext import dumps, loads

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
    if sys.platform == "wasi":  # not in the bindings' tests
        sandbox.start_call()
    try:
        return app.dispatch(_KIND_NAMES[kind], type_name, function, object_id, args)
    except errors.CallError as e:
        value = e.value if isinstance(e, errors.UnknownObjectError) else errors.wire_text(str(e.value))
        raise Err(_TO_WIT_ERROR[type(e)](value)) from None
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def prepare_snapshot(app):
    """Everything a call needs that never changes, set up once, while the
    snapshot is taken (`App.wit_world()`'s `WitWorld.__init__`)."""
    inside = sys.platform == "wasi"  # not in the bindings' tests: the process's own host, streams and clocks
    if inside:
        sdk_host.install(WitHost())
    warm_up(app)
    if inside:
        sandbox.install()


def warm_up(app):
    """Runs the SDK's own side of a call a few times (not the application's
    functions, which could change what the snapshot holds) while the
    snapshot is taken. CPython rewrites a function's bytecode for the types
    it meets and caches lookups as it runs; every call starts from the
    snapshot, so what is cold there is cold at every call, and warming it
    at every call wrote pages the host copies back after it. Best effort:
    whatever fails here fails the same way in a call, and must not fail the
    build."""
    samples = [0, "", None, True, 1.5, [1, "a"], {"k": [None]}]
    values = [
        v for spec in app.types for v in vars(spec.cls).values() if isinstance(v, Field) and hasattr(v, "_schema")
    ]
    functions = [(spec, f) for spec in app.types for f in spec.functions]
    for _ in range(8):
        for kind in list(_KIND_NAMES):
            _KIND_NAMES[types.FunctionKind(kind.value)]  # as the bindings lift `dispatch`'s kind
        for value in samples:
            loads(dumps(value))
            loads(dumps(value).encode())
        for spec, f in functions:
            spec.function(f.name)
            for args in ("{}", "null"):
                _attempt(f.decode_args, args)
        for field in values:
            _attempt(lambda: field._decode_value(field._encode_value(field._schema.default())))
        run_function(lambda: None)


def _attempt(f, *args):
    try:
        f(*args)
    except Exception:  # noqa: BLE001 -- see warm_up
        pass
