"""A probe of the sandbox: what a Python lambda may not do (loop forever,
allocate without bound, touch files or sockets) and what it gets from the
host instead of WASI (the log for `print`, the workflow's clock and random
numbers). The tests in tests/tests/limits.rs call it beside the Rust
example `micro`'s equivalents."""

from __future__ import annotations

import random
import time

from lambdastore import App, Cell, LambdaError, lambda_object, readonly


@lambda_object
class Probe:
    calls: Cell[int]

    @readonly
    def spin(self) -> None:
        while True:
            pass

    @readonly
    def alloc(self, bytes: int) -> int:
        blocks = [bytearray(1 << 20) for _ in range(bytes >> 20)]
        return sum(len(b) for b in blocks)

    @readonly
    def fail(self, message: str) -> None:
        raise LambdaError(message)

    @readonly
    def divide(self, n: int) -> int:
        return 1 // n

    @readonly
    def read_file(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    @readonly
    def connect(self, host: str, port: int) -> bool:
        import socket

        socket.create_connection((host, port), timeout=1).close()
        return True

    @readonly
    def environment(self) -> dict:
        import os

        return dict(os.environ)

    @readonly
    def say(self, text: str) -> str:
        print(text)
        return text

    @readonly
    def clock(self) -> float:
        return time.time()

    @readonly
    def draw(self) -> int:
        return random.getrandbits(63)


WitWorld = App(Probe).wit_world()
