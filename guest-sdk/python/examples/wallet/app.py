"""A wallet in Python that the Rust bank (guest-sdk/examples/bank) pays
into: two applications in two languages, and one serializable workflow
across them.

The bank's `transfer(to, amount)` debits its account, records the debit,
then calls `to.deposit(amount, from)`. A Wallet has that method, so a
wallet can be the `to` of a transfer as an account can. The wallet
credits a deposit only when the paying account's newest audit entry, read
back from Rust in the same workflow, is that very debit to this wallet,
and only once: `deposit` called directly, from SQL or another lambda, with
no transfer behind it, is refused and writes nothing. `top_up` runs the
whole loop from Python: Python → Rust → Python → Rust, one transaction.

Calls across applications need `invoke` on the called application, for
the role making the call and for the calling application's owner
(docs/sql-api.md, "Calls across applications").
"""

from __future__ import annotations

from typing import Optional

from lambdastore import App, Cell, LambdaError, Set, call, constructor, lambda_object, readonly, self_id


@lambda_object
class Wallet:
    """Money held outside the bank, paid in by bank transfers."""

    holder: Cell[str]
    held: Cell[int]
    # The (account, audit sequence number) of every debit credited here.
    credited: Set[tuple[int, int]]

    @constructor
    def new(self, holder: str):
        if not holder:
            raise LambdaError("holder must not be empty")
        self.holder.set(holder)
        self.held.set(0)

    @readonly
    def balance(self) -> int:
        """What the wallet holds."""
        return self.held.get_or_default()

    def deposit(self, amount: int, from_: Optional[int] = None) -> int:
        """Credits `amount`, which bank account `from_` has just debited
        for this wallet (the bank's `transfer` calls this); the new
        balance."""
        if amount <= 0:
            raise LambdaError(f"amount must be positive, got {amount}")
        if from_ is None:
            raise LambdaError("a deposit comes from a bank account's transfer")
        newest = call(from_, "history", {"limit": 1})
        debit = newest[0] if newest else {}
        backed = debit.get("kind") == "debit" and debit.get("amount") == amount
        if not backed or debit.get("counterparty") != self_id():
            raise LambdaError(f"no transfer of {amount} from account {from_} to this wallet backs the deposit")
        if self.credited.contains((from_, debit["seq"])):
            raise LambdaError(f"account {from_}'s debit {debit['seq']} is already credited")
        self.credited.insert((from_, debit["seq"]))
        held = self.held.get_or_default() + amount
        self.held.set(held)
        return held

    def top_up(self, account: int, amount: int) -> int:
        """Moves `amount` from bank `account` into this wallet, through the
        bank's own transfer (which calls `deposit` back); the new balance.
        The bank's refusal (insufficient funds) is this call's error."""
        call(account, "transfer", {"to": self_id(), "amount": amount})
        return self.held.get_or_default()

    def spend(self, amount: int) -> int:
        """Takes `amount` out of the wallet; the new balance."""
        held = self.held.get_or_default()
        if not 0 < amount <= held:
            raise LambdaError(f"cannot spend {amount}: the wallet holds {held}")
        self.held.set(held - amount)
        return held - amount


app = App(Wallet)
WitWorld = app.wit_world()
