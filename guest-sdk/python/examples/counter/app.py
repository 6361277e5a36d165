"""The smallest LambdaStore application: a counter object (the Python twin
of guest-sdk/examples/counter)."""

from __future__ import annotations

from typing import Optional

from lambdastore import App, Cell, LambdaError, Ok, constructor, lambda_object, map_call, readonly

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@lambda_object
class Counter:
    """A counter: one integer cell."""

    value: Cell[int]

    @constructor
    def new(self, initial: Optional[int]):
        """Starts at `initial`, or 0."""
        self.value.set(0 if initial is None else initial)

    @readonly
    def get(self) -> int:
        """The current value."""
        return self.value.get_or_default()

    def increment(self) -> int:
        """Adds one; returns the new value."""
        return self.add(1)

    def add(self, n: int) -> int:
        """Adds `n`; returns the new value, or fails if it would not fit in
        an i64 (the value is then unchanged)."""
        value = self.value.get_or_default()
        total = value + n
        # Python integers do not overflow; the stored value must stay an i64.
        if not I64_MIN <= total <= I64_MAX:
            raise LambdaError(f"counter overflow: {value} + {n}")
        self.value.set(total)
        return total

    def add_to_each(self, counters: list[Counter], n: int) -> list:
        """Adds `n` to each of `counters` with one map call, and adds here
        the number that took it: each counter's new value, or why it failed
        (that counter unchanged, the others kept)."""
        outcomes = map_call(counters, "add", {"n": n})
        self.add(sum(1 for _, outcome in outcomes if isinstance(outcome, Ok)))
        # The shape of Rust's `Vec<(ObjectId, Result<i64, String>)>` in JSON.
        return [
            [target, {"Ok": outcome.value} if isinstance(outcome, Ok) else {"Err": str(outcome.error)}]
            for target, outcome in outcomes
        ]


app = App(Counter)
WitWorld = app.wit_world()
