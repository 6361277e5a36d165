"""An application: its object types, described and dispatched by name.
`App(...)` is what the component exports (through `App.wit_world()`) and
what the `MockHost` runs in tests."""

from dataclasses import dataclass

from .errors import ApplicationError, HostTrap, UnknownFunctionError, as_call_error
from .failures import run_function
from .jsontext import NON_FINITE, NotJson, dumps

SDK_VERSION = "lambdastore-python 0.1.0"


@dataclass
class AppDesc:
    """What `describe` reports: the SDK and the types (`TypeSpec`s, whose
    fields and functions have `name`, `kind` and, for functions,
    `protected` and `readonly`)."""

    sdk: str
    types: list

    def type_desc(self, name):
        return next((t for t in self.types if t.name == name), None)


class App:
    """The application made of `classes` (each a `@lambda_object`)."""

    def __init__(self, *classes):
        if not classes:
            raise TypeError("an application has at least one object type")
        for cls in classes:
            if not hasattr(cls, "__lambda_type__"):
                raise TypeError(f"{cls!r} is not a @lambda_object class")
        self.types = [cls.__lambda_type__ for cls in classes]
        names = {t.name for t in self.types}
        if len(names) < len(self.types):
            repeated = next(t.name for t in self.types if [u.name for u in self.types].count(t.name) > 1)
            # The server refuses the deploy (42P13): say so at the build.
            raise TypeError(f"two object types of this App are named {repeated!r}")
        for t in self.types:
            unknown = sorted(t.forwards - names)
            if unknown:
                raise TypeError(
                    f"{t.name} names `{unknown[0]}`, which is not defined where {t.name} is declared "
                    "nor an object type of this App"
                )

    def describe(self) -> AppDesc:
        """The application's types and functions, in declaration order."""
        return AppDesc(SDK_VERSION, list(self.types))

    def dispatch(self, kind: str, type_name: str, function: str, object_id: int, args: str) -> str:
        """Runs one function (`kind` is "constructor", "method" or
        "static"): its JSON result, or a `CallError` raised."""
        spec = next((t for t in self.types if t.name == type_name), None)
        if spec is None:
            raise UnknownFunctionError(type_name)
        f = spec.function(function)
        if f is None or f.kind != kind:
            raise UnknownFunctionError(f"{type_name}.{function}")
        return run_function(lambda: _run(spec, f, args))

    def wit_world(self):
        """The class componentize-py exports as the component's world:
        `WitWorld = app.wit_world()` in the module `app`."""
        app = self
        try:
            # Imported now, not at the first call: componentize-py keeps only
            # the modules imported while it initializes the component (the
            # Python files are not in it), so a first import at run time
            # would fail. Without the bindings (pytest), the mock is the host.
            from . import wit
        except ImportError:
            wit = None

        class WitWorld:
            prepared = False

            def __init__(self):
                # componentize-py makes the world's instances while it
                # initializes the component, after the application's modules
                # have run and right before the snapshot is taken: what is
                # set up here is in place at every call.
                if wit is not None and not WitWorld.prepared:
                    WitWorld.prepared = True
                    wit.prepare_snapshot(app)

            def describe(self):
                return wit.describe(app)

            def dispatch(self, kind, type_name, function, object, args):
                return wit.dispatch(app, kind, type_name, function, object, args)

        return WitWorld


def _run(spec, f, args: str) -> str:
    values = f.decode_args(args)
    try:
        # Fields live on the class, so a bare instance is the object.
        result = f.invoke(None if f.kind == "static" else spec.cls.__new__(spec.cls), values)
    except HostTrap:
        raise
    except BaseException as e:
        # Whatever the function let escape fails its call (and only its
        # call): a traceback in a lambda is the application's error.
        # `sys.exit()`, `KeyboardInterrupt` and an application's own
        # `BaseException` too, which trapped the instance.
        raise as_call_error(e) from None
    if f.kind == "constructor":
        return "null"
    try:
        text = dumps(result)
    except NotJson:
        raise ApplicationError(f"cannot encode the result as JSON: {NON_FINITE}") from None
    except (TypeError, ValueError, RecursionError) as e:
        # A circular list, an int of more digits than Python writes.
        raise ApplicationError(f"cannot encode the result as JSON: {e}") from None
    if not text.isascii():
        # A lone surrogate is a str but no UTF-8: the component's return of
        # it trapped.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ApplicationError(f"cannot encode the result as JSON: {e}") from None
    return text
