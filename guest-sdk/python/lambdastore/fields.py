"""Typed fields of an object: `Cell[T]`, `Map[K, V]`, `MultiMap[K, V]`, `Set[K]`.

Declare them as class annotations of a `@lambda_object` class. A field holds
only its name: the host knows the object the running function was called
on, so `self.balance.get()` always reads the current object. Values are
stored as JSON (the bytes the Rust SDK writes), keys with the
order-preserving encoding of `lambdastore.keys`.

A stored value or key that does not decode as the field's type (say,
written by an older version of the application) reads as absent and fails
the running call when it returns, so nothing is written on top of it.
"""

from . import host
from .failures import fail_later
from .jsontext import dumps, loads
from .keys import decode_key, encode_key, key_codec, prefix_successor
from .schema import schema

#: The most entries fetched from the host at a time.
PAGE = 128
#: What a decoder returns for an entry it skipped (its failure deferred).
_SKIP = object()
#: A multimap entry's key is the encoded key and 8 random bytes.
SUFFIX_LEN = 8


class Field:
    """A field type; `Cell[int]` and the like are its parameterized forms."""

    kind = ""
    _params = ()

    def __class_getitem__(cls, params):
        params = params if isinstance(params, tuple) else (params,)
        if len(params) != len(cls._params):
            raise TypeError(f"{cls.__name__} takes {len(cls._params)} type parameters: {', '.join(cls._params)}")
        return _FieldType(cls, params)

    def __init__(self, name: str, *type_params):
        self.name = name
        self._bind(*type_params)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"

    def _decode_value(self, raw: bytes):
        """The stored value, or `_SKIP` after deferring the failure."""
        try:
            return self._schema.check(loads(raw))
        except ValueError as e:
            fail_later(f"field `{self.name}`: stored value does not decode as {self._schema.expected}: {e}")
            return _SKIP

    def _encode_value(self, value) -> bytes:
        # Checked on the way in: a value the field's type cannot read back
        # (a float in a Cell[int], an int above I64) fails the call now.
        # Stored as the checked value, as the Rust SDK writes its typed one:
        # `5.0` in a Cell[float], a struct's declared fields in order.
        try:
            if hasattr(value, "__lambda_id__"):
                self._schema.check(value)  # a typed reference: of the field's type
            text = dumps(self._schema.check(loads(dumps(value))))
        except (TypeError, ValueError) as e:
            raise TypeError(f"field `{self.name}`: {e}") from None
        return text.encode("utf-8")

    def _decode_key(self, raw: bytes):
        """The stored key, or `_SKIP` after deferring the failure."""
        try:
            return decode_key(self._keys, raw)
        except ValueError as e:
            fail_later(f"field `{self.name}`: stored key does not decode as {self._keys.name}: {e}")
            return _SKIP


class _FieldType:
    """`Cell[int]`: what a class annotation holds until `@lambda_object`
    binds it to its name."""

    def __init__(self, field_class, params):
        self.field_class, self.params = field_class, params

    def bind(self, name):
        return self.field_class(name, *self.params)

    def __repr__(self):
        return f"{self.field_class.__name__}[{', '.join(map(repr, self.params))}]"


class Cell(Field):
    """One value, stored under the empty key of its field."""

    kind = "cell"
    _params = ("T",)

    def _bind(self, value_type):
        self._schema = schema(value_type)

    def get(self, default=None):
        """The value, or `default` if unset."""
        raw = host.current().get(self.name, b"")
        if raw is None:
            return default
        value = self._decode_value(raw)
        return default if value is _SKIP else value

    def get_or_default(self):
        """The value, or the type's default (0, "", False, [], ...) if unset."""
        return self.get(self._schema.default())

    def set(self, value) -> None:
        """Stores `value`."""
        host.current().put(self.name, b"", self._encode_value(value))

    def clear(self) -> bool:
        """Removes the value; returns whether there was one."""
        return host.current().delete(self.name, b"")


class Iter:
    """Entries of a key range of a field, fetched from the host in pages.

    Call `rev()` and `limit(n)` before iterating: `limit` bounds what is
    fetched from the host (and so what the transaction reads).
    """

    def __init__(self, field, start, end, decode):
        self._field, self._start, self._end, self._decode = field, start, end, decode
        self._backward = False
        self._limit = None

    def rev(self) -> "Iter":
        """Iterates in descending key order."""
        self._backward = not self._backward
        return self

    def limit(self, n: int) -> "Iter":
        """Yields at most `n` entries."""
        self._limit = n
        return self

    def __iter__(self):
        start, end, remaining = self._start, self._end, self._limit
        backend = host.current()
        while remaining is None or remaining > 0:
            want = PAGE if remaining is None else min(remaining, PAGE)
            entries = backend.scan(self._field.name, start, end, want, self._backward)
            if remaining is not None:
                remaining -= len(entries)
            for key, value in entries:
                item = self._decode(key, value)
                # An entry that does not decode is skipped and fails the call.
                if item is not _SKIP:
                    yield item
            if len(entries) < want:
                return
            # Resume the next page right after the last entry seen.
            last = entries[-1][0]
            if self._backward:
                end = last
            else:
                start = last + b"\x00"


def _after(encoded: bytes) -> bytes:
    # Encodings are prefix-free, so `enc(k) + 0x00` is the smallest byte
    # string above `enc(k)` that can follow it.
    return encoded + b"\x00"


class Map(Field):
    """Ordered keys to values; iteration is in key order."""

    kind = "map"
    _params = ("K", "V")

    def _bind(self, key_type, value_type):
        self._keys = key_codec(key_type)
        self._schema = schema(value_type)

    def _key(self, key) -> bytes:
        return encode_key(self._keys, key)

    def get(self, key, default=None):
        """The value of `key`, or `default`."""
        raw = host.current().get(self.name, self._key(key))
        if raw is None:
            return default
        value = self._decode_value(raw)
        return default if value is _SKIP else value

    def contains_key(self, key) -> bool:
        """Whether `key` has a value."""
        return host.current().get(self.name, self._key(key)) is not None

    def insert(self, key, value) -> None:
        """Stores `value` under `key`, replacing any previous value."""
        host.current().put(self.name, self._key(key), self._encode_value(value))

    def remove(self, key) -> bool:
        """Removes `key`; returns whether it was there."""
        return host.current().delete(self.name, self._key(key))

    def range(self, start=None, end=None, *, inclusive=False) -> Iter:
        """`(key, value)` pairs with `start <= key < end` (`<= end` if
        `inclusive`), in key order; a None bound is open."""
        lo = None if start is None else self._key(start)
        hi = None if end is None else self._key(end)
        if hi is not None and inclusive:
            hi = _after(hi)
        return Iter(self, lo, hi, self._entry)

    def iter(self) -> Iter:
        """All `(key, value)` pairs, in key order."""
        return self.range()

    def __iter__(self):
        return iter(self.iter())

    def first(self):
        """The entry with the smallest key, or None."""
        return next(iter(self.iter().limit(1)), None)

    def last(self):
        """The entry with the largest key, or None."""
        return next(iter(self.iter().rev().limit(1)), None)

    def is_empty(self) -> bool:
        """Whether the map has no entries."""
        return not host.current().scan(self.name, None, None, 1, False)

    def _entry(self, raw_key, raw_value):
        key, value = self._decode_key(raw_key), self._decode_value(raw_value)
        return _SKIP if _SKIP in (key, value) else (key, value)


class MultiMap(Field):
    """Ordered keys to several values each.

    Each value is its own entry, keyed by the encoded key and an 8-byte
    random suffix from the host, so values of one key are in no particular
    order.
    """

    kind = "multi-map"
    _params = ("K", "V")

    def _bind(self, key_type, value_type):
        self._keys = key_codec(key_type)
        self._schema = schema(value_type)

    def insert(self, key, value) -> None:
        """Adds `value` under `key`."""
        backend = host.current()
        prefix = encode_key(self._keys, key)
        encoded = self._encode_value(value)
        # A repeated suffix would overwrite a value; 64 random bits make
        # that unlikely, the check makes it impossible.
        while True:
            entry_key = prefix + backend.random_u64().to_bytes(SUFFIX_LEN, "big")
            if backend.get(self.name, entry_key) is None:
                break
        backend.put(self.name, entry_key, encoded)

    def get_all(self, key) -> list:
        """All values of `key`."""
        values = []
        for _, raw in self._key_entries(key):
            value = self._decode_value(raw)
            if value is not _SKIP:
                values.append(value)
        return values

    def contains_key(self, key) -> bool:
        """Whether `key` has at least one value."""
        return next(iter(self._key_entries(key).limit(1)), None) is not None

    def remove_all(self, key) -> int:
        """Removes every value of `key`; returns how many there were."""
        keys = [k for k, _ in self._key_entries(key)]
        backend = host.current()
        for k in keys:
            backend.delete(self.name, k)
        return len(keys)

    def range(self, start=None, end=None, *, inclusive=False) -> Iter:
        """`(key, value)` pairs with keys from `start` to `end` (excluded,
        or included if `inclusive`), in key order."""
        lo = None if start is None else encode_key(self._keys, start)
        hi = None if end is None else encode_key(self._keys, end)
        if hi is not None and inclusive:
            # Each key prefixes its entries: end after all of them.
            hi = prefix_successor(hi)
        return Iter(self, lo, hi, self._entry)

    def iter(self) -> Iter:
        """All `(key, value)` pairs, in key order."""
        return self.range()

    def __iter__(self):
        return iter(self.iter())

    def _key_entries(self, key) -> Iter:
        prefix = encode_key(self._keys, key)
        return Iter(self, prefix, prefix_successor(prefix), lambda k, v: (k, v))

    def _entry(self, raw_key, raw_value):
        if len(raw_key) < SUFFIX_LEN:
            fail_later(f"field `{self.name}`: stored key has no multimap suffix")
            return _SKIP
        key, value = self._decode_key(raw_key[:-SUFFIX_LEN]), self._decode_value(raw_value)
        return _SKIP if _SKIP in (key, value) else (key, value)


class Set(Field):
    """Ordered keys without values (a map whose values are empty)."""

    kind = "set"
    _params = ("K",)

    def _bind(self, key_type):
        self._keys = key_codec(key_type)

    def _key(self, member) -> bytes:
        return encode_key(self._keys, member)

    def insert(self, member) -> None:
        """Adds `member` (a no-op if it is there)."""
        host.current().put(self.name, self._key(member), b"")

    def contains(self, member) -> bool:
        """Whether `member` is in the set."""
        return host.current().get(self.name, self._key(member)) is not None

    def remove(self, member) -> bool:
        """Removes `member`; returns whether it was there."""
        return host.current().delete(self.name, self._key(member))

    def range(self, start=None, end=None, *, inclusive=False) -> Iter:
        """Members from `start` to `end` (excluded, or included if `inclusive`), in order."""
        lo = None if start is None else self._key(start)
        hi = None if end is None else self._key(end)
        if hi is not None and inclusive:
            hi = _after(hi)
        return Iter(self, lo, hi, lambda k, _: self._decode_key(k))

    def iter(self) -> Iter:
        """All members, in order."""
        return self.range()

    def __iter__(self):
        return iter(self.iter())

    def is_empty(self) -> bool:
        """Whether the set has no members."""
        return not host.current().scan(self.name, None, None, 1, False)
