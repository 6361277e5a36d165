//! Where rows live once `lambdastore.distribute()` has handed the tables to
//! Citus: the per-object tables (objects, entries, entry_sets, jobs) are
//! hash-distributed by object id and colocated, the application tables are
//! reference tables with a copy on every node.
//!
//! The catalog never lets Citus plan its own statements. On a node, an
//! object's rows are in the local shard relations (`entries_102008`), and a
//! statement the catalog runs for an object names them directly: Citus
//! forbids distributed queries inside a query it sent to a shard (a call
//! forwarded here runs inside one), the primary-key probes bypass the
//! planner altogether, and the shell tables on a node are empty. Reference
//! tables are read from this node's copy and written through Citus, which
//! writes every copy in one distributed transaction.
//!
//! The layout is read from Citus' metadata (`pg_dist_shard`,
//! `pg_dist_placement`, `pg_dist_node`, `pg_dist_local_group`) once per
//! backend and read again after every relcache invalidation, which Citus
//! sends when shards are created or moved.

// Plain catalog reads, never rewritten (rewriting needs the layout).
use super::query_cluster as query;
use crate::error::{LambdaError, Result};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Distributed by object id, colocated: one shard of each per hash range.
const COLOCATED: [&str; 4] = ["objects", "entries", "entry_sets", "jobs"];
/// Reference tables: one shard, a placement on every node.
const REFERENCE: [&str; 5] = ["applications", "modules", "object_types", "grants", "api_keys"];

/// One hash range of the colocated tables.
struct Shard {
    /// The lowest hash in the range (it ends where the next begins).
    min: i32,
    /// The node holding it: its group, and host:port for messages.
    group: i32,
    node: String,
    /// The shard id of each of `COLOCATED`, in that order.
    ids: [i64; COLOCATED.len()],
}

pub(crate) struct Layout {
    local_group: i32,
    /// By `min`, covering the whole int32 hash space.
    shards: Vec<Shard>,
    /// The shard id of each of `REFERENCE`, in that order.
    reference: [i64; REFERENCE.len()],
    /// Statements rewritten so far, by (text address, length, place).
    statements: RefCell<HashMap<(usize, usize, Option<usize>), Rc<str>>>,
}

/// Where an object's rows are, for the statements the catalog runs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Place {
    /// Not distributed: the tables themselves.
    Tables,
    /// Shard `index` of the layout, stored on this node.
    Local(usize),
}

thread_local! {
    /// None: not read since the last invalidation. Some(None): the tables
    /// are not distributed (or Citus is not installed here).
    static LAYOUT: RefCell<Option<Option<Rc<Layout>>>> = const { RefCell::new(None) };
}

/// Forgets the layout; from the catalog's relcache callback.
pub(super) fn forget() {
    LAYOUT.with(|l| *l.borrow_mut() = None);
}

/// The layout, None when the tables are not distributed.
pub(crate) fn layout() -> Result<Option<Rc<Layout>>> {
    if let Some(known) = LAYOUT.with(|l| l.borrow().clone()) {
        return Ok(known);
    }
    let read = read_layout()?.map(Rc::new);
    LAYOUT.with(|l| *l.borrow_mut() = Some(read.clone()));
    Ok(read)
}

/// Whether the tables are distributed.
pub(crate) fn distributed() -> Result<bool> {
    Ok(layout()?.is_some())
}

fn read_layout() -> Result<Option<Layout>> {
    let citus = query("SELECT to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL", &[], &[], |rows| {
        rows.first().get_one::<bool>()
    })?;
    if citus != Some(true) {
        return Ok(None);
    }
    // Reference tables have a placement on every node: this node's.
    let rows = query(
        "SELECT c.relname::text, s.shardid, coalesce(s.shardminvalue::int, 0),
                p.groupid, n.nodename || ':' || n.nodeport, g.groupid
           FROM pg_dist_shard s
           JOIN pg_class c ON c.oid = s.logicalrelid
           JOIN pg_dist_placement p ON p.shardid = s.shardid
           JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
           CROSS JOIN pg_dist_local_group g
          WHERE c.relnamespace = 'lambdastore'::regnamespace
            AND (s.shardminvalue IS NOT NULL OR p.groupid = g.groupid)
          ORDER BY 3, 1",
        &[],
        &[],
        |rows| {
            rows.into_iter()
                .map(|row| {
                    Ok((
                        row.get::<String>(1)?.unwrap_or_default(),
                        row.get::<i64>(2)?.unwrap_or_default(),
                        row.get::<i32>(3)?.unwrap_or_default(),
                        row.get::<i32>(4)?.unwrap_or_default(),
                        row.get::<String>(5)?.unwrap_or_default(),
                        row.get::<i32>(6)?.unwrap_or_default(),
                    ))
                })
                .collect::<pgrx::spi::Result<Vec<_>>>()
        },
    )?;
    let mut layout =
        Layout { local_group: 0, shards: Vec::new(), reference: [0; REFERENCE.len()], statements: Default::default() };
    for (table, shard_id, min, group, node, local_group) in rows {
        layout.local_group = local_group;
        if let Some(i) = REFERENCE.iter().position(|t| *t == table) {
            layout.reference[i] = shard_id;
        } else if let Some(i) = COLOCATED.iter().position(|t| *t == table) {
            if layout.shards.last().is_none_or(|s| s.min != min) {
                layout.shards.push(Shard { min, group, node, ids: [0; COLOCATED.len()] });
            }
            layout.shards.last_mut().expect("just pushed").ids[i] = shard_id;
        }
    }
    if layout.shards.is_empty() {
        return Ok(None);
    }
    let incomplete = layout.shards.iter().any(|s| s.ids.contains(&0)) || layout.reference.contains(&0);
    if incomplete {
        return Err(LambdaError::NotPreloaded(
            "lambdastore's tables are only partly distributed: run SELECT lambdastore.distribute() on the coordinator"
                .into(),
        ));
    }
    Ok(Some(layout))
}

/// Citus' hash of a bigint distribution value: PostgreSQL's `hashint8`,
/// which folds the high half into the low one (so that an int8 equal to
/// an int4 hashes alike) and hashes that.
fn hash(object: i64) -> i32 {
    let (low, high) = (object as u32, (object >> 32) as u32);
    let folded = low ^ if object >= 0 { high } else { !high };
    // SAFETY: a pure function of its argument.
    unsafe { hash_bytes_uint32(folded) as i32 }
}

unsafe extern "C-unwind" {
    /// PostgreSQL's common/hashfn.c (not in pgrx's bindings).
    fn hash_bytes_uint32(k: u32) -> u32;
}

impl Layout {
    fn shard_of(&self, object: i64) -> usize {
        let h = hash(object);
        // Ranges are sorted by min and cover the hash space.
        self.shards.partition_point(|s| s.min <= h).saturating_sub(1)
    }

    /// Whether `object`'s shard is on this node.
    pub(crate) fn is_local(&self, object: i64) -> bool {
        self.shards[self.shard_of(object)].group == self.local_group
    }

    /// The node holding `object`'s shard, as host:port.
    pub(crate) fn node_of(&self, object: i64) -> &str {
        &self.shards[self.shard_of(object)].node
    }

    /// Whether this node holds any shard (the coordinator usually does not).
    pub(crate) fn holds_shards(&self) -> bool {
        self.shards.iter().any(|s| s.group == self.local_group)
    }

    /// The indexes of the shards on this node.
    pub(crate) fn local_shards(&self) -> impl Iterator<Item = usize> + '_ {
        self.shards.iter().enumerate().filter(|(_, s)| s.group == self.local_group).map(|(i, _)| i)
    }

    /// `sql` with each lambdastore table replaced by its relation on this
    /// node: the per-object tables by their shard `shard` (left alone when
    /// None), the reference tables by this node's copy.
    fn physical(&self, sql: &str, shard: Option<usize>) -> String {
        let mut out = sql.to_string();
        if let Some(shard) = shard {
            for (table, id) in COLOCATED.iter().zip(self.shards[shard].ids) {
                out = rename(&out, table, id);
            }
        }
        for (table, id) in REFERENCE.iter().zip(self.reference) {
            out = rename(&out, table, id);
        }
        out
    }

    /// The shard relation `name` of the per-object table or reference
    /// table `table` (its index name `table_pkey` takes the same suffix).
    fn shard_id(&self, table: &str, shard: Option<usize>) -> Option<i64> {
        if let (Some(i), Some(shard)) = (COLOCATED.iter().position(|t| table.starts_with(t)), shard) {
            return Some(self.shards[shard].ids[i]);
        }
        REFERENCE.iter().position(|t| table.starts_with(t)).map(|i| self.reference[i])
    }
}

/// Replaces `lambdastore.<table>` (a whole name) by `lambdastore.<table>_<id>`.
fn rename(sql: &str, table: &str, id: i64) -> String {
    let name = format!("lambdastore.{table}");
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find(&name) {
        let end = at + name.len();
        let whole = !rest[end..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        out.push_str(&rest[..end]);
        if whole {
            out.push_str(&format!("_{id}"));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the statements for `object` must run: the tables, or the local
/// shard. An object stored on another node is refused here; the SQL edge
/// forwards top-level calls to their owner before they get this far.
pub(crate) fn place(object: i64) -> Result<Place> {
    let Some(layout) = layout()? else { return Ok(Place::Tables) };
    let shard = layout.shard_of(object);
    if layout.shards[shard].group != layout.local_group {
        return Err(LambdaError::Elsewhere { object, node: layout.shards[shard].node.clone() });
    }
    Ok(Place::Local(shard))
}

/// A statement's text at `place` (reference tables: this node's copy).
pub(super) fn statement(sql: &'static str, place: Place) -> Result<Statement> {
    let Some(layout) = layout()? else { return Ok(Statement::Static(sql)) };
    let shard = match place {
        Place::Local(shard) => Some(shard),
        Place::Tables => None,
    };
    let key = (sql.as_ptr() as usize, sql.len(), shard);
    let text = layout.statements.borrow().get(&key).cloned();
    Ok(Statement::Rewritten(text.unwrap_or_else(|| {
        let text: Rc<str> = layout.physical(sql, shard).into();
        layout.statements.borrow_mut().insert(key, text.clone());
        text
    })))
}

/// The text a kept plan was prepared from.
#[derive(Clone)]
pub(super) enum Statement {
    Static(&'static str),
    Rewritten(Rc<str>),
}

impl Statement {
    pub(super) fn text(&self) -> &str {
        match self {
            Statement::Static(sql) => sql,
            Statement::Rewritten(sql) => sql,
        }
    }

    /// Whether a plan prepared from `self` serves `other`: by address, as
    /// the texts are the same ones each time (a `&'static str`, or the
    /// layout's rewritten copy until the layout is read again); a warm call
    /// compares a statement's text this way at every query.
    pub(super) fn same(&self, other: &Statement) -> bool {
        match (self, other) {
            (Statement::Static(a), Statement::Static(b)) => std::ptr::eq(*a, *b),
            (Statement::Rewritten(a), Statement::Rewritten(b)) => Rc::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

/// The relation name `name` (a table or its primary key index) at `place`:
/// None for the tables themselves.
pub(super) fn relation_suffix(name: &str, place: Place) -> Result<Option<i64>> {
    let Some(layout) = layout()? else { return Ok(None) };
    let shard = match place {
        Place::Local(shard) => Some(shard),
        Place::Tables => None,
    };
    Ok(layout.shard_id(name, shard))
}

/// Whether this transaction wrote rows of this node's copy of a reference
/// table (applications, modules, grants...). A deploy or a grant made on
/// another node writes them here through Citus, in statements that run none
/// of this extension's code on this node; PostgreSQL's statistics of the
/// transaction's own writes say so (with `track_counts` off, every
/// transaction is assumed to have). Asked at PREPARE, where no statement
/// runs: so it reads no layout, and a backend that has none in memory (one
/// that ran none of this extension's calls) is assumed to have written.
/// False when not distributed.
pub(crate) fn wrote_reference_tables() -> bool {
    let layout = match LAYOUT.with(|l| l.borrow().clone()) {
        None => return true,
        Some(None) => return false,
        Some(Some(layout)) => layout,
    };
    // SAFETY: a plain bool setting, read on the main thread.
    if !unsafe { pg_sys::pgstat_track_counts } {
        return true;
    }
    REFERENCE.iter().zip(layout.reference).any(|(table, id)| {
        let Ok(name) = std::ffi::CString::new(format!("{table}_{id}")) else { return true };
        // SAFETY: syscache lookups by name; InvalidOid when missing.
        let oid = unsafe {
            pg_sys::get_relname_relid(name.as_ptr(), pg_sys::get_namespace_oid(c"lambdastore".as_ptr(), true))
        };
        // SAFETY: looks up this backend's pending statistics of `oid`; the
        // entry's `trans` is set while the open transaction has counts.
        oid != pg_sys::InvalidOid
            && unsafe { pg_sys::find_tabstat_entry(oid).as_ref() }.is_some_and(|s| !s.trans.is_null())
    })
}

/// `n`, drawn from one of our sequences on this node, made unique across
/// the cluster as Citus does for the sequences it distributes itself: the
/// node's group id in the top 16 bits. (Citus leaves extension-owned
/// sequences alone, so every node's copy starts at 1.)
pub(crate) fn unique(n: i64) -> Result<i64> {
    let Some(layout) = layout()? else { return Ok(n) };
    if n >= 1 << 48 {
        return Err(LambdaError::Internal(format!("sequence value {n} is past 2^48")));
    }
    Ok((i64::from(layout.local_group) << 48) | n)
}

/// This node as host:port in Citus' metadata; 'local' when the tables
/// are not distributed.
pub(crate) fn this_node() -> Result<String> {
    if !distributed()? {
        return Ok("local".into());
    }
    let node = query(
        "SELECT n.nodename || ':' || n.nodeport FROM pg_dist_node n JOIN pg_dist_local_group g USING (groupid)
          WHERE n.noderole = 'primary'",
        &[],
        &[],
        |rows| rows.first().get_one::<String>(),
    )?;
    Ok(node.unwrap_or_else(|| "unknown".into()))
}

#[cfg(test)]
mod tests {
    use super::rename;

    #[test]
    fn renames_whole_table_names_only() {
        let sql = "SELECT 1 FROM lambdastore.objects o JOIN lambdastore.object_types t ON true, lambdastore.objects";
        assert_eq!(
            rename(sql, "objects", 7),
            "SELECT 1 FROM lambdastore.objects_7 o JOIN lambdastore.object_types t ON true, lambdastore.objects_7"
        );
        assert_eq!(rename("lambdastore.entry_sets", "entries", 3), "lambdastore.entry_sets");
    }
}
