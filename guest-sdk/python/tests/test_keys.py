"""The key encoding, checked as key.rs checks it (same generator, same seeds)
plus fixed vectors, so both SDKs agree byte for byte."""

from typing import Optional

import pytest

from lambdastore import I8, I16, I32, I64, U8, U16, U32, U64, Cell, lambda_object
from lambdastore.keys import MalformedKey, decode_key, encode_key, key_codec, prefix_successor

MASK = (1 << 64) - 1


class Rng:
    """key.rs's SplitMix64 test generator, so the same values are checked."""

    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def int(self):
        """Integers biased toward the edges, where sign and width bugs live."""
        choice = self.next() % 4
        if choice == 0:
            return self.next() % 4
        if choice == 1:
            return MASK - self.next() % 4
        if choice == 2:
            return (1 << 63) ^ (self.next() % 4)
        return self.next()

    def bytes(self):
        length = self.next() % 6
        return bytes([0x00, 0x01, 0x02, 0x61, 0xFE, 0xFF][self.next() % 6] for _ in range(length))

    def string(self):
        length = self.next() % 5
        return "".join(["\0", "\x01", "a", "b", "é", "\U0010FFFF"][self.next() % 6] for _ in range(length))


def cast(value, bits, signed):
    """Rust's `as` cast of a u64 to an integer type."""
    value &= (1 << bits) - 1
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def order_key(value):
    """Rust's `Ord` of the value, as a Python sort key (None < Some)."""
    if value is None:
        return (0,)
    if isinstance(value, tuple):
        return tuple(order_key(v) for v in value)
    return (1, value)


def check(hint, n, generate):
    """Order preservation, round trip and prefix-freedom on every pair."""
    codec = key_codec(hint)
    rng = Rng(0x5EED)
    values = [generate(rng) for _ in range(n)]
    encoded = [encode_key(codec, v) for v in values]
    for v, e in zip(values, encoded):
        assert decode_key(codec, e) == v, f"round trip of {v!r}"
    for a, ea in zip(values, encoded):
        for b, eb in zip(values, encoded):
            assert (order_key(a) > order_key(b)) - (order_key(a) < order_key(b)) == (ea > eb) - (ea < eb), (a, b)
            if a != b:
                assert not eb.startswith(ea), f"{a!r} encodes to a prefix of {b!r}"


@pytest.mark.parametrize("hint,bits", [(U8, 8), (U16, 16), (U32, 32), (U64, 64)])
def test_unsigned_integers(hint, bits):
    check(hint, 200, lambda r: cast(r.int(), bits, False))


@pytest.mark.parametrize("hint,bits", [(I8, 8), (I16, 16), (I32, 32), (I64, 64), (int, 64)])
def test_signed_integers(hint, bits):
    check(hint, 200, lambda r: cast(r.int(), bits, True))


def test_booleans_and_options():
    check(bool, 20, lambda r: r.next() % 2 == 0)
    check(Optional[I32], 200, lambda r: cast(r.int(), 32, True) if r.next() % 3 != 0 else None)


def test_strings_and_bytes():
    check(str, 300, lambda r: r.string())
    check(bytes, 300, lambda r: r.bytes())


def test_tuples():
    check(tuple[I16], 200, lambda r: (cast(r.int(), 16, True),))
    check(tuple[bytes, U8], 300, lambda r: (r.bytes(), cast(r.int(), 8, False)))
    check(tuple[str, bytes, bool], 300, lambda r: (r.string(), r.bytes(), r.next() % 2 == 0))
    check(tuple[I8, str, U16, bytes], 300,
          lambda r: (cast(r.int(), 8, True), r.string(), cast(r.int(), 16, False), r.bytes()))


def test_fixed_vectors():
    # What the Rust SDK writes for the same keys (key.rs's table).
    assert encode_key(key_codec(str), "a\0b") == b"a\x00\xffb\x00\x01"
    assert encode_key(key_codec(bytes), b"a\0b") == b"a\x00\xffb\x00\x01"
    assert encode_key(key_codec(int), -1) == bytes.fromhex("7fffffffffffffff")
    assert encode_key(key_codec(int), 0) == bytes.fromhex("8000000000000000")
    assert encode_key(key_codec(I8), -128) == b"\x00"
    assert encode_key(key_codec(U32), 1) == b"\x00\x00\x00\x01"
    assert encode_key(key_codec(bool), True) == b"\x01"
    assert encode_key(key_codec(Optional[U8]), None) == b"\x00"
    assert encode_key(key_codec(Optional[U8]), 7) == b"\x01\x07"
    assert encode_key(key_codec(tuple[U64, str]), (7, "x")) == bytes.fromhex("0000000000000007") + b"x\x00\x01"


def test_object_references_encode_as_their_i64_id():
    @lambda_object
    class Account:
        balance: Cell[int]

    assert encode_key(key_codec(Account), 42) == encode_key(key_codec(I64), 42)


def test_malformed_keys_are_errors():
    bad = [
        (str, b"abc", "unterminated string"),
        (str, b"a\x00\x02", "bad escape in string"),
        (str, b"\xff\x00\x01", None),  # not UTF-8
        (U32, b"\x01\x02", "expected 4 bytes, found 2"),
        (U8, b"\x01\x02", "1 trailing bytes"),
        (bool, b"\x02", "bool byte 2"),
        (Optional[U8], b"\x05", "option tag 5"),
    ]
    for hint, data, message in bad:
        with pytest.raises(MalformedKey) as error:
            decode_key(key_codec(hint), data)
        assert str(error.value).startswith("malformed key: ")
        if message:
            assert str(error.value) == f"malformed key: {message}"


def test_keys_that_do_not_fit_their_type_are_refused():
    with pytest.raises(ValueError):
        encode_key(key_codec(U8), 256)
    with pytest.raises(ValueError):
        encode_key(key_codec(int), 1 << 63)
    with pytest.raises(TypeError):
        encode_key(key_codec(int), "1")
    with pytest.raises(TypeError):
        key_codec(float)


def test_prefix_successor_bounds_every_extension():
    assert prefix_successor(b"ab") == b"ac"
    assert prefix_successor(b"a\xff\xff") == b"b"
    assert prefix_successor(b"\xff") is None
    rng = Rng(7)
    for _ in range(500):
        prefix = rng.bytes()
        extended = prefix + rng.bytes()
        end = prefix_successor(prefix)
        if end is not None:
            assert extended < end and prefix < end
