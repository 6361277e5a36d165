//! Conversions between the SDK's types and the WIT bindings' types, used by
//! the host imports and by the `Guest` implementation that `app!` generates.

use crate::bindings::lambdastore::lambda::types as wit;
use crate::desc::{AppDesc, Application, FieldKind, FunctionKind};
use crate::{CallError, ObjectId};

impl From<wit::CallError> for CallError {
    fn from(e: wit::CallError) -> Self {
        match e {
            wit::CallError::Application(m) => CallError::Application(m),
            wit::CallError::BadArguments(m) => CallError::BadArguments(m),
            wit::CallError::UnknownObject(id) => CallError::UnknownObject(id),
            wit::CallError::UnknownFunction(m) => CallError::UnknownFunction(m),
            wit::CallError::NotAllowed(m) => CallError::NotAllowed(m),
        }
    }
}

impl From<CallError> for wit::CallError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Application(m) => wit::CallError::Application(m),
            CallError::BadArguments(m) => wit::CallError::BadArguments(m),
            CallError::UnknownObject(id) => wit::CallError::UnknownObject(id),
            CallError::UnknownFunction(m) => wit::CallError::UnknownFunction(m),
            CallError::NotAllowed(m) => wit::CallError::NotAllowed(m),
        }
    }
}

/// `describe` export of application `A`.
pub fn describe<A: Application>() -> wit::AppDesc {
    let AppDesc { sdk, types } = A::describe();
    wit::AppDesc {
        sdk,
        types: types
            .into_iter()
            .map(|t| wit::TypeDesc {
                name: t.name,
                fields: t
                    .fields
                    .into_iter()
                    .map(|f| wit::FieldDesc {
                        name: f.name,
                        kind: match f.kind {
                            FieldKind::Cell => wit::FieldKind::Cell,
                            FieldKind::Map => wit::FieldKind::Map,
                            FieldKind::MultiMap => wit::FieldKind::MultiMap,
                            FieldKind::Set => wit::FieldKind::Set,
                        },
                    })
                    .collect(),
                functions: t
                    .functions
                    .into_iter()
                    .map(|f| wit::FunctionDesc {
                        name: f.name,
                        kind: match f.kind {
                            FunctionKind::Constructor => wit::FunctionKind::Constructor,
                            FunctionKind::Method => wit::FunctionKind::Method,
                            FunctionKind::Static => wit::FunctionKind::Static,
                        },
                        protected: f.protected,
                        readonly: f.readonly,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// `dispatch` export of application `A`.
pub fn dispatch<A: Application>(
    kind: wit::FunctionKind,
    type_name: &str,
    function: &str,
    object: ObjectId,
    args: &str,
) -> Result<String, wit::CallError> {
    let kind = match kind {
        wit::FunctionKind::Constructor => FunctionKind::Constructor,
        wit::FunctionKind::Method => FunctionKind::Method,
        wit::FunctionKind::Static => FunctionKind::Static,
    };
    report_panics();
    A::dispatch(kind, type_name, function, object, args).map_err(Into::into)
}

/// A panic traps, and the trap carries only a backtrace: log the panic's
/// message and location to the server log first.
fn report_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            crate::host::log(crate::host::LogLevel::Warning, &format!("lambda {info}"));
        }))
    });
}
