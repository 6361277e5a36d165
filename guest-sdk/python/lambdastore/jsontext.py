"""JSON text exactly as the Rust SDK (serde_json) writes it, so a value
stored or returned by a Python lambda has the same bytes as a Rust one.

The standard library's compact output already matches serde_json's for
strings (only `"`, `\\` and control characters escaped, lowercase `\\u00XX`),
integers, booleans and null. Floats differ: Python writes `1e+16` and
`1e-05` where serde_json (ryu) writes `1e16` and `0.00001`, so floats are
formatted here by ryu's rules.
"""

import dataclasses
import json
import json.encoder
import math
import re

NON_FINITE = "it contains a non-finite float (NaN or infinity), which JSON cannot represent"


class NotJson(ValueError):
    """A value JSON cannot represent."""


def float_text(x: float) -> str:
    """`x` as serde_json writes an f64 (ryu's shortest form)."""
    if not math.isfinite(x):
        raise NotJson(NON_FINITE)
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    # repr gives the shortest digits that round-trip, as ryu does; only
    # the layout around them differs.
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    digits = all_digits.lstrip("0")
    # The value is 0.DIGITS * 10**point.
    point = len(whole) + int(exponent or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    n = len(digits)
    if n <= point <= 16:
        return f"{sign}{digits}{'0' * (point - n)}.0"
    if 0 < point <= 16:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    rest = f".{digits[1:]}" if n > 1 else ""
    return f"{sign}{digits[0]}{rest}e{point - 1}"


def _default(value):
    # A typed reference (refs.py) is its object's id.
    if hasattr(value, "__lambda_id__"):
        return value.__lambda_id__
    # serde serializes `Vec<u8>` as an array of numbers.
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    # A dataclass is a struct: an object of its fields, in declaration order.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value) -> str:
    """Compact JSON of `value`; `NotJson` for NaN or infinities, `TypeError`
    for what JSON has no form for."""
    # A scalar (most results and many values) is written here: the encoder
    # below is pure Python, made anew for each value, and a call runs in
    # the interpreter's snapshot, where nothing of it is warm.
    kind = type(value)
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return json.encoder.encode_basestring(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        return float_text(value)
    # The pure-Python encoder is the one that takes a float formatter; its
    # signature has been stable since Python 2.7.
    iterencode = json.encoder._make_iterencode(
        {}, _default, json.encoder.encode_basestring, None, float_text, ":", ",", False, False, True
    )
    return "".join(iterencode(value, 0))


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


# One decoder for every value: `json.loads` with an argument makes a new
# decoder (and its scanner) each time.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text):
    """The value of JSON `text`, a `str` or UTF-8 bytes (NaN and Infinity
    refused, and arrays and objects nested deeper than 128, as serde_json
    does)."""
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "surrogatepass")
    if _nested_deeper_than(text, MAX_NESTING):
        raise ValueError("recursion limit exceeded")
    return _DECODER.decode(text)


#: serde_json's limit. The json module's C scanner recurses on the C stack,
#: which a component's interpreter has little of: 900 levels of arguments
#: trapped the instance (38000) instead of failing the call.
MAX_NESTING = 128

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_INNERMOST = re.compile(r"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` in `text`: each
    pass removes the innermost ones, in C (a loop over the characters in
    the interpreter would cost every large argument). Text with fewer
    brackets than that cannot."""
    if text.count("[") + text.count("{") <= limit:
        return False
    text = _STRING.sub('""', text)
    for _ in range(limit):
        text, removed = _INNERMOST.subn("", text)
        if not removed:
            return False
    return "[" in text or "{" in text


def describe_value(value) -> str:
    """How serde names a JSON value in "invalid type" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{float_text(value)}`"
    if isinstance(value, str):
        return f"string {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__
