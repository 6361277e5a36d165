"""Errors: `CallError` and its subclasses cross the host boundary (the WIT
`call-error` variant); `LambdaError` is what authors raise."""


class LambdaError(Exception):
    """The running function's own error: raise it and the call fails with
    `ApplicationError(message)` for its caller, its writes undone."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


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
        return ApplicationError(error.message)
    if isinstance(error, CallError):
        return ApplicationError(str(error))
    message = str(error)
    name = type(error).__name__
    return ApplicationError(f"{name}: {message}" if message else name)
