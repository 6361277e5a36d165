"""Run by the interpreter's start-up inside a component as componentize-py
builds it (this directory is on its path; `build.sh`), before any module of
the application: `datetime` is its pure-Python implementation there, whose
clock is `time.time()`, which the SDK points at the host's (the workflow's)
clock. The C one reads WASI's clock, a stub that traps."""

import sys

if sys.platform == "wasi":
    sys.modules["_datetime"] = None  # `from _datetime import *` fails: datetime falls back to _pydatetime
