"""The Rust counter's tests (guest-sdk/examples/counter/src/lib.rs), on the mock host."""

import pytest

from app import Counter, app
from lambdastore import ApplicationError, BadArgumentsError, UnknownFunctionError, UnknownObjectError
from lambdastore.mock import MockHost

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.fixture
def host():
    return MockHost(app)


def test_starts_at_the_initial_value_or_zero(host):
    a = host.create("Counter", {"initial": 5})
    b = host.create("Counter", None)
    assert host.invoke(a, "get", {}) == 5
    assert host.invoke(b, "get", None) == 0


def test_increment_and_add_return_the_new_value(host):
    counter = host.create("Counter", [])
    assert host.invoke(counter, "increment", None) == 1
    assert host.invoke(counter, "add", {"n": 41}) == 42
    assert host.invoke(counter, "add", [-2]) == 40
    assert host.cell(counter, "value") == 40


def test_overflow_is_an_error_and_keeps_the_value(host):
    high = host.create("Counter", {"initial": I64_MAX})
    with pytest.raises(ApplicationError) as error:
        host.invoke(high, "increment", None)
    assert error.value == ApplicationError("counter overflow: 9223372036854775807 + 1")
    low = host.create("Counter", [I64_MIN + 1])
    with pytest.raises(ApplicationError) as error:
        host.invoke(low, "add", [-2])
    assert error.value == ApplicationError("counter overflow: -9223372036854775807 + -2")
    assert host.cell(high, "value") == I64_MAX
    assert host.cell(low, "value") == I64_MIN + 1


def test_typed_references_work_from_tests_too(host):
    # Rust's test of the same name: `new` and `ref` are the Python twin of
    # the generated `CounterRef`.
    from lambdastore import new

    me = host.create("Counter", None)

    def as_a_lambda():
        counter = new(Counter, 1)
        assert counter.add(2) == 3
        return counter.get()

    assert host.with_object(me, as_a_lambda) == 3


def test_add_to_each_reports_each_counter_and_rolls_back_only_the_one_that_failed(host):
    me = host.create("Counter", None)
    a = host.create("Counter", {"initial": 1})
    full = host.create("Counter", {"initial": I64_MAX})
    outcomes = host.invoke(me, "add_to_each", {"counters": [a, full, a], "n": 2})
    overflow = f"counter overflow: {I64_MAX} + 2"
    assert outcomes == [[a, {"Ok": 3}], [full, {"Err": overflow}]], "each counter once, in order"
    assert host.cell(a, "value") == 3
    assert host.cell(full, "value") == I64_MAX
    assert host.cell(me, "value") == 1, "one counter took it"


def test_mistyped_or_missing_arguments_are_rejected(host):
    counter = host.create("Counter", None)
    with pytest.raises(BadArgumentsError) as error:
        host.invoke(counter, "add", {"n": "two"})
    assert error.value.value.startswith("parameter `n`")
    with pytest.raises(BadArgumentsError) as error:
        host.invoke(counter, "add", {})
    assert error.value == BadArgumentsError("missing parameter `n`")
    with pytest.raises(BadArgumentsError):
        host.invoke(counter, "get", {"n": 1})


def test_unknown_objects_and_functions_are_errors(host):
    counter = host.create("Counter", None)
    with pytest.raises(UnknownFunctionError) as error:
        host.invoke(counter, "reset", None)
    assert error.value == UnknownFunctionError("Counter.reset")
    with pytest.raises(UnknownObjectError) as error:
        host.invoke(99, "get", None)
    assert error.value == UnknownObjectError(99)
    with pytest.raises(UnknownFunctionError):
        host.create("Nope", None)


def test_describes_its_type():
    counter = app.describe().types[0]
    assert counter.name == "Counter"
    assert counter.fields[0].name == "value"
    get = counter.function("get")
    assert get.readonly and not get.protected and get.kind == "method"
    assert next(f for f in counter.functions if f.kind == "constructor").name == "new"
