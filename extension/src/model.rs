//! The extension's vocabulary: plain data that every layer passes around
//! (objects, entry keys and positions, module versions and what they
//! describe), with no behaviour that touches PostgreSQL or wasmtime. It is
//! the bottom layer, next to error.rs and gucs.rs.

use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Where an object lives: its application and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectInfo {
    pub(crate) app: String,
    pub(crate) type_name: String,
}

/// (object, field, key): the order of the `entries` primary key, which is
/// also byte order because `field` uses the "C" collation.
pub(crate) type EntryKey = (i64, String, Vec<u8>);

/// A buffered entry: `None` is a delete.
pub(crate) type Slot = Option<Vec<u8>>;

/// A position in an object's key space, in `entries` primary-key order.
pub(crate) type Position = (String, Vec<u8>);

/// Identifies an entry set: (object, lower bound).
pub(crate) type SetId = (i64, Position);

/// An object's guards in order, starting at ("", ""): each set covers
/// [its guard, the next guard). Shared between workflows of a backend
/// (catalog/cache.rs keeps them per split count).
pub(crate) type Guards = Rc<Vec<Position>>;

/// A call spawned by a workflow: inserted as a job when the workflow
/// commits (an outbox), so it exists only if the workflow commits.
#[derive(Clone, Debug)]
pub(crate) struct Spawned {
    pub(crate) object: i64,
    pub(crate) app: String,
    pub(crate) method: String,
    /// JSON text.
    pub(crate) args: String,
}

/// What identifies a loaded module version in a backend's cache. The id
/// alone is not enough: ids start again after the extension is recreated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ModuleKey {
    pub(crate) module_id: i64,
    pub(crate) app: String,
    pub(crate) sha256: String,
}

/// What a module's `describe` export says, as stored in `modules.description`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Description {
    pub(crate) sdk: String,
    pub(crate) types: Vec<TypeDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TypeDesc {
    pub(crate) name: String,
    pub(crate) fields: Vec<FieldDesc>,
    pub(crate) functions: Vec<FnDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FieldDesc {
    pub(crate) name: String,
    /// "cell", "map", "multi-map" or "set".
    pub(crate) kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FnDesc {
    pub(crate) name: String,
    pub(crate) kind: FunctionKind,
    pub(crate) protected: bool,
    pub(crate) readonly: bool,
}

/// A function's kind, stored as "constructor", "method" or "static".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FunctionKind {
    Constructor,
    Method,
    Static,
}

impl FunctionKind {
    /// As messages name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FunctionKind::Constructor => "constructor",
            FunctionKind::Method => "method",
            FunctionKind::Static => "static function",
        }
    }
}
