"""Typed references (`ref`, `new`): calls checked against the type's
declaration, and the reference as an id wherever an id goes."""

from typing import Optional

import pytest

from lambdastore import (
    App, ApplicationError, Cell, LambdaError, constructor, lambda_object, new, readonly, ref,
)
from lambdastore.mock import MockHost


@lambda_object
class Counter:
    value: Cell[int]

    @constructor
    def start(self, initial: Optional[int] = None):
        self.value.set(initial or 0)

    @readonly
    def get(self) -> int:
        return self.value.get_or_default()

    def add(self, n: int, from_: Optional[int] = None) -> int:
        if n == 0:
            raise LambdaError("nothing to add")
        self.value.set(self.value.get_or_default() + n)
        return self.value.get_or_default()


@lambda_object
class Tally:
    counter: Cell[Counter]

    @constructor
    def start(self, counter: Counter):
        self.counter.set(counter)

    def bump(self) -> int:
        return ref(Counter, self.counter.get()).add(1)

    def keep(self, other: int):
        # A reference to a Tally where a Counter goes: refused as in Rust.
        self.counter.set(ref(Tally, other))


@pytest.fixture
def host():
    return MockHost(App(Counter, Tally))


def test_a_reference_calls_its_types_methods_by_position_or_by_name(host):
    def lambda_code():
        counter = new(Counter, 5)
        assert counter.add(2) == 7
        assert counter.add(n=3, from_=counter) == 10
        assert counter.get() == 10
        assert int(counter) == counter.id and counter == counter.id
        # A reference is an id as an argument, and in a field of its type.
        tally = new(Tally, counter)
        assert ref(Tally, tally.id).bump() == 11
        return counter.id

    me = host.create("Counter", None)
    counter = host.with_object(me, lambda_code)
    assert host.invoke(counter, "get") == 11


def test_what_the_type_does_not_declare_is_refused_before_any_call(host):
    def lambda_code():
        counter = new(Counter)
        with pytest.raises(AttributeError, match="Counter has no method `reset`"):
            counter.reset()
        with pytest.raises(AttributeError, match="no method `start`"):
            counter.start()  # the constructor is not a method
        with pytest.raises(TypeError, match=r"takes 2 arguments \(3 given\)"):
            counter.add(1, 2, 3)
        with pytest.raises(TypeError, match="no parameter `m`"):
            counter.add(m=1)
        with pytest.raises(TypeError, match="got `n` twice"):
            counter.add(1, n=1)
        with pytest.raises(TypeError, match="@lambda_object"):
            ref(int, 1)
        return counter.get()

    me = host.create("Counter", None)
    assert host.with_object(me, lambda_code) == 0


def test_a_call_through_a_reference_fails_as_a_call_does(host):
    def lambda_code():
        counter = new(Counter, 1)
        with pytest.raises(ApplicationError, match="nothing to add"):
            counter.add(0)
        return counter.get()

    me = host.create("Counter", None)
    assert host.with_object(me, lambda_code) == 1
    tally = host.create("Tally", {"counter": me})
    with pytest.raises(ApplicationError, match="field `counter`: a reference to a Tally, expected a Counter"):
        host.invoke(tally, "keep", {"other": tally})
