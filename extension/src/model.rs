//! The extension's vocabulary: plain data that every layer passes around
//! (objects, entry keys and positions, module versions and what they
//! describe), with no behaviour that touches PostgreSQL or wasmtime. It is
//! the bottom layer, next to error.rs and gucs.rs.

use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Where an object lives: its application and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub app: String,
    pub type_name: String,
}

/// (object, field, key): the order of the `entries` primary key, which is
/// also byte order because `field` uses the "C" collation.
pub type EntryKey = (i64, String, Vec<u8>);

/// A buffered entry: `None` is a delete.
pub type Slot = Option<Vec<u8>>;

/// A position in an object's key space, in `entries` primary-key order.
pub type Position = (String, Vec<u8>);

/// Identifies an entry set: (object, lower bound).
pub type SetId = (i64, Position);

/// An object's guards in order, starting at ("", ""): each set covers
/// [its guard, the next guard). Shared between workflows of a backend
/// (catalog/cache.rs keeps them per split count).
pub type Guards = Rc<Vec<Position>>;

/// A call spawned by a workflow: inserted as a job when the workflow
/// commits (an outbox), so it exists only if the workflow commits.
#[derive(Clone, Debug)]
pub struct Spawned {
    pub object: i64,
    pub app: String,
    pub method: String,
    /// JSON text.
    pub args: String,
}

/// What identifies a loaded module version in a backend's cache. The id
/// alone is not enough: ids start again after the extension is recreated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    pub module_id: i64,
    pub app: String,
    pub sha256: String,
}

/// What a module's `describe` export says, as stored in `modules.description`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Description {
    pub sdk: String,
    pub types: Vec<TypeDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypeDesc {
    pub name: String,
    pub fields: Vec<FieldDesc>,
    pub functions: Vec<FnDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FieldDesc {
    pub name: String,
    /// "cell", "map", "multi-map" or "set".
    pub kind: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FnDesc {
    pub name: String,
    pub kind: FunctionKind,
    pub protected: bool,
    pub readonly: bool,
}

/// A function's kind, stored as "constructor", "method" or "static".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Constructor,
    Method,
    Static,
}

impl FunctionKind {
    /// As messages name it.
    pub fn name(self) -> &'static str {
        match self {
            FunctionKind::Constructor => "constructor",
            FunctionKind::Method => "method",
            FunctionKind::Static => "static function",
        }
    }
}
