"""Write LambdaStore lambdas in Python.

An application is a set of object types: classes marked `@lambda_object`
whose annotations are typed fields (`Cell`, `Map`, `MultiMap`, `Set`) and
whose public functions are its lambda functions. `App(...)` lists the
types; `App.wit_world()` is the component's export for componentize-py,
and `lambdastore.mock.MockHost(app)` runs it in tests.

    from lambdastore import App, Cell, constructor, lambda_object, readonly

    @lambda_object
    class Counter:
        value: Cell[int]

        @constructor
        def new(self, initial: int | None = None):
            self.value.set(initial or 0)

        @readonly
        def get(self) -> int:
            return self.value.get_or_default()

    app = App(Counter)
    WitWorld = app.wit_world()

See guest-sdk/python/README.md for the whole model.
"""

from .application import SDK_VERSION, App
from .errors import (
    ApplicationError,
    BadArgumentsError,
    CallError,
    LambdaError,
    NotAllowedError,
    UnknownFunctionError,
    UnknownObjectError,
)
from .fields import Cell, Map, MultiMap, Set
from .host import (
    Err,
    Ok,
    call,
    call_static,
    clear_timer,
    create,
    log,
    map_call,
    now_micros,
    random_u64,
    self_id,
    set_timer,
    spawn,
    spawn_at,
)
from .objects import constructor, lambda_object, protected, readonly, static, stored_as
from .refs import Ref, new, ref
from .schema import I8, I16, I32, I64, U8, U16, U32, U64

__all__ = [
    "SDK_VERSION", "App",
    "CallError", "ApplicationError", "BadArgumentsError", "UnknownObjectError", "UnknownFunctionError",
    "NotAllowedError", "LambdaError",
    "Cell", "Map", "MultiMap", "Set",
    "Ok", "Err", "call", "map_call", "create", "call_static", "spawn", "spawn_at", "set_timer", "clear_timer",
    "self_id", "now_micros", "random_u64", "log",
    "lambda_object", "constructor", "readonly", "protected", "static", "stored_as",
    "Ref", "ref", "new",
    "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64",
]
