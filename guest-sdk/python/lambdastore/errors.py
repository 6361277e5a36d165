"""Errors: `CallError` and its subclasses cross the host boundary (the WIT
`call-error` variant); `LambdaError` is what authors raise."""


class LambdaError(Exception):
    """The running function's own error: raise it and the call fails with
    `ApplicationError(message)` for its caller, its writes undone."""

    def __init__(self, message: str):
        message = message if isinstance(message, str) else str(message)
        super().__init__(message)
        self.message = message


class HostTrap(BaseException):
    """What the host does not let a lambda go on from: on the server a trap
    of its instance, which aborts the whole workflow and which nothing in a
    guest can catch; the mock raises its subclass `Trap`."""


def wire_text(text: str) -> str:
    """`text` as it may cross to the host: a lone surrogate (a `str`, but no
    UTF-8) escaped, as `\\udc80`. Unescaped, it trapped the instance."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class CallError(Exception):
    """Why a call failed: one subclass per case of the WIT `call-error`.

    A nested call raises it in its caller, which may catch it and go on
    (the failed call's writes are already undone). `str()` reads like the
    Rust SDK's `Display` of the same error.
    """

    #: The WIT case name, e.g. "bad-arguments".
    case = ""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __eq__(self, other):
        return type(self) is type(other) and self.value == other.value

    def __hash__(self):
        return hash((type(self), self.value))

    def __repr__(self):
        return f"{type(self).__name__}({self.value!r})"


class ApplicationError(CallError):
    """The function failed with an error of its own (its message)."""

    case = "application"

    def __str__(self):
        return self.value


class BadArgumentsError(CallError):
    """The arguments did not decode into the function's parameters."""

    case = "bad-arguments"

    def __str__(self):
        return f"bad arguments: {self.value}"


class UnknownObjectError(CallError):
    """No such object (the value is its id)."""

    case = "unknown-object"

    def __str__(self):
        return f"unknown object {self.value}"


class UnknownFunctionError(CallError):
    """No such type or function: `Type` or `Type.function` from a guest or
    the mock host, the server's own sentence from the host (shown as it is,
    not after "unknown function")."""

    case = "unknown-function"

    def __str__(self):
        # A name has no spaces; the server's sentence does.
        return self.value if " " in self.value else f"unknown function {self.value}"


class NotAllowedError(CallError):
    """The function is protected, or the object belongs to another application."""

    case = "not-allowed"

    def __str__(self):
        return f"not allowed: {self.value}"


CALL_ERRORS = (ApplicationError, BadArgumentsError, UnknownObjectError, UnknownFunctionError, NotAllowedError)


def as_call_error(error: Exception) -> CallError:
    """What a function that raised `error` fails with, for its caller.

    A nested call's error that the function did not catch becomes
    `ApplicationError(str(error))`, as Rust's `?` does in a function
    returning `lambdastore_sdk::Result`: a `BadArgumentsError` from a callee
    must not tell this function's caller that *its* arguments were bad.
    """
    if isinstance(error, LambdaError):
        return ApplicationError(wire_text(error.message))
    message = _text_of(error)
    if isinstance(error, CallError):
        return ApplicationError(message)
    name = type(error).__name__
    return ApplicationError(f"{name}: {message}" if message else name)


def _text_of(error: BaseException) -> str:
    try:
        return wire_text(str(error))
    except Exception as e:  # noqa: BLE001 -- an application's __str__ may raise anything
        return f"(its message could not be made: {type(e).__name__})"
