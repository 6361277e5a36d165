"""Object types: `@lambda_object` on a class whose annotations are typed
fields, and the decorators that give its functions their kind
(`@constructor`, `@static`) and attributes (`@readonly`, `@protected`).

Every public function of the class (its name does not start with `_`) is
a lambda function; a plain one is a writing method. Parameters are
decoded from the JSON arguments by name and by their type hints; a
parameter named like a Python keyword with a trailing underscore (`from_`,
PEP 8) is the keyword's name (`from`), as a Rust one would be.
"""

import inspect
import keyword
import sys
from dataclasses import dataclass
from typing import Optional

from .errors import BadArgumentsError
from .fields import _FieldType
from .jsontext import dumps, loads
from .schema import Mismatch, OptionalSchema, declaring, resolve, schema


def _marked(attribute):
    """A decorator setting `attribute` on a function (or the function inside
    a staticmethod), so the decorators stack in any order."""

    def decorator(f):
        target = f.__func__ if isinstance(f, staticmethod) else f
        setattr(target, attribute, True)
        return f

    return decorator


constructor = _marked("__lambda_constructor__")
constructor.__doc__ = """Marks the constructor (at most one per type): it runs on a new object
right after the host creates it; `create` returns the object's id."""

readonly = _marked("__lambda_readonly__")
readonly.__doc__ = """Promises that the function (and what it calls) does not write; the host
enforces it. Readonly functions are what can later run on replicas."""

protected = _marked("__lambda_protected__")
protected.__doc__ = """Makes the function callable only by lambdas of the same application
(nested calls); clients calling it get `NotAllowedError`."""


class stored_as:
    """Stores a field under another name than its attribute's:
    `name_: Cell[str] = stored_as("name")` is the field `name` of a type
    that also has a function `name`, which Python cannot hold under the
    same attribute (Rust can)."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name or "\0" in name:
            raise TypeError(f"stored_as({name!r}): a field's name is text, not empty, without NUL (the server refuses it)")
        self.name = name

    def __repr__(self):
        return f"stored_as({self.name!r})"


def static(f):
    """Marks a static function: it takes no `self` and runs without an object."""
    if not isinstance(f, staticmethod):
        f = staticmethod(f)
    f.__func__.__lambda_static__ = True
    return f


@dataclass
class Param:
    name: str
    schema: object
    default: object  # inspect.Parameter.empty if none
    #: The Python name of a keyword-only parameter, passed by it.
    keyword: Optional[str] = None


@dataclass
class FunctionSpec:
    name: str
    kind: str  # "constructor", "method" or "static"
    protected: bool
    readonly: bool
    params: list
    function: object

    def invoke(self, instance, values: list):
        """Runs the function on `instance` (None for a static one) with the
        decoded `values`, keyword-only parameters by name."""
        positional = [v for p, v in zip(self.params, values) if p.keyword is None]
        keywords = {p.keyword: v for p, v in zip(self.params, values) if p.keyword is not None}
        if instance is not None:
            positional.insert(0, instance)
        return self.function(*positional, **keywords)

    def decode_args(self, text: str) -> list:
        """The values of the parameters, from JSON `text`: an object by
        name, an array by position, or null (also `{}`, `[]`, empty text)
        when there are none. Messages are the Rust SDK's."""
        names = [p.name for p in self.params]
        if not text.strip():
            given = None
        else:
            try:
                given = loads(text)
            except ValueError as e:
                raise BadArgumentsError(f"arguments are not valid JSON: {e}") from None
        values = [_MISSING] * len(names)
        if isinstance(given, dict):
            for name, value in given.items():
                if name not in names:
                    raise BadArgumentsError(f"unknown parameter `{name}` ({_describe_params(names)})")
                values[names.index(name)] = value
        elif isinstance(given, list):
            if len(given) > len(names):
                raise BadArgumentsError(f"{len(given)} arguments given ({_describe_params(names)})")
            values[: len(given)] = given
        elif given is not None:
            raise BadArgumentsError(
                "arguments must be a JSON object (by name), an array (by position) or null, "
                f"not {dumps(given)}"
            )
        return [_decode_param(p, v) for p, v in zip(self.params, values)]


_MISSING = object()


def _describe_params(names) -> str:
    if not names:
        return "the function takes no parameters"
    return f"parameters: {', '.join(names)}"


def _decode_param(param: Param, value):
    if value is _MISSING:
        # As in Rust, a missing parameter decodes from null, so an Optional
        # one may be left out; a Python default may be left out too.
        if param.default is not inspect.Parameter.empty:
            return param.default
        if isinstance(param.schema, OptionalSchema):
            return None
        raise BadArgumentsError(f"missing parameter `{param.name}`")
    try:
        return param.schema.check(value)
    except Mismatch as e:
        raise BadArgumentsError(f"parameter `{param.name}`: {e}") from None


@dataclass
class FieldSpec:
    name: str
    kind: str


@dataclass
class TypeSpec:
    name: str
    cls: type
    fields: list
    functions: list
    #: Names used before their declaration: object types of the application.
    forwards: frozenset = frozenset()

    def function(self, name):
        return next((f for f in self.functions if f.name == name), None)


def lambda_object(cls):
    """Makes a class an object type: its annotations of `Cell[...]`,
    `Map[...]`, `MultiMap[...]` and `Set[...]` become fields stored under
    their names (or the `stored_as` name they are given), its public
    functions the type's lambda functions. Other object types may be named
    before they are declared (see `lambdastore.schema`)."""
    module = sys.modules[cls.__module__].__dict__
    local = {**vars(cls), cls.__name__: cls}
    fields = []
    # Published before the fields and functions are read, so a field or a
    # parameter of the type itself (a reference to another object of it)
    # is recognized.
    cls.__lambda_type__ = TypeSpec(cls.__name__, cls, fields, [])
    with declaring() as forwards:
        for name, annotation in own_annotations(cls).items():
            annotation = resolve(annotation, module, local)
            if not isinstance(annotation, _FieldType):
                raise TypeError(
                    f"{cls.__name__}.{name}: fields of an object type are Cell[T], Map[K, V], "
                    f"MultiMap[K, V] or Set[K], not {annotation!r}"
                )
            stored = name
            if isinstance(cls.__dict__.get(name), stored_as):
                stored = cls.__dict__[name].name
            elif name in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{name} is both a field and a function (see stored_as)")
            if stored in (f.name for f in fields):
                raise TypeError(f"{cls.__name__}.{name}: another field is stored as `{stored}`")
            field = annotation.bind(stored)
            setattr(cls, name, field)
            fields.append(FieldSpec(stored, field.kind))
        for name, member in cls.__dict__.items():
            if isinstance(member, stored_as):
                raise TypeError(f"{cls.__name__}.{name} = {member!r} has no field type: annotate it (Cell[T], ...)")
        functions = [
            _function_spec(cls, name, member) for name, member in cls.__dict__.items() if _is_lambda(name, member)
        ]
    constructors = [f.name for f in functions if f.kind == "constructor"]
    if len(constructors) > 1:
        raise TypeError(f"{cls.__name__} has constructors {', '.join(constructors)}: a type has at most one")
    cls.__lambda_type__.functions = functions
    cls.__lambda_type__.forwards = forwards
    return cls


def own_annotations(obj) -> dict:
    """The annotations `obj` (a class or a function) declares itself, as
    text where the interpreter would evaluate them (`resolve` evaluates
    them, knowing the application's object types by name). CPython 3.14,
    the components' interpreter, defers them (PEP 649): a class's are no
    longer in its `__dict__`, and evaluating them would fail on a type
    named before its declaration. Every field of a class without `from
    __future__ import annotations` was missing."""
    try:
        import annotationlib
    except ImportError:  # before 3.14: as text with the `__future__` import; a class's in its `__dict__`
        return vars(obj).get("__annotations__", {}) if isinstance(obj, type) else getattr(obj, "__annotations__", {})
    return annotationlib.get_annotations(obj, format=annotationlib.Format.STRING)


def _is_lambda(name, member) -> bool:
    return not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, staticmethod))


def _json_name(name: str) -> str:
    """A parameter's name in the JSON arguments: `from_` is `from`."""
    bare = name[:-1]
    return bare if name.endswith("_") and keyword.iskeyword(bare) else name


def _function_spec(cls, name, member) -> FunctionSpec:
    function = member.__func__ if isinstance(member, staticmethod) else member

    def flag(attribute):
        return getattr(function, attribute, False)

    where = f"{cls.__name__}.{name}"
    if flag("__lambda_static__"):
        kind = "static"
    elif isinstance(member, staticmethod):
        raise TypeError(f"{where}: mark static functions with @static, not @staticmethod")
    else:
        kind = "constructor" if flag("__lambda_constructor__") else "method"
    if kind == "static" and flag("__lambda_constructor__"):
        raise TypeError(f"{where}: a constructor runs on the new object: it cannot be static")
    if kind == "constructor" and flag("__lambda_readonly__"):
        raise TypeError(f"{where}: a constructor writes the new object: it cannot be readonly")
    annotations = own_annotations(function)
    hints = {
        name: resolve(hint, function.__globals__, {cls.__name__: cls})
        for name, hint in annotations.items()
        if name != "return"
    }
    parameters = list(inspect.signature(function).parameters.values())
    if kind != "static":
        if not parameters:
            raise TypeError(f"{where}: a method takes `self` (or mark it @static)")
        parameters = parameters[1:]
    params = []
    for p in parameters:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"{where}: parameters are decoded from JSON by name: no *args or **kwargs")
        try:
            keyword = p.name if p.kind == p.KEYWORD_ONLY else None
            params.append(Param(_json_name(p.name), schema(hints.get(p.name)), p.default, keyword))
        except TypeError as e:
            raise TypeError(f"{where}, parameter `{p.name}`: {e}") from None
    return FunctionSpec(
        name=name,
        kind=kind,
        protected=flag("__lambda_protected__"),
        readonly=flag("__lambda_readonly__"),
        params=params,
        function=function,
    )
