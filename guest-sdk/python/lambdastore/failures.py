"""Failures the running function did not see: a stored value or key that
does not decode as its field's type. Field accessors stay simple for
authors (such a value reads as absent); the function's call fails when it
returns, so the host undoes everything it wrote, as in the Rust SDK."""

from .errors import ApplicationError

# One slot per running function: a nested call (on the mock host, in the
# same interpreter) sees only its own failures.
_pending = []


def fail_later(message: str) -> None:
    """Makes the running function's call fail with `message` once it
    returns. The first failure wins: it is the cause of the others."""
    if _pending and _pending[-1] is None:
        _pending[-1] = message


def run_function(f):
    """Runs one guest function `f()`, turning a deferred failure into its error."""
    _pending.append(None)
    try:
        result = f()
    finally:
        message = _pending.pop()
    if message is not None:
        raise ApplicationError(message)
    return result
