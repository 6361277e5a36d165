"""Edges a demanding author reaches, where the server once trapped (38000)
or the mock and the server disagreed: each as the server does it (the
sandbox example runs the same on the server: tests/tests/limits.rs)."""

from __future__ import annotations

from typing import Optional

import pytest

import lambdastore
from lambdastore import App, ApplicationError, BadArgumentsError, Cell, LambdaError, lambda_object, readonly
from lambdastore.mock import MockHost, Trap


class Custom(BaseException):
    pass


@lambda_object
class Edge:
    n: Cell[int]
    next: Cell[Optional[Edge]]  # a field of the type itself

    def raise_base(self, kind: str) -> None:
        self.n.set(999)
        raise {"keyboard": KeyboardInterrupt(), "custom": Custom("custom base")}[kind]

    def fail_with(self, value: int) -> None:
        raise LambdaError(value)

    def fail_surrogate(self) -> None:
        raise LambdaError("bad \ud800 message")

    def call_with_surrogate(self) -> str:
        try:
            lambdastore.call(lambdastore.self_id(), "fail_with", {"value": "x\ud800"})
        except BadArgumentsError as e:
            return str(e)
        return "called"

    def log_surrogate(self) -> None:
        print("x\ud800")
        lambdastore.log.notice("y\ud800")

    @readonly
    def write_caught(self) -> str:
        try:
            self.n.set(5)
        except BaseException as e:  # noqa: BLE001 -- what the test is about
            return type(e).__name__
        return "wrote"

    def keyword_only(self, *, a: int, b: int = 2) -> int:
        return a * 10 + b

    def deep(self, depth: int) -> int:
        return 0 if depth == 0 else lambdastore.call(lambdastore.self_id(), "deep", {"depth": depth - 1}) + 1

    def link(self, to: Edge) -> None:
        self.next.set(to)

    @readonly
    def linked(self) -> Optional[Edge]:
        return self.next.get()


@pytest.fixture
def host():
    return MockHost(App(Edge))


def test_a_base_exception_fails_the_call_alone(host):
    e = host.create("Edge")
    with pytest.raises(ApplicationError, match="^KeyboardInterrupt$"):
        host.invoke(e, "raise_base", ["keyboard"])
    with pytest.raises(ApplicationError, match="^Custom: custom base$"):
        host.invoke(e, "raise_base", ["custom"])
    assert host.cell(e, "n") is None


def test_messages_cross_as_text(host):
    e = host.create("Edge")
    with pytest.raises(ApplicationError, match="^12345$"):
        host.invoke(e, "fail_with", [12345])
    with pytest.raises(ApplicationError) as error:
        host.invoke(e, "fail_surrogate")
    assert error.value.value == "bad \\ud800 message"
    assert host.invoke(e, "call_with_surrogate").startswith("bad arguments: cannot encode arguments")
    host.invoke(e, "log_surrogate")
    assert [r.message for r in host.logs()] == ["x\\ud800", "y\\ud800"]


def test_a_trap_a_lambda_catches_still_aborts_the_workflow(host):
    e = host.create("Edge")
    with pytest.raises(Trap, match="readonly"):
        host.invoke(e, "write_caught")
    assert host.cell(e, "n") is None


def test_keyword_only_parameters_are_passed_by_name(host):
    e = host.create("Edge")
    assert host.invoke(e, "keyword_only", {"a": 1}) == 12
    assert host.invoke(e, "keyword_only", [3, 4]) == 34


def test_calls_nest_as_deep_as_the_servers_default(host):
    e = host.create("Edge")
    assert host.invoke(e, "deep", [16]) == 16
    with pytest.raises(Trap, match="call depth limit"):
        host.invoke(e, "deep", [17])
    host.set_max_depth(4)
    assert host.invoke(e, "deep", [4]) == 4
    with pytest.raises(Trap):
        host.invoke(e, "deep", [5])


def test_arguments_nest_no_deeper_than_serde_json_allows(host):
    e = host.create("Edge")
    nested = {"depth": 0, "extra": 0}
    for _ in range(200):
        nested = [nested]
    with pytest.raises(BadArgumentsError, match="recursion limit exceeded"):
        host.invoke(e, "deep", {"depth": nested})


def test_a_field_may_hold_a_reference_to_its_own_type(host):
    a, b = host.create("Edge"), host.create("Edge")
    host.invoke(a, "link", [b])
    assert host.invoke(a, "linked") == b


def test_names_the_server_refuses_are_refused_at_the_build():
    from lambdastore import stored_as

    with pytest.raises(TypeError, match="not empty"):
        stored_as("")

    def twin():
        @lambda_object
        class Edge:
            n: Cell[int]

        return Edge

    with pytest.raises(TypeError, match="named 'Edge'"):
        App(Edge, twin())


def test_a_result_jsonb_cannot_hold_fails_the_workflow(host):
    @lambda_object
    class Nul:
        n: Cell[int]

        def write_then_return(self, text: str) -> dict:
            self.n.set(1)
            return {"k": [text]}

    nul = MockHost(App(Nul))
    n = nul.create("Nul")
    with pytest.raises(Trap, match="u0000"):
        nul.invoke(n, "write_then_return", ["a\u0000b"])
    assert nul.cell(n, "n") is None
    assert nul.invoke(n, "write_then_return", ["ab"]) == {"k": ["ab"]}


def test_a_name_that_is_no_text_is_a_python_error(host):
    @lambda_object
    class Caller:
        n: Cell[int]

        def call_by(self, name: int) -> str:
            try:
                lambdastore.call(lambdastore.self_id(), name)
            except TypeError as e:
                return str(e)
            return "called"

    caller = MockHost(App(Caller))
    assert caller.invoke(caller.create("Caller"), "call_by", [7]) == "expected a str, not int"
