"""Python type hints as the Rust SDK's types: what a parameter, a stored
value or a key may hold, checked with serde's error messages.

Python has one `int`; Rust keys and values have a width. `int` means `i64`
(an object id's type); `I8`..`I64` and `U8`..`U64` name the others:
`Map[U32, str]`, `def add(self, n: I32)`. They are `int` subclasses, so
`U8(7)` is also a value.

A dataclass is a struct: a JSON object of its fields, as serde writes one.
A `@lambda_object` class is a reference: the object's id. Object types of
an application refer to each other, so while one is declared a name not
defined yet stands for an object type declared later (`App` checks it is
one of its types), as Rust's `ThreadRef` may be used before `Thread`.
"""

import builtins
import dataclasses
import sys
import types
import typing
from contextlib import contextmanager

from .jsontext import describe_value


class I8(int):
    """A signed 8-bit integer (Rust `i8`)."""
    BITS, SIGNED = 8, True


class I16(int):
    """A signed 16-bit integer (Rust `i16`)."""
    BITS, SIGNED = 16, True


class I32(int):
    """A signed 32-bit integer (Rust `i32`)."""
    BITS, SIGNED = 32, True


class I64(int):
    """A signed 64-bit integer (Rust `i64`); plain `int` means the same."""
    BITS, SIGNED = 64, True


class U8(int):
    """An unsigned 8-bit integer (Rust `u8`)."""
    BITS, SIGNED = 8, False


class U16(int):
    """An unsigned 16-bit integer (Rust `u16`)."""
    BITS, SIGNED = 16, False


class U32(int):
    """An unsigned 32-bit integer (Rust `u32`)."""
    BITS, SIGNED = 32, False


class U64(int):
    """An unsigned 64-bit integer (Rust `u64`)."""
    BITS, SIGNED = 64, False


INT_TYPES = (I8, I16, I32, I64, U8, U16, U32, U64)


class Mismatch(ValueError):
    """A JSON value that does not fit a type; the message is serde's."""


def _invalid_type(value, expected):
    return Mismatch(f"invalid type: {describe_value(value)}, expected {expected}")


class Schema:
    """A type: `check` turns a decoded JSON value into the Python value."""

    expected = "any value"

    def check(self, value):
        return value

    def default(self):
        raise TypeError(f"{self.expected} has no default value")


class AnySchema(Schema):
    """No annotation, `Any` or `object`: any JSON value, as decoded."""

    def default(self):
        return None


class IntSchema(Schema):
    def __init__(self, bits, signed):
        self.bits, self.signed = bits, signed
        self.expected = f"{'i' if signed else 'u'}{bits}"
        self.low = -(1 << (bits - 1)) if signed else 0
        self.high = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid_type(value, self.expected)
        if not self.low <= value <= self.high:
            raise Mismatch(f"invalid value: integer `{value}`, expected {self.expected}")
        return int(value)

    def default(self):
        return 0


class RefSchema(IntSchema):
    """A reference to an object of a `@lambda_object` type: its `i64` id."""

    def __init__(self, type_name):
        super().__init__(64, True)
        self.type_name = type_name

    def check(self, value):
        # A typed reference (refs.py) of this type is its id.
        if hasattr(value, "__lambda_id__"):
            if value._type.name != self.type_name:
                raise Mismatch(f"a reference to a {value._type.name}, expected a {self.type_name}")
            value = value.__lambda_id__
        return super().check(value)

    def default(self):
        raise TypeError(f"a reference to a {self.type_name} has no default value")


class FloatSchema(Schema):
    expected = "f64"

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid_type(value, self.expected)
        return float(value)

    def default(self):
        return 0.0


class BoolSchema(Schema):
    expected = "a boolean"

    def check(self, value):
        if not isinstance(value, bool):
            raise _invalid_type(value, self.expected)
        return value

    def default(self):
        return False


class StrSchema(Schema):
    expected = "a string"

    def check(self, value):
        if not isinstance(value, str):
            raise _invalid_type(value, self.expected)
        return value

    def default(self):
        return ""


class BytesSchema(Schema):
    """`bytes`: Rust's `Vec<u8>`, a JSON array of numbers."""

    expected = "a sequence"
    _byte = IntSchema(8, False)

    def check(self, value):
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        if not isinstance(value, (list, tuple)):
            raise _invalid_type(value, self.expected)
        return bytes(self._byte.check(b) for b in value)

    def default(self):
        return b""


class OptionalSchema(Schema):
    def __init__(self, inner):
        self.inner = inner
        self.expected = "option"

    def check(self, value):
        return None if value is None else self.inner.check(value)

    def default(self):
        return None


class ListSchema(Schema):
    expected = "a sequence"

    def __init__(self, item):
        self.item = item

    def check(self, value):
        if not isinstance(value, (list, tuple)):
            raise _invalid_type(value, self.expected)
        return [self.item.check(v) for v in value]

    def default(self):
        return []


class TupleSchema(Schema):
    def __init__(self, items):
        self.items = items
        self.expected = f"a tuple of size {len(items)}"

    def check(self, value):
        if not isinstance(value, (list, tuple)):
            raise _invalid_type(value, self.expected)
        if len(value) < len(self.items):
            raise Mismatch(f"invalid length {len(value)}, expected {self.expected}")
        if len(value) > len(self.items):
            raise Mismatch(f"invalid length {len(value)}, expected fewer elements in array")
        return tuple(s.check(v) for s, v in zip(self.items, value))

    def default(self):
        return tuple(s.default() for s in self.items)


class DictSchema(Schema):
    """`dict[str, V]`: a JSON object."""

    expected = "a map"

    def __init__(self, value):
        self.value = value

    def check(self, value):
        if not isinstance(value, dict):
            raise _invalid_type(value, self.expected)
        return {k: self.value.check(v) for k, v in value.items()}

    def default(self):
        return {}


class StructSchema(Schema):
    """A dataclass, as serde (de)serializes a struct: a JSON object of its
    fields in declaration order, or an array of them by position; unknown
    fields are ignored, a missing `Optional` one is None."""

    def __init__(self, cls):
        self.cls = cls
        self.expected = f"struct {cls.__name__}"
        self.fields = []

    def _resolve(self):
        module = sys.modules[self.cls.__module__].__dict__
        local = {self.cls.__name__: self.cls}
        for f in dataclasses.fields(self.cls):
            if f.init:
                self.fields.append((f.name, schema(resolve(f.type, module, local)), _has_default(f)))

    def check(self, value):
        if isinstance(value, dict):
            values = {}
            for name, field_schema, has_default in self.fields:
                if name in value:
                    values[name] = field_schema.check(value[name])
                elif isinstance(field_schema, OptionalSchema):
                    values[name] = None
                elif not has_default:
                    raise Mismatch(f"missing field `{name}`")
            return self.cls(**values)
        if isinstance(value, (list, tuple)):
            n = len(self.fields)
            if len(value) < n:
                raise Mismatch(f"invalid length {len(value)}, expected {self.expected} with {n} elements")
            if len(value) > n:
                raise Mismatch(f"invalid length {len(value)}, expected fewer elements in array")
            return self.cls(**{name: s.check(v) for (name, s, _), v in zip(self.fields, value)})
        raise _invalid_type(value, self.expected)

    def default(self):
        try:
            return self.cls()
        except TypeError:
            raise TypeError(f"{self.expected} has no default value: give each of its fields one") from None


def _has_default(f) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


#: The struct schemas being built, so a dataclass may contain itself (`list[Node]`).
_structs = {}


def _struct(cls) -> StructSchema:
    if cls in _structs:
        return _structs[cls]
    built = _structs[cls] = StructSchema(cls)
    try:
        built._resolve()
    finally:
        del _structs[cls]
    return built


_SIMPLE = {bool: BoolSchema, float: FloatSchema, str: StrSchema, bytes: BytesSchema}


def is_lambda_object(hint) -> bool:
    return isinstance(hint, type) and hasattr(hint, "__lambda_type__")


def is_reference(hint) -> bool:
    """Whether `hint` stands for an object type: a `@lambda_object` class or
    a name used before its declaration."""
    return is_lambda_object(hint) or forward_name(hint) is not None


def forward_name(hint):
    """The name `hint` stands in for, if it is an object type declared later."""
    return hint.__dict__.get("__lambda_forward__") if isinstance(hint, type) else None


#: While a `@lambda_object` is declared: the names it used before their declaration.
_forwards = None


@contextmanager
def declaring():
    """Collects the names used before their declaration while a
    `@lambda_object` is declared (`App` checks them); outside of it an
    undefined name is a `NameError`, as usual."""
    global _forwards
    outer, _forwards = _forwards, set()
    try:
        yield _forwards
    finally:
        _forwards = outer


class _Names(dict):
    """The local names of an annotation's evaluation. A name that neither
    they nor the module nor the builtins define is, while a
    `@lambda_object` is declared, an object type declared later: a class
    that stands in for it (a class, so `Optional[...]`, `X | None` and
    `list[...]` take it)."""

    def __init__(self, module, local):
        super().__init__(local)
        self.module = module

    def __missing__(self, name):
        if _forwards is None or name in self.module or hasattr(builtins, name):
            raise KeyError(name)  # the usual lookup goes on
        _forwards.add(name)
        return type(name, (), {"__lambda_forward__": name})


def resolve(annotation, module: dict, local=None):
    """The type an annotation names: evaluated if it is text (as `from
    __future__ import annotations` leaves them) in `module`'s namespace
    and `local`."""
    if not isinstance(annotation, str):
        return annotation
    return eval(annotation, module, _Names(module, local or {}))  # noqa: S307


def schema(hint) -> Schema:
    """The schema of type hint `hint`; `TypeError` for hints with no JSON form."""
    if hint is None or hint is typing.Any or hint is object:
        return AnySchema()
    if hint is int:
        return IntSchema(64, True)
    if isinstance(hint, type) and issubclass(hint, INT_TYPES):
        return IntSchema(hint.BITS, hint.SIGNED)
    if hint in _SIMPLE:
        return _SIMPLE[hint]()
    if is_lambda_object(hint):
        return RefSchema(hint.__name__)
    if forward_name(hint) is not None:
        return RefSchema(forward_name(hint))
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _struct(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return OptionalSchema(schema(rest[0]))
    if hint is list or origin is list:
        return ListSchema(schema(args[0]) if args else AnySchema())
    if origin is tuple and args and args[-1] is not Ellipsis:
        return TupleSchema([schema(a) for a in args])
    if origin is tuple:
        return ListSchema(schema(args[0]) if args else AnySchema())
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{hint}: JSON objects have string keys; use dict[str, V]")
        return DictSchema(schema(args[1]) if args else AnySchema())
    raise TypeError(
        f"{hint!r} has no JSON form: use int (or I8..U64), float, bool, str, bytes, "
        "Optional, list, tuple, dict[str, V], a dataclass, a @lambda_object class or Any"
    )
