"""A probe of `random` where the application binds one of its functions
before the snapshot is taken (tests/tests/limits.rs): the SDK then seeds the
generator at the start of every call instead of at a call's first draw,
which such a name would bypass."""

from __future__ import annotations

from random import getrandbits

from lambdastore import App, Cell, lambda_object, readonly


@lambda_object
class Draws:
    calls: Cell[int]

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
