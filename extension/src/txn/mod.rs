//! The state of one workflow: the tree of nested calls started by one
//! top-level `lambda_invoke`, `create_object` or `invoke_static`.
//!
//! Writes are buffered here and applied only when the top-level call
//! returns successfully, so a failed workflow leaves nothing behind. Each
//! nested call takes a savepoint in the buffer: when the callee returns an
//! error of its own, its writes (and those of its callees) are undone and
//! the caller may carry on.

mod buffer;

pub use buffer::{EntryKey, WriteBuffer};

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Where an object lives: its application and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub app: String,
    pub type_name: String,
}

pub struct Workflow {
    pub timeout: Duration,
    pub deadline: Instant,
    pub writes: RefCell<WriteBuffer>,
    /// Objects looked up or created during this workflow.
    objects: RefCell<HashMap<i64, ObjectInfo>>,
}

impl Workflow {
    pub fn new(timeout: Duration) -> Self {
        Workflow {
            timeout,
            deadline: Instant::now() + timeout,
            writes: RefCell::new(WriteBuffer::default()),
            objects: RefCell::new(HashMap::new()),
        }
    }

    pub fn known_object(&self, id: i64) -> Option<ObjectInfo> {
        self.objects.borrow().get(&id).cloned()
    }

    pub fn remember_object(&self, id: i64, info: ObjectInfo) {
        self.objects.borrow_mut().insert(id, info);
    }

    /// Undoes everything after `savepoint`, including objects created since.
    pub fn rollback_to(&self, savepoint: usize) {
        let forgotten = self.writes.borrow_mut().rollback_to(savepoint);
        let mut objects = self.objects.borrow_mut();
        for id in forgotten {
            objects.remove(&id);
        }
    }
}
