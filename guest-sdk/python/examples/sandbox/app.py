"""A probe of the sandbox: what a Python lambda may not do (loop forever,
allocate without bound, touch files or sockets), what it gets from the host
instead of WASI (the log for `print`, the workflow's clock and random
numbers), that a module the component lacks is an ImportError it may
catch, what the standard library does without WASI (`standard_library`),
and that each call starts from the snapshot (`scribble`). The tests in
tests/tests/limits.rs call it beside the Rust example `micro`'s
equivalents."""

from __future__ import annotations

import importlib
import os
import random
import secrets
import tempfile
import time
import traceback
import uuid
import warnings
from datetime import datetime, timezone

from lambdastore import App, Cell, LambdaError, lambda_object, readonly


# 2 MiB made while the component is built, so part of the interpreter's
# snapshot: `scribble` writes every other page of it, 256 separate runs of
# written pages for the host to reset when the call's instance ends.
_SCRATCH = bytearray(2 << 20)


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
    def optional(self, module: str) -> str:
        """A lambda that can do without a module: an import at run time of
        one the component does not hold raises ImportError, which it may
        catch."""
        try:
            importlib.import_module(module)
        except ImportError as e:
            return type(e).__name__
        return "imported"

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
    def utc_now(self) -> float:
        return datetime.now(timezone.utc).timestamp()

    @readonly
    def draw(self) -> int:
        return random.getrandbits(63)

    @readonly
    def seeding(self) -> str:
        """When the SDK seeds `random`'s generator: at a call's first draw,
        or at the start of every call (lambdastore/sandbox.py)."""
        from lambdastore import sandbox

        return "every call" if sandbox.seed_each_call else "first draw"

    @readonly
    def draw_seeded(self, seed: int) -> list:
        random.seed(seed)
        return [random.getrandbits(63), random.random()]

    @readonly
    def standard_library(self) -> dict:
        """What the standard library asks WASI for, answered by the host or
        refused as an exception (lambdastore/sandbox.py): each of these was
        a trap, 38000."""

        def outcome(f):
            try:
                return f()
            except Exception as e:
                return type(e).__name__

        return {
            "uuid4": str(uuid.uuid4()),
            "token": secrets.token_hex(8),
            "urandom": os.urandom(5).hex(),
            "unseeded": random.Random().random(),
            "exists": os.path.exists("/etc/passwd"),
            "stat": outcome(lambda: os.stat("/")),
            "write": outcome(lambda: os.write(1, b"x")),
            "isatty": os.isatty(1),
            "input": outcome(input),
            "sleep": outcome(lambda: time.sleep(0.1)),
            "today": time.strftime("%Y-%m-%d", time.gmtime()),
            "warn": outcome(lambda: warnings.warn("careful")),
            "stack": "".join(traceback.format_stack()).count("File"),
            "tempdir": outcome(tempfile.gettempdir),
        }

    @readonly
    def raise_base(self) -> None:
        raise KeyboardInterrupt()

    @readonly
    def fail_surrogate(self) -> None:
        raise LambdaError("bad \ud800 message")

    @readonly
    def log_surrogate(self) -> str:
        print("x\ud800")
        return "logged"

    @readonly
    def keyword_only(self, *, a: int, b: int = 2) -> int:
        return a * 10 + b

    @readonly
    def scribble(self) -> int:
        """Counts the pages of `_SCRATCH` a previous call left written (a
        fresh instance has none), then writes a byte into every other page."""
        left = sum(1 for i in range(0, len(_SCRATCH), 4096) if _SCRATCH[i])
        for i in range(0, len(_SCRATCH), 8192):
            _SCRATCH[i] = 1
        return left


WitWorld = App(Probe).wit_world()
