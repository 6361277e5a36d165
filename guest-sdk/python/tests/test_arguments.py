"""Arguments are decoded as the Rust SDK decodes them (private.rs's tests)."""

from typing import Optional

import pytest

from lambdastore import I32, U8, BadArgumentsError, Cell, lambda_object, static


@lambda_object
class Payments:
    memo: Cell[str]

    @static
    def pay(to: int, amount: int, memo: Optional[str]):
        return [to, amount, memo]

    @static
    def nothing():
        return "ok"

    @static
    def kinds(small: U8, count: I32, ratio: float, flag: bool, tags: list[str], pair: tuple[int, str],
              extra: dict[str, int], data: bytes, anything=None, fallback: int = 7):
        return [small, count, ratio, flag, tags, list(pair), extra, list(data), anything, fallback]


def spec(name):
    return Payments.__lambda_type__.function(name)


def parse(text):
    return spec("pay").decode_args(text)


def bad(text, name="pay"):
    with pytest.raises(BadArgumentsError) as error:
        spec(name).decode_args(text)
    return error.value.value


def test_arguments_by_name_and_by_position():
    assert parse('{"amount": 5, "to": 2}') == [2, 5, None]
    assert parse('[2, 5, "rent"]') == [2, 5, "rent"]
    assert parse('{"to": 2, "amount": 5, "memo": null}') == [2, 5, None]
    # A repeated name: the last one counts, as in a JSON object.
    assert parse('{"to": 1, "amount": 5, "to": 2}') == [2, 5, None]
    # Escapes in names and nested values are decoded as usual.
    assert parse(r'{"t\u006f": 2, "amount": 5, "memo": "a \"b\" [c]"}') == [2, 5, 'a "b" [c]']


def test_argument_mistakes_are_bad_arguments():
    assert bad('{"to": 2}') == "missing parameter `amount`"
    assert bad("[2]") == "missing parameter `amount`"
    assert bad("null") == "missing parameter `to`"
    assert bad('{"to": 2, "amount": 5, "x": 1}') == "unknown parameter `x` (parameters: to, amount, memo)"
    assert bad('[1, 2, "m", 4]') == "4 arguments given (parameters: to, amount, memo)"
    assert bad('{"to": "two", "amount": 5}') == 'parameter `to`: invalid type: string "two", expected i64'
    assert bad('[2, "x"]') == 'parameter `amount`: invalid type: string "x", expected i64'
    assert bad("5") == "arguments must be a JSON object (by name), an array (by position) or null, not 5"
    assert bad("{").startswith("arguments are not valid JSON")


def test_no_parameters_accept_null_empty_object_and_empty_array():
    for text in ["null", "{}", "[]", ""]:
        assert spec("nothing").decode_args(text) == []
    assert bad("[1]", "nothing") == "1 arguments given (the function takes no parameters)"


def test_parameter_types_are_checked_like_serde():
    args = '[255, -5, 1, true, ["a"], [1, "b"], {"k": 1}, [0, 255], {"any": [1]}]'
    decoded = [255, -5, 1.0, True, ["a"], (1, "b"), {"k": 1}, b"\x00\xff", {"any": [1]}, 7]
    assert spec("kinds").decode_args(args) == decoded
    ok = [1, 1, 1.0, True, [], [1, "b"], {}, []]

    def with_arg(index, value):
        values = list(ok)
        values[index] = value
        import json
        return bad(json.dumps(values), "kinds")

    assert with_arg(0, 256) == "parameter `small`: invalid value: integer `256`, expected u8"
    assert with_arg(1, 1.5) == "parameter `count`: invalid type: floating point `1.5`, expected i32"
    assert with_arg(2, "x") == 'parameter `ratio`: invalid type: string "x", expected f64'
    assert with_arg(3, 1) == "parameter `flag`: invalid type: integer `1`, expected a boolean"
    assert with_arg(4, [1]) == "parameter `tags`: invalid type: integer `1`, expected a string"
    assert with_arg(5, [1]) == "parameter `pair`: invalid length 1, expected a tuple of size 2"
    assert with_arg(5, [1, "b", 3]) == "parameter `pair`: invalid length 3, expected fewer elements in array"
    assert with_arg(6, []) == "parameter `extra`: invalid type: sequence, expected a map"
    assert with_arg(7, None) == "parameter `data`: invalid type: null, expected a sequence"


def test_unsupported_parameter_types_are_refused_at_declaration():
    with pytest.raises(TypeError, match="parameter `when`"):
        @lambda_object
        class Bad:
            @static
            def f(when: complex):
                pass
