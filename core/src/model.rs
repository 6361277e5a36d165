//! The vocabulary: plain data that every layer of the extension passes
//! around (objects, entry keys and positions, module versions and what they
//! describe), with no behaviour that touches PostgreSQL or wasmtime.

use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Where an object lives: its application and type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Spawned {
    pub object: i64,
    pub app: String,
    pub method: String,
    /// JSON text.
    pub args: String,
    /// When the job is due, in microseconds since the Unix epoch; None:
    /// at once.
    #[serde(default)]
    pub due_micros: Option<i64>,
    /// The timer of `object` this job is: it replaces the job of a timer
    /// of that name still pending. With an empty `method`, the timer is
    /// cleared and no job queued.
    #[serde(default)]
    pub timer: Option<String>,
}

/// What identifies a loaded module version in a backend's cache. The id
/// alone is not enough: ids start again after the extension is recreated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModuleKey {
    pub module_id: i64,
    pub app: String,
    pub sha256: String,
}

/// A nested method call, as the caller makes it (host/calls.rs); sent to
/// another Citus node when the object is stored there (cluster/remote.rs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MethodCall {
    pub object: i64,
    pub method: String,
    /// JSON text.
    pub args: String,
    /// Whether the caller is readonly: its callees stay readonly.
    pub readonly: bool,
    /// The callee's depth (the top-level call is 0).
    pub depth: u32,
}

/// What a run of a call forwarded to another node got from the host, in
/// order, which a later run of the same call must get again (cluster/remote.rs):
/// random numbers, clock readings, ids of objects it created, and the
/// outcome of each call it needed on a third node (`Err`: the callee's own
/// error, for the caller to handle).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Draw {
    Random(u64),
    Now(i64),
    ObjectId(i64),
    Call { call: MethodCall, outcome: Result<String, CallFailure> },
}

/// The value of a draw of each kind (`Workflow::draw` takes the kind as
/// its variant and one of these).
impl Draw {
    #[inline]
    pub fn random(&self) -> Option<u64> {
        if let Draw::Random(n) = self {
            Some(*n)
        } else {
            None
        }
    }

    #[inline]
    pub fn now(&self) -> Option<i64> {
        if let Draw::Now(micros) = self {
            Some(*micros)
        } else {
            None
        }
    }

    #[inline]
    pub fn object_id(&self) -> Option<i64> {
        if let Draw::ObjectId(id) = self {
            Some(*id)
        } else {
            None
        }
    }
}

/// What travels with a call forwarded to the node holding its object,
/// besides the call itself (`_call_here`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Forwarded {
    /// A nested call: the code version of the calling workflow (the callee
    /// runs the same), whether the caller is readonly, the callee's depth
    /// and the job the workflow runs as. None for a call from SQL.
    pub nested: Option<Nested>,
    /// What earlier runs of this call drew, to get again.
    pub tape: Vec<Draw>,
    /// A `create_object` from SQL sent by a node that holds no objects:
    /// the call's object only routes it (the new object gets an id of the
    /// node it lands on), its args are the constructor's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<Create>,
    /// The call is the whole of the sender's transaction (an autocommit
    /// `SELECT lambda_invoke(...)`), sent outside any distributed
    /// transaction: the node runs and commits it as a transaction of its
    /// own, driving the calls and spawns it needs on other nodes itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alone: bool,
    /// A light replica's request to the object's owner (cluster/replica.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<ReplicaAsk>,
    /// The sender's transaction holds entry sets for writing (on its node
    /// or on others it reached): the call's part must not wait for another
    /// transaction's writers, which may be waiting for those.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holding: bool,
}

/// What a light replica asks of the node that owns an object.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaAsk {
    /// The object's sets and their versions now, with its entries unless
    /// every set is still at the version the replica's copy has (`have`,
    /// under split counter `splits`).
    Fetch { splits: u64, have: Vec<(Position, i64)> },
    /// Validate a workflow run on the replica (its reads: sets at the
    /// versions seen, under split counter `splits`) and apply its writes
    /// (field, key, value or None for a delete), in the caller's transaction.
    Commit { splits: u64, reads: Vec<(Position, i64)>, writes: Vec<(String, Vec<u8>, Option<Vec<u8>>)> },
}

/// The owner's answer to `ReplicaAsk::Fetch`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ReplicaSnapshot {
    pub info: ObjectInfo,
    pub module: ModuleKey,
    pub splits: u64,
    /// Every set by lower bound, in order, with its version.
    pub sets: Vec<(Position, i64)>,
    /// Every entry (field, key, value) in order; None when the replica's
    /// copy is current.
    pub entries: Option<Vec<EntryRow>>,
}

/// An entry as stored: its field, key and value.
pub type EntryRow = (String, Vec<u8>, Vec<u8>);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Create {
    pub app: String,
    pub type_name: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Nested {
    pub module: ModuleKey,
    pub readonly: bool,
    pub depth: u32,
    pub job: Option<i64>,
    /// The code versions of the other applications the workflow has run
    /// (cross-application calls): the callee runs those too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<ModuleKey>,
}

/// A call's failure that its caller receives as a value (the WIT
/// `call-error`), from this node or another: the callee's own error, or a
/// refusal before it ran (no such object or function, arguments that do
/// not fit, not allowed). The mock host returns the same ones
/// (guest-sdk/sdk/src/mock.rs). Everything else (a trap, a limit, a
/// conflict, the depth) aborts the whole workflow: the caller could not
/// go on consistently.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallFailure {
    Application(String),
    BadArguments(String),
    UnknownObject(i64),
    /// No such type: `unknown-function` to a guest, 42704 at the top.
    UnknownType(String),
    UnknownFunction(String),
    NotAllowed(String),
}

/// What a node answers to a call forwarded to it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// The call returned and its workflow committed (in this transaction):
    /// its result, and the calls it spawned on objects stored on other
    /// nodes, for the sending node to queue there.
    /// `versions`: the code versions its workflow ran, for the sender's
    /// workflow to pin (cross-application calls).
    /// `loading_micros` (in every answer): the time it spent loading code,
    /// which the sender's deadline does not count either.
    Done {
        result: String,
        spawned: Vec<Spawned>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        versions: Vec<ModuleKey>,
        #[serde(default, skip_serializing_if = "is_zero")]
        loading_micros: u64,
    },
    /// The call failed in a way its caller may handle; its workflow wrote
    /// nothing.
    Failed {
        failure: CallFailure,
        #[serde(default, skip_serializing_if = "is_zero")]
        loading_micros: u64,
    },
    /// The call needs `call`, on an object of another node, first: what it
    /// drew until then, the objects it touched (no call may come back to
    /// them before it ends), its code version and those of the other
    /// applications it ran. Nothing of the run stays: it runs again, given
    /// the outcome.
    Needs {
        call: MethodCall,
        tape: Vec<Draw>,
        touched: Vec<i64>,
        module: ModuleKey,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        versions: Vec<ModuleKey>,
        #[serde(default, skip_serializing_if = "is_zero")]
        loading_micros: u64,
    },
}

impl Reply {
    /// The time the answering node spent loading code for the call.
    pub fn loading_micros(&self) -> u64 {
        match self {
            Reply::Done { loading_micros, .. }
            | Reply::Failed { loading_micros, .. }
            | Reply::Needs { loading_micros, .. } => *loading_micros,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a module's `describe` export says, as stored in `modules.description`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Description {
    pub sdk: String,
    pub types: Vec<TypeDesc>,
}

impl Description {
    #[inline]
    pub fn type_desc(&self, name: &str) -> Option<&TypeDesc> {
        self.types.iter().find(|t| t.name == name)
    }

    /// The function `name` of `type_name`, of whatever kind.
    #[inline]
    pub fn function(&self, type_name: &str, name: &str) -> Option<&FnDesc> {
        self.type_desc(type_name)?.functions.iter().find(|f| f.name == name)
    }
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
    #[inline]
    pub fn name(self) -> &'static str {
        match self {
            FunctionKind::Constructor => "constructor",
            FunctionKind::Method => "method",
            FunctionKind::Static => "static function",
        }
    }
}
