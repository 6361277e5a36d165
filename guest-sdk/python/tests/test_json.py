"""Values are stored and returned as the JSON text serde_json writes."""

import pytest

from lambdastore.jsontext import NotJson, dumps, float_text, loads


@pytest.mark.parametrize("value,text", [
    # What serde_json (ryu) writes for these f64s.
    (1.0, "1.0"), (0.1, "0.1"), (-2.5, "-2.5"), (0.0, "0.0"), (-0.0, "-0.0"),
    (1e15, "1000000000000000.0"), (1e16, "1e16"), (1.5e16, "1.5e16"), (1e100, "1e100"),
    (1e-4, "0.0001"), (1.234e-5, "0.00001234"), (1.234e-6, "1.234e-6"), (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e308"), (123.456, "123.456"),
])
def test_floats_are_written_like_serde_json(value, text):
    assert float_text(value) == text
    assert loads(text) == value


def test_compact_and_unescaped_like_serde_json():
    value = {"b": [1, 2.5, None, True], "a": "é \"q\" \\ \n \x01 /", "t": (1, 2), "raw": b"\x00\xff"}
    # Keys keep their order (serde_json's Value sorts them, but a derived
    # struct does not: the author's order is kept, as a Rust struct's).
    assert dumps(value) == '{"b":[1,2.5,null,true],"a":"é \\"q\\" \\\\ \\n \\u0001 /","t":[1,2],"raw":[0,255]}'


def test_a_scalar_alone_is_written_as_inside_a_container():
    # `dumps` writes a lone scalar itself, without the encoder.
    for value in [0, -7, 1 << 70, "é \"q\" \\ \n \x01 /", None, True, False, 2.5, 1e16]:
        assert dumps(value) == dumps([value])[1:-1]
    assert loads(dumps("é \x01").encode()) == "é \x01"


def test_non_finite_floats_are_not_json():
    for value in (float("nan"), float("inf"), [float("-inf")]):
        with pytest.raises(NotJson):
            dumps(value)
    with pytest.raises(ValueError):
        loads("NaN")
