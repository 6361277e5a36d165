"""A probe of `random` where the application binds one of its functions
before the snapshot is taken (tests/tests/limits.rs): the SDK then seeds the
generator at the start of every call instead of at a call's first draw,
which such a name would bypass. Written without `from __future__ import
annotations`, so the component's interpreter (CPython 3.14) defers its
annotations: its field must still be found (`count`)."""

from random import getrandbits

from lambdastore import App, Cell, lambda_object, readonly


@lambda_object
class Draws:
    calls: Cell[int]

    def count(self) -> int:
        self.calls.set(self.calls.get_or_default() + 1)
        return self.calls.get_or_default()

    @readonly
    def draw(self) -> int:
        return getrandbits(63)

    @readonly
    def seeding(self) -> str:
        """When the SDK seeds `random`'s generator: at a call's first draw,
        or at the start of every call (lambdastore/sandbox.py)."""
        from lambdastore import sandbox

        return "every call" if sandbox.seed_each_call else "first draw"


WitWorld = App(Draws).wit_world()
