"""Calls, errors and the mock host's rules, on a small bank (the README's)."""

from typing import Optional

import pytest

import lambdastore
from lambdastore import (
    App, ApplicationError, BadArgumentsError, Cell, Err, LambdaError, Map, NotAllowedError, Ok,
    UnknownFunctionError, UnknownObjectError, constructor, lambda_object, protected, readonly, static,
)
from lambdastore.mock import MockHost, Trap


@lambda_object
class Account:
    owner: Cell[str]
    balance: Cell[int]
    history: Map[int, str]

    @constructor
    def open(self, owner: str, initial: Optional[int] = None):
        if owner == "":
            raise LambdaError("an account needs an owner")
        self.owner.set(owner)
        self.balance.set(initial or 0)

    @readonly
    def get_balance(self) -> int:
        return self.balance.get_or_default()

    @protected
    def deposit(self, amount: int):
        self.balance.set(self.balance.get_or_default() + amount)

    def transfer(self, to: "Account", amount: int) -> int:
        balance = self.balance.get_or_default()
        if amount <= 0 or amount > balance:
            raise LambdaError(f"cannot transfer {amount} with a balance of {balance}")
        self.balance.set(balance - amount)
        # If the deposit fails, its error fails this call and the debit is undone.
        lambdastore.call(to, "deposit", {"amount": amount})
        return balance - amount

    def try_transfer(self, to: int, amount: int) -> str:
        self.balance.set(self.balance.get_or_default() - amount)
        try:
            lambdastore.call(to, "deposit", [amount])
        except UnknownObjectError as e:
            self.balance.set(self.balance.get_or_default() + amount)
            return f"kept: {e}"
        return "sent"

    def divide(self, by: int) -> float:
        self.balance.set(0)
        return 1 / by

    def forward(self, target: int, function: str):
        return lambdastore.call(target, function, None)

    @readonly
    def sneaky_write(self):
        self.balance.set(1)

    @readonly
    def write_through_a_callee(self, other: int):
        lambdastore.call(other, "deposit", [1])

    def open_another(self, owner: str) -> int:
        return lambdastore.create(Account, {"owner": owner})

    def not_json(self):
        return float("nan")

    def unencodable(self, which: str):
        if which == "circular":
            items = []
            items.append(items)
            return items
        if which == "digits":
            return 10**5000
        if which == "surrogate":
            return "\ud800"
        raise SystemExit(3)

    def bump(self, by: int = 1):
        self.balance.set(self.balance.get_or_default() + by)

    def later(self, at: Optional[int] = None):
        # Jobs run as clients' calls: a protected function would be refused.
        if at is None:
            lambdastore.spawn(lambdastore.self_id(), "bump")
        else:
            lambdastore.spawn_at(lambdastore.self_id(), "bump", {"by": 1}, at)

    def remind(self, name: str, at: int, clear: bool = False):
        if clear:
            lambdastore.clear_timer(name)
        else:
            lambdastore.set_timer(name, at, "bump", {"by": 10})

    def chatter(self) -> list:
        lambdastore.log.debug("d")
        lambdastore.log.info("i")
        lambdastore.log.notice("n")
        lambdastore.log.warning("w")
        return [lambdastore.self_id(), lambdastore.now_micros(), lambdastore.random_u64()]

    def recurse(self) -> int:
        return lambdastore.call(lambdastore.self_id(), "recurse")

    def bad_field(self):
        lambdastore.host.current().put("a\0b", b"", b"1")

    @static
    def version() -> str:
        return "1"

    @static
    def total(accounts: list[int]) -> int:
        return sum(lambdastore.call(a, "get_balance") for a in accounts)

    @static
    def touch_fields():
        Account.balance.get()

    def via_static(self, accounts: list[int]) -> int:
        return lambdastore.call_static("Account", "total", {"accounts": accounts})

    def _helper(self):
        """Private: not a lambda function."""


@lambda_object
class Plain:
    """No constructor."""

    tally: Cell[int]


app = App(Account, Plain)


@pytest.fixture
def host():
    return MockHost(app)


def test_transfer_moves_money_and_protected_functions_refuse_clients(host):
    a = host.create("Account", {"owner": "ada", "initial": 10})
    b = host.create("Account", ["bob"])
    assert host.invoke(a, "transfer", {"to": b, "amount": 4}) == 6
    assert host.cell(b, "balance") == 4
    with pytest.raises(NotAllowedError) as error:
        host.invoke(b, "deposit", [1])
    assert error.value.value == "Account.deposit is protected: only lambdas of its application may call it"


def test_lambda_errors_roll_back_the_call(host):
    a = host.create("Account", {"owner": "ada", "initial": 3})
    with pytest.raises(ApplicationError) as error:
        host.invoke(a, "transfer", {"to": 99, "amount": 2})
    # The nested call's error, uncaught, fails the call as the application's
    # (with Rust's text for it); the debit is undone.
    assert error.value == ApplicationError("unknown object 99")
    assert host.cell(a, "balance") == 3
    with pytest.raises(ApplicationError, match="cannot transfer 5 with a balance of 3"):
        host.invoke(a, "transfer", {"to": a, "amount": 5})


def test_a_caught_nested_error_lets_the_caller_go_on(host):
    a = host.create("Account", {"owner": "ada", "initial": 3})
    assert host.invoke(a, "try_transfer", [99, 2]) == "kept: unknown object 99"
    assert host.cell(a, "balance") == 3


def test_other_exceptions_become_application_errors(host):
    a = host.create("Account", {"owner": "ada", "initial": 3})
    with pytest.raises(ApplicationError) as error:
        host.invoke(a, "divide", [0])
    assert error.value.value == "ZeroDivisionError: division by zero"
    assert host.cell(a, "balance") == 3


def test_nested_failures_arrive_as_their_own_class(host):
    a = host.create("Account", ["ada"])
    b = host.create("Account", ["bob"])

    def inside():
        with pytest.raises(UnknownFunctionError, match="Account.nope"):
            lambdastore.call(b, "nope")
        with pytest.raises(BadArgumentsError, match="missing parameter `amount`"):
            lambdastore.call(b, "deposit", {})
        with pytest.raises(ApplicationError, match="an account needs an owner"):
            lambdastore.create("Account", [""])
        assert lambdastore.call(b, "get_balance") == 0

    host.with_object(a, inside)


def test_constructor_failures_leave_no_object(host):
    with pytest.raises(ApplicationError):
        host.create("Account", [""])
    assert host.objects() == []
    a = host.create("Account", ["ada"])
    assert host.object_type(a) == "Account"
    assert a == 2, "ids are not reused, even after a rollback"


def test_types_without_constructor_take_no_arguments(host):
    p = host.create("Plain", {})
    assert host.object_type(p) == "Plain"
    with pytest.raises(BadArgumentsError, match="Plain has no constructor, so it takes no arguments"):
        host.create("Plain", [1])


def test_functions_are_found_by_kind(host):
    a = host.create("Account", ["ada"])
    with pytest.raises(UnknownFunctionError, match="Account.open"):
        host.invoke(a, "open", ["x"])
    with pytest.raises(UnknownFunctionError, match="Account._helper"):
        host.invoke(a, "_helper")
    with pytest.raises(UnknownFunctionError, match="Account.version"):
        host.invoke(a, "version")
    assert host.invoke_static("Account", "version") == "1"


def test_static_functions_run_without_an_object(host):
    a = host.create("Account", ["ada", 2])
    b = host.create("Account", ["bob", 5])
    assert host.invoke_static("Account", "total", [[a, b]]) == 7
    assert host.invoke(a, "via_static", [[a, b]]) == 7
    with pytest.raises(Trap, match="static function Account.touch_fields has no object"):
        host.invoke_static("Account", "touch_fields")


def test_readonly_functions_may_not_write(host):
    a = host.create("Account", ["ada"])
    b = host.create("Account", ["bob"])
    with pytest.raises(Trap, match=r"readonly function Account.sneaky_write may not write \(tried to put"):
        host.invoke(a, "sneaky_write")
    with pytest.raises(Trap, match="readonly function Account.write_through_a_callee"):
        host.invoke(a, "write_through_a_callee", [b])
    assert host.cell(b, "balance") == 0


def test_a_trap_undoes_the_whole_workflow(host):
    a = host.create("Account", ["ada", 5])
    host.set_max_depth(4)
    with pytest.raises(Trap, match=r"call depth limit \(4\) exceeded calling Account.recurse"):
        host.invoke(a, "recurse")
    with pytest.raises(Trap, match="contains a NUL byte"):
        host.invoke(a, "bad_field")
    # The mock is usable after a trap.
    assert host.invoke(a, "open_another", ["bob"]) == a + 1


def test_results_that_are_not_json_fail_the_call(host):
    a = host.create("Account", ["ada"])
    with pytest.raises(ApplicationError) as error:
        host.invoke(a, "not_json")
    assert error.value.value == (
        "cannot encode the result as JSON: it contains a non-finite float (NaN or infinity), "
        "which JSON cannot represent"
    )


def test_results_without_json_or_utf_8_and_exits_fail_the_call_and_do_not_trap(host):
    # Each trapped the instance in a component (38000 and a wasm backtrace).
    a = host.create("Account", ["ada"])
    for which, says in [
        ("circular", "Circular reference detected"),
        ("digits", "Exceeds the limit"),
        ("surrogate", "surrogates not allowed"),
    ]:
        with pytest.raises(ApplicationError, match="cannot encode the result as JSON: .*" + says):
            host.invoke(a, "unencodable", [which])
    with pytest.raises(ApplicationError, match="SystemExit: 3"):
        host.invoke(a, "unencodable", ["exit"])


def test_map_call_rolls_back_only_the_failing_target(host):
    a = host.create("Account", ["ada", 2])
    b = host.create("Account", ["bob"])
    c = host.create("Account", ["cy", 1])
    # `divide` writes, then fails: each failed target's write is undone.
    outcomes = host.with_object(a, lambda: lambdastore.map_call([a, c], "divide", [0]))
    assert [outcome for _, outcome in outcomes] == [Err(ApplicationError("ZeroDivisionError: division by zero"))] * 2
    assert [host.cell(x, "balance") for x in (a, c)] == [2, 1]
    outcomes = host.with_object(a, lambda: lambdastore.map_call([a, 99, a, c], "transfer", {"to": b, "amount": 2}))
    assert outcomes == [
        (a, Ok(0)),
        (99, Err(UnknownObjectError(99))),
        (c, Err(ApplicationError("cannot transfer 2 with a balance of 1"))),
    ], "each target once, in order"
    assert [host.cell(x, "balance") for x in (a, b, c)] == [0, 2, 1]


def test_spawns_run_after_the_workflow_when_due(host):
    a = host.create("Account", ["ada"])
    host.invoke(a, "later")
    host.invoke(a, "later", [host.now_micros() + 5_000_000])
    assert host.run_spawned() == [Ok(None)]
    assert host.cell(a, "balance") == 1
    host.set_now_micros(host.now_micros() + 10_000_000)
    assert host.run_spawned() == [Ok(None)]
    assert host.cell(a, "balance") == 2
    with pytest.raises(ApplicationError):
        host.invoke(a, "divide", [0])
    assert host.take_spawned() == []


def test_timers_replace_and_clear(host):
    a = host.create("Account", ["ada"])
    at = host.now_micros() + 1_000
    host.invoke(a, "remind", ["r", at])
    host.invoke(a, "remind", ["r", at + 1])
    [pending] = host.take_spawned()
    assert (pending.target, pending.function, pending.timer, pending.due_micros) == (a, "bump", "r", at + 1)
    host.invoke(a, "remind", ["r", at])
    host.invoke(a, "remind", ["r", 0, True])
    assert host.take_spawned() == []
    with pytest.raises(Trap, match="a timer's name is 1 to 255 bytes, not 0"):
        host.invoke(a, "remind", ["", at])


def test_logs_clock_and_randomness(host):
    a = host.create("Account", ["ada"])
    host.set_seed(1)
    first = host.invoke(a, "chatter")
    host.set_seed(1)
    second = host.invoke(a, "chatter")
    assert first[0] == a and second[0] == a
    assert second[1] == first[1] + 1_000, "each workflow is a later transaction"
    assert first[2] == second[2] == 0x910A2DEC89025CC1, "SplitMix64 from seed 1, as the Rust mock"
    assert [(r.level, r.message, r.object) for r in host.logs()[:4]] == [
        ("debug", "d", a), ("info", "i", a), ("notice", "n", a), ("warning", "w", a),
    ]


def test_without_a_host_the_sdk_says_so():
    with pytest.raises(RuntimeError, match="no host"):
        lambdastore.self_id()


def test_an_unknown_function_reads_once_whoever_says_it():
    assert str(UnknownFunctionError("Account.nope")) == "unknown function Account.nope"
    said = 'function "nope" of type "Account" does not exist'
    assert str(UnknownFunctionError(said)) == said, "the server's own sentence, as it is"
