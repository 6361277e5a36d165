"""The order-preserving key encoding of map, multimap and set keys, byte
for byte the Rust SDK's (guest-sdk/sdk/src/key.rs).

The host compares keys as bytes, so a key's encoding must sort exactly like
the key, and encodings are prefix-free, which lets tuples concatenate their
parts and multimaps append a suffix to a key.

| type | encoding |
| --- | --- |
| `U8`..`U64` | big-endian |
| `I8`..`I64`, `int` | big-endian with the sign bit flipped |
| `bool` | one byte, 0 or 1 |
| `str`, `bytes` | bytes with 0x00 escaped as 0x00 0xFF, then 0x00 0x01 |
| `Optional[T]` | 0x00 for None, 0x01 then `T` |
| `tuple[A, B, ...]` | concatenation |
| a `@lambda_object` class (a reference) | its `i64` id |
"""

import types
import typing

from .schema import INT_TYPES, is_reference


class MalformedKey(ValueError):
    """A stored key that does not decode as the expected key type."""

    def __init__(self, message):
        super().__init__(f"malformed key: {message}")




class KeyCodec:
    """Encodes keys of one type; `decode` reads one key at `pos`."""

    name = "key"

    def encode(self, value, out: bytearray):
        raise NotImplementedError

    def decode(self, data: bytes, pos: int):
        raise NotImplementedError


def _take(data, pos, n):
    if len(data) - pos < n:
        raise MalformedKey(f"expected {n} bytes, found {len(data) - pos}")
    return data[pos:pos + n], pos + n


class IntKey(KeyCodec):
    def __init__(self, bits, signed):
        self.size, self.signed = bits // 8, signed
        self.name = f"{'i' if signed else 'u'}{bits}"
        # Flipping the sign bit maps MIN..MAX onto 0..2**bits-1 in order.
        self.flip = 1 << (bits - 1) if signed else 0
        self.low = -self.flip if signed else 0
        self.high = (1 << (bits - 1 if signed else bits)) - 1

    def encode(self, value, out):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"a {self.name} key must be an int, not {type(value).__name__}")
        if not self.low <= value <= self.high:
            raise ValueError(f"{value} does not fit a {self.name} key")
        out += ((value + self.flip) if self.signed else value).to_bytes(self.size, "big")

    def decode(self, data, pos):
        raw, pos = _take(data, pos, self.size)
        return int.from_bytes(raw, "big") - self.flip, pos


class BoolKey(KeyCodec):
    name = "bool"

    def encode(self, value, out):
        if not isinstance(value, bool):
            raise TypeError(f"a bool key must be a bool, not {type(value).__name__}")
        out.append(1 if value else 0)

    def decode(self, data, pos):
        raw, pos = _take(data, pos, 1)
        if raw[0] > 1:
            raise MalformedKey(f"bool byte {raw[0]}")
        return raw[0] == 1, pos


def encode_bytes(raw: bytes, out: bytearray):
    # The terminator 0x00 0x01 sorts below any continuation (0x00 0xFF or a
    # non-zero byte), which keeps byte order and makes the encoding prefix-free.
    out += raw.replace(b"\x00", b"\x00\xff")
    out += b"\x00\x01"


def decode_bytes(data: bytes, pos: int):
    raw = bytearray()
    while True:
        zero = data.find(b"\x00", pos)
        if zero < 0:
            raise MalformedKey("unterminated string")
        raw += data[pos:zero]
        marker = data[zero + 1:zero + 2]
        if marker == b"\xff":
            raw.append(0)
        elif marker == b"\x01":
            return bytes(raw), zero + 2
        else:
            raise MalformedKey("bad escape in string")
        pos = zero + 2


class BytesKey(KeyCodec):
    name = "bytes"

    def encode(self, value, out):
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"a bytes key must be bytes, not {type(value).__name__}")
        encode_bytes(bytes(value), out)

    def decode(self, data, pos):
        return decode_bytes(data, pos)


class StrKey(KeyCodec):
    name = "str"

    def encode(self, value, out):
        if not isinstance(value, str):
            raise TypeError(f"a str key must be a str, not {type(value).__name__}")
        encode_bytes(value.encode("utf-8"), out)

    def decode(self, data, pos):
        raw, pos = decode_bytes(data, pos)
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError as e:
            raise MalformedKey(str(e)) from None


class OptionalKey(KeyCodec):
    def __init__(self, inner):
        self.inner = inner
        self.name = f"Optional[{inner.name}]"

    def encode(self, value, out):
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(value, out)

    def decode(self, data, pos):
        raw, pos = _take(data, pos, 1)
        if raw[0] == 0:
            return None, pos
        if raw[0] == 1:
            return self.inner.decode(data, pos)
        raise MalformedKey(f"option tag {raw[0]}")


class TupleKey(KeyCodec):
    def __init__(self, parts):
        self.parts = parts
        self.name = f"tuple[{', '.join(p.name for p in parts)}]"

    def encode(self, value, out):
        if not isinstance(value, (tuple, list)) or len(value) != len(self.parts):
            raise TypeError(f"a {self.name} key must be a tuple of {len(self.parts)}, not {value!r}")
        for part, v in zip(self.parts, value):
            part.encode(v, out)

    def decode(self, data, pos):
        values = []
        for part in self.parts:
            v, pos = part.decode(data, pos)
            values.append(v)
        return tuple(values), pos


def key_codec(hint) -> KeyCodec:
    """The codec of key type `hint`; `TypeError` if it cannot be a key."""
    if hint is int:
        return IntKey(64, True)
    if isinstance(hint, type) and issubclass(hint, INT_TYPES):
        return IntKey(hint.BITS, hint.SIGNED)
    if hint is bool:
        return BoolKey()
    if hint is str:
        return StrKey()
    if hint is bytes:
        return BytesKey()
    if is_reference(hint):
        return IntKey(64, True)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return OptionalKey(key_codec(next(a for a in args if a is not type(None))))
    if origin is tuple and args and Ellipsis not in args:
        return TupleKey([key_codec(a) for a in args])
    raise TypeError(
        f"{hint!r} cannot be a key: use int (or I8..U64), bool, str, bytes, Optional, "
        "a tuple of those, or a @lambda_object class"
    )


def encode_key(codec: KeyCodec, value) -> bytes:
    out = bytearray()
    codec.encode(value, out)
    return bytes(out)


def decode_key(codec: KeyCodec, data: bytes):
    """Decodes `data`, which must hold exactly one key."""
    value, pos = codec.decode(bytes(data), 0)
    if pos != len(data):
        raise MalformedKey(f"{len(data) - pos} trailing bytes")
    return value


def prefix_successor(prefix: bytes):
    """The smallest byte string greater than every string starting with
    `prefix`, or None if there is none (the prefix is all 0xFF)."""
    end = bytearray(prefix)
    while end:
        last = end.pop()
        if last < 0xFF:
            end.append(last + 1)
            return bytes(end)
    return None
