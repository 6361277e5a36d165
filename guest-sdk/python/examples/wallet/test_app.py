"""The wallet on the mock host, beside a stand-in for the Rust bank's
account (the mock runs one application of one language; the server runs
the wallet against the real bank: tests/tests/apps.rs)."""

from __future__ import annotations

import pytest

from app import Wallet
from lambdastore import App, ApplicationError, Cell, LambdaError, Map, call, constructor, lambda_object, self_id
from lambdastore.mock import MockHost


@lambda_object
class Account:
    """The bank's `transfer` and `history`, as guest-sdk/examples/bank has them."""

    balance: Cell[int]
    audit: Map[int, dict]

    @constructor
    def new(self, owner: str, initial: int):
        self.balance.set(initial)

    def transfer(self, to: int, amount: int) -> int:
        balance = self.balance.get_or_default()
        if amount > balance:
            raise LambdaError(f"insufficient funds: balance {balance}, transfer {amount}")
        self.balance.set(balance - amount)
        newest = self.audit.last()
        seq = newest[0] + 1 if newest else 1
        self.audit.insert(seq, {"kind": "debit", "amount": amount, "counterparty": to, "at_micros": 0})
        call(to, "deposit", {"amount": amount, "from": self_id()})
        return balance - amount

    def history(self, limit: int) -> list:
        return [{"seq": seq, **entry} for seq, entry in self.audit.iter().rev().limit(limit)]


@pytest.fixture
def host():
    return MockHost(App(Wallet, Account))


def test_a_transfer_to_a_wallet_credits_it_once(host):
    wallet = host.create("Wallet", {"holder": "ada"})
    account = host.create("Account", {"owner": "ada", "initial": 100})
    assert host.invoke(account, "transfer", {"to": wallet, "amount": 30}) == 70
    assert host.invoke(wallet, "top_up", {"account": account, "amount": 20}) == 50
    assert host.invoke(wallet, "balance") == 50
    assert host.cell(account, "balance") == 50


def test_a_deposit_without_a_transfer_behind_it_is_refused_and_writes_nothing(host):
    wallet = host.create("Wallet", {"holder": "ada"})
    account = host.create("Account", {"owner": "ada", "initial": 100})
    with pytest.raises(ApplicationError, match="no transfer of 5"):
        host.invoke(wallet, "deposit", {"amount": 5, "from": account})
    host.invoke(account, "transfer", {"to": wallet, "amount": 5})
    # The same debit cannot be credited twice.
    with pytest.raises(ApplicationError, match="already credited"):
        host.invoke(wallet, "deposit", {"amount": 5, "from": account})
    assert host.invoke(wallet, "balance") == 5


def test_a_refused_top_up_leaves_both_sides_as_they_were(host):
    wallet = host.create("Wallet", {"holder": "ada"})
    account = host.create("Account", {"owner": "ada", "initial": 10})
    with pytest.raises(ApplicationError, match="insufficient funds"):
        host.invoke(wallet, "top_up", {"account": account, "amount": 11})
    assert (host.invoke(wallet, "balance"), host.cell(account, "balance")) == (0, 10)
    with pytest.raises(ApplicationError, match="cannot spend 1"):
        host.invoke(wallet, "spend", {"amount": 1})


def test_from_underscore_is_the_parameter_from():
    deposit = next(f for f in App(Wallet).describe().type_desc("Wallet").functions if f.name == "deposit")
    assert [p.name for p in deposit.params] == ["amount", "from"]
