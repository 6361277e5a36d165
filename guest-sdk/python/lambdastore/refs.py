"""Typed references to objects, what the Rust SDK generates as
`CounterRef`: `ref(Counter, id).add(2)` is `call(id, "add", [2])`, checked
first against `Counter`'s declaration. A function the type does not have
is an `AttributeError` and arguments its signature does not take a
`TypeError`, before anything reaches the host (in Rust, the compiler
says so); the call itself is an ordinary call, so its failures are the
`CallError`s `call` raises. `new(Counter, 5)` creates an object through
its constructor and returns its reference.

A reference is its object's id wherever an id goes: as an argument, in a
field of the type (`Cell[Counter]`, which refuses a reference to another
type), or to `call`. Its `id` is the id (a method named `id` is reached
with `call`, as in Rust, where `CounterRef::id` is the id too).
"""

import keyword

from .host import call, create

__all__ = ["Ref", "ref", "new"]


class Ref:
    """A reference to object `id` of a `@lambda_object` type; its methods
    are the type's methods."""

    __slots__ = ("_type", "id")

    def __init__(self, object_type, object_id: int):
        spec = getattr(object_type, "__lambda_type__", None)
        if spec is None:
            raise TypeError(f"a reference is to an object of a @lambda_object class, not of {object_type!r}")
        object.__setattr__(self, "_type", spec)
        object.__setattr__(self, "id", int(object_id))

    def __getattr__(self, name):
        function = None if name.startswith("_") else self._type.function(name)
        if function is None or function.kind != "method":
            raise AttributeError(f"{self._type.name} has no method `{name}`")

        def method(*args, **kwargs):
            return call(self.id, name, arguments(self._type.name, function, args, kwargs))

        method.__name__ = method.__qualname__ = f"{self._type.name}.{name}"
        return method

    def __setattr__(self, name, value):
        raise AttributeError("a reference cannot be changed")

    @property
    def __lambda_id__(self) -> int:
        # What JSON text and the fields store: the id (jsontext, schema).
        return self.id

    def __int__(self) -> int:
        return self.id

    __index__ = __int__

    def __eq__(self, other):
        if isinstance(other, Ref):
            return self.id == other.id
        return not isinstance(other, bool) and isinstance(other, int) and self.id == other

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"ref({self._type.name}, {self.id})"


def ref(object_type, object_id: int) -> Ref:
    """The reference to object `object_id`, of `object_type`."""
    return Ref(object_type, object_id)


def new(object_type, *args, **kwargs) -> Ref:
    """Creates an object of `object_type` with its constructor's arguments
    (a type without a constructor takes none); its reference."""
    spec = getattr(object_type, "__lambda_type__", None)
    if spec is None:
        raise TypeError(f"new() takes a @lambda_object class, not {object_type!r}")
    constructor = next((f for f in spec.functions if f.kind == "constructor"), None)
    if constructor is None:
        if args or kwargs:
            raise TypeError(f"{spec.name} has no constructor, so it takes no arguments")
        return Ref(object_type, create(object_type))
    return Ref(object_type, create(object_type, arguments(spec.name, constructor, args, kwargs)))


def arguments(type_name: str, function, args: tuple, kwargs: dict) -> dict:
    """The JSON arguments, by name, of a call of `function` with Python's
    `args` and `kwargs` (`from_=...` for a parameter named `from`)."""
    names = [p.name for p in function.params]
    where = f"{type_name}.{function.name}()"
    if len(args) > len(names):
        raise TypeError(f"{where} takes {len(names)} arguments ({len(args)} given)")
    by_name = dict(zip(names, args))
    for key, value in kwargs.items():
        name = key[:-1] if key.endswith("_") and keyword.iskeyword(key[:-1]) else key
        if name not in names:
            raise TypeError(f"{where} has no parameter `{key}`")
        if name in by_name:
            raise TypeError(f"{where} got `{key}` twice")
        by_name[name] = value
    return by_name
