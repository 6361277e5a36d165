//! Errors: [`CallError`] crosses the host boundary, [`Error`] is for authors.

use std::fmt;

use crate::ObjectId;

/// Why a call failed: the WIT `call-error` variant.
///
/// A nested call returns it to its caller, which may handle it and continue
/// (the failed call's writes are already undone). A function that returns
/// `Err` is reported to its own caller as [`CallError::Application`].
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::CallError;
///
/// let e = CallError::Application("insufficient funds".into());
/// assert_eq!(e.to_string(), "insufficient funds");
/// assert_eq!(CallError::UnknownObject(7).to_string(), "unknown object 7");
/// assert_eq!(CallError::UnknownFunction("Counter.nope".into()).to_string(), "unknown function Counter.nope");
/// let said = r#"function "nope" of type "Counter" does not exist"#;
/// assert_eq!(CallError::UnknownFunction(said.into()).to_string(), said);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The function returned an error of its own (its message).
    #[error("{0}")]
    Application(String),
    /// The arguments did not decode into the function's parameters.
    #[error("bad arguments: {0}")]
    BadArguments(String),
    /// No such object.
    #[error("unknown object {0}")]
    UnknownObject(ObjectId),
    /// No such type or function: `Type` or `Type.function` from a guest
    /// or a mock host, the server's own sentence from the host (shown as
    /// it is, not after "unknown function").
    #[error("{}", unknown_function(.0))]
    UnknownFunction(String),
    /// The function is protected, or the object belongs to another application.
    #[error("not allowed: {0}")]
    NotAllowed(String),
}

/// `UnknownFunction`'s text: a name (names have no spaces) after
/// "unknown function", a sentence as it is.
fn unknown_function(what: &str) -> String {
    if what.contains(' ') {
        what.to_string()
    } else {
        format!("unknown function {what}")
    }
}

/// An error message for lambda authors: return `Result<T>` from a function and
/// `Err` reaches the caller as [`CallError::Application`] with this message.
///
/// Any [`std::error::Error`] converts into it, so `?` works on nested calls
/// and parsing. Like `anyhow::Error`, it deliberately does not implement
/// `std::error::Error` itself: that would make the blanket `From` conflict.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::{Error, Result};
///
/// fn withdraw(balance: i64, amount: i64) -> Result<i64> {
///     if amount > balance {
///         return Err(Error::new(format!("insufficient funds: {balance} < {amount}")));
///     }
///     let parsed: i64 = "12".parse()?; // any std error converts
///     Ok(balance - amount + parsed - 12)
/// }
/// assert_eq!(withdraw(5, 3).unwrap(), 2);
/// assert_eq!(withdraw(1, 3).unwrap_err().to_string(), "insufficient funds: 1 < 3");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

impl Error {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Error { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.message, f)
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Self {
        Error::new(e.to_string())
    }
}

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns early with an [`Error`] built from a format string.
///
/// # Examples
///
/// ```
/// use lambdastore_sdk::{bail, Result};
///
/// fn check(amount: i64) -> Result<()> {
///     if amount <= 0 {
///         bail!("amount must be positive, got {amount}");
///     }
///     Ok(())
/// }
/// assert_eq!(check(-1).unwrap_err().to_string(), "amount must be positive, got -1");
/// ```
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return ::core::result::Result::Err($crate::Error::new(::std::format!($($arg)*)))
    };
}
