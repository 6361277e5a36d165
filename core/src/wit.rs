//! The host side of the WIT world `lambdastore:lambda/lambda`
//! (guest-sdk/wit/lambda.wit), generated once by wasmtime for everything
//! that runs lambdas: the extension (host/) and the bench's disaggregated
//! baseline (bench/src/remote.rs). Each implements the generated `Host`
//! traits over its own storage. Host functions may trap (`trappable`):
//! a trap carries what the guest cannot handle (limits, refusals, a
//! database error) out through every wasm frame.

wasmtime::component::bindgen!({
    world: "lambda",
    path: "../guest-sdk/wit",
    imports: { default: trappable },
});

pub use lambdastore::lambda::types::{Direction, Entry, LogLevel};

use crate::model::{self, Description, FieldDesc, FnDesc, TypeDesc};
use lambdastore::lambda::types as wit;

/// What a module's `describe` returned, as the catalog stores it.
impl From<wit::AppDesc> for Description {
    fn from(desc: wit::AppDesc) -> Self {
        Description {
            sdk: desc.sdk,
            types: desc
                .types
                .into_iter()
                .map(|t| TypeDesc {
                    name: t.name,
                    fields: t
                        .fields
                        .into_iter()
                        .map(|f| FieldDesc { name: f.name, kind: field_kind_name(f.kind).into() })
                        .collect(),
                    functions: t
                        .functions
                        .into_iter()
                        .map(|f| FnDesc {
                            name: f.name,
                            kind: f.kind.into(),
                            protected: f.protected,
                            readonly: f.readonly,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl From<wit::FunctionKind> for model::FunctionKind {
    fn from(kind: wit::FunctionKind) -> Self {
        match kind {
            wit::FunctionKind::Constructor => model::FunctionKind::Constructor,
            wit::FunctionKind::Method => model::FunctionKind::Method,
            wit::FunctionKind::Static => model::FunctionKind::Static,
        }
    }
}

impl From<model::FunctionKind> for wit::FunctionKind {
    fn from(kind: model::FunctionKind) -> Self {
        match kind {
            model::FunctionKind::Constructor => wit::FunctionKind::Constructor,
            model::FunctionKind::Method => wit::FunctionKind::Method,
            model::FunctionKind::Static => wit::FunctionKind::Static,
        }
    }
}

fn field_kind_name(kind: wit::FieldKind) -> &'static str {
    match kind {
        wit::FieldKind::Cell => "cell",
        wit::FieldKind::Map => "map",
        wit::FieldKind::MultiMap => "multi-map",
        wit::FieldKind::Set => "set",
    }
}

impl<T: 'static> LambdaPre<T> {
    /// `instantiate` without checking the exports' types again: what
    /// `LambdaPre::new` checked once against the component's types holds
    /// for every instance of it, and the generated `instantiate` checked
    /// both exports at every instantiation (1% of a warm call's backend
    /// CPU).
    pub fn instantiate_checked_once(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<Lambda> {
        let instance = self.instance_pre.instantiate(&mut store)?;
        let export = |store: &mut wasmtime::StoreContextMut<'_, T>, index| {
            instance
                .get_func(store, index)
                .ok_or_else(|| wasmtime::Error::msg("the component lost an export it was checked for"))
        };
        let mut store = store.as_context_mut();
        Ok(Lambda {
            describe: export(&mut store, &self.indices.describe)?,
            dispatch: export(&mut store, &self.indices.dispatch)?,
        })
    }
}
