//! Statements sent through Citus to the node holding an object, inside
//! the caller's transaction, and where the transaction has reached.
//!
//! A call for an object stored on another node (from SQL: forward.rs; from
//! a lambda: remote.rs) is one statement routed by the object id to
//! the shard's node: `SELECT lambdastore._call_here(...) FROM
//! lambdastore.objects WHERE object_id = $1` (`Routed`). Citus sends a
//! query whose tables all fall in one shard to that shard's node as it is,
//! so the function runs there, in the backend that holds this distributed
//! transaction's part on that node. There it is an ordinary local
//! workflow: its entry sets are locked and validated in that node's shared
//! memory, its writes go to that node's shards.
//!
//! What does not travel by itself travels as arguments: the caller (by
//! role name: Citus creates roles on every node, their OIDs differ), the
//! time the call has left (`lambdastore.timeout`, or what remains of the
//! workflow's) and the session's other lambdastore settings
//! (`gucs::travelling`). The statement runs as the bootstrap superuser
//! (`access::as_storage`), and the `_here` functions are for superusers
//! only, so no role can claim to be another.
//!
//! A node that received such a statement is inside a Citus task for the
//! rest of the transaction (`arrived`): Citus refuses distributed queries
//! there, so it sends nothing further itself; the node that sent it drives
//! every hop (remote.rs).
//!
//! Citus takes a call for a SELECT, so a call that wrote marks its node as
//! written with a no-op UPDATE routed there (`engage`): Citus then commits
//! it together with whatever else the transaction modified through Citus.
//! A transaction whose lambdastore calls ran on one node commits as Citus
//! commits it: with a plain COMMIT on that node, whose commit callback
//! applies OCC's version bumps. Once calls of one transaction that writes
//! have run on two nodes, it commits in two phases, every node it ran calls
//! on taking part: each prepared node validates its reads again and hands
//! its writer counts and bumps to shared memory (txn/prepared.rs), the node
//! that commits validates its own again, and Citus' recovery ends what a
//! crash left prepared.
//!
//! One call is sent outside any distributed transaction (`send_alone`):
//! an autocommit `SELECT lambda_invoke(...)` that is the whole statement
//! (`may_send_alone`). Citus sends a routed SELECT outside a coordinated
//! transaction as it is, without BEGIN and COMMIT, and the node holding the
//! object runs and commits it as its own transaction: one round trip, as
//! Citus' function delegation is. That node drives the transaction
//! (`arrive_alone`): the calls and spawns its lambda needs on other nodes
//! it sends itself, as the sender would have, and it commits them with its
//! own part, in two phases if they wrote.

use crate::access::{as_storage, Caller};
use crate::catalog;
use crate::cluster::layout;
use crate::error::{LambdaError, Result};
use crate::gucs;
use crate::pg::{self, backend::Citus};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::pg_sys::{self, BuiltinOid::*};
use pgrx::PgTryBuilder;
use std::cell::{Cell, RefCell};
use std::time::Duration;

/// A statement that runs a `_here` function on the node holding the shard
/// of the object `$1`, in two forms. `by_row` reads the object's row:
/// Citus takes a query of one table filtered by its distribution column on
/// its fast path, planned once and routed at each execution, where a query
/// over a subquery is planned again at every call. Without the row (no
/// such object, one being created) it returns nothing, and `any_row` runs
/// instead: its aggregate makes one row whether or not the object exists,
/// so that the node answers as for any call. `marked` selects the call
/// alone, one row whether or not the object exists, beside `engage`'s
/// no-op UPDATE in a CTE: the CTE routes it, and makes Citus count the
/// node as written without a round trip of its own (`send`'s `mark`).
/// (Without `any_row`'s subquery the node that runs it plans it in about
/// 40 µs less.) Its `{route}` stands for the key Citus routes it by: a
/// constant of the object's shard where the shard has one, so that Citus
/// plans it once per shard (a query with a CTE is off its fast path, and
/// one routed by an argument is planned again at every call, some 200 µs
/// on the sending node), else `$1`, the object
/// (`layout::routed_statement`). (`here!` writes all three.)
#[derive(Clone, Copy)]
pub(crate) struct Routed {
    pub(crate) by_row: &'static str,
    pub(crate) any_row: &'static str,
    pub(crate) marked: Option<&'static str>,
}

impl Routed {
    /// Only the `any_row` form: for an object that has no row yet.
    pub(crate) const fn any_row(self) -> Routed {
        Routed { by_row: self.any_row, any_row: self.any_row, marked: None }
    }
}

/// The `Routed` statement selecting `$call` (a `_here` function).
macro_rules! here {
    ($call:literal) => {
        $crate::cluster::route::Routed {
            by_row: concat!("SELECT ", $call, " FROM lambdastore.objects WHERE object_id = $1"),
            any_row: concat!(
                "SELECT ",
                $call,
                " FROM (SELECT count(*) FROM lambdastore.objects WHERE object_id = $1) routed"
            ),
            marked: Some(concat!(
                "WITH marked AS (UPDATE lambdastore.objects SET app = app WHERE object_id = {route} AND created IS NULL ",
                "RETURNING 1) SELECT ",
                $call
            )),
        }
    };
}
pub(crate) use here;

/// Where the current transaction's lambdastore calls ran.
#[derive(Default)]
struct Reach {
    /// Objects of calls forwarded to other nodes, with their node, and
    /// whether that node's part has been marked as written for Citus.
    forwarded: Vec<(i64, String, bool)>,
    /// Whether calls ran on this node.
    here: bool,
    /// Whether any call wrote, here or elsewhere.
    wrote: bool,
    /// Whether a call forwarded to another node wrote there (its node's
    /// part then holds the sets it wrote until the transaction ends).
    wrote_elsewhere: bool,
    /// Whether the node that sent this part a call said that its
    /// transaction held entry sets for writing (`Forwarded::holding`).
    sender_holds: bool,
    /// Whether the transaction commits in two phases.
    two_phase: bool,
}

impl Reach {
    /// Whether calls ran on two nodes or more (this one counts if calls
    /// ran here).
    fn spread(&self) -> bool {
        let mut nodes: Vec<&str> = self.forwarded.iter().map(|(_, node, _)| node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len() + usize::from(self.here) >= 2
    }
}

thread_local! {
    static REACH: RefCell<Reach> = RefCell::new(Reach::default());
    /// This node runs a call sent alone (`send_alone`) in this transaction.
    static ALONE: Cell<bool> = const { Cell::new(false) };
    /// `call_functions`, once looked up.
    static CALL_FUNCTIONS: Cell<Option<(pg_sys::Oid, pg_sys::Oid)>> = const { Cell::new(None) };
}

/// At the end of every transaction.
pub(crate) fn at_transaction_end() {
    REACH.with(|r| *r.borrow_mut() = Reach::default());
    ALONE.set(false);
}

/// Whether a call from SQL to an object on another node may be sent alone
/// (`send_alone`): it is the whole statement, `SELECT lambda_invoke(...)`,
/// and the statement the whole transaction (autocommit), which has done
/// nothing else: no call ran yet, nothing written here. Anything more (a
/// second call in the statement, a transaction block) needs the calls to
/// commit together, in a distributed transaction. So does a transaction
/// READ ONLY or at a stricter isolation than the default: Citus' BEGIN
/// takes those to the node, a statement of its own would run without.
pub(crate) fn may_send_alone() -> Result<bool> {
    if !transaction_may_go_alone() {
        return Ok(false);
    }
    Ok(pg::xact::only_statement_is_call_of(call_functions()?.0))
}

/// The transaction's part of `may_send_alone` (Citus' delegation asks it
/// too, cluster/delegate.rs): not a block, not READ ONLY, at READ
/// COMMITTED, nothing written, no call run, not a part another node drives.
pub(crate) fn transaction_may_go_alone() -> bool {
    let fresh = REACH.with(|r| {
        let reach = r.borrow();
        reach.forwarded.is_empty() && !reach.here
    });
    fresh
        && !pg::xact::in_block()
        && !pg::xact::read_only()
        && !pg::xact::has_transaction_snapshot()
        && pg::xact::top_xid() == 0
        && !arrived()
}

/// The OIDs of `lambda_invoke` and of `_lambda_invoke_delegated`
/// (InvalidOid before an update made it) in this database. Looked up
/// once per backend; should the extension be created again, the old OIDs
/// match no statement and calls are sent as usual.
pub(crate) fn call_functions() -> Result<(pg_sys::Oid, pg_sys::Oid)> {
    if let Some(oids) = CALL_FUNCTIONS.get() {
        return Ok(oids);
    }
    // The extension's own members only: anyone who may create in its
    // schema could add an overload, which a lookup by name found too
    // (every new session's `lambda_invoke` failed with 21000).
    let oids = catalog::query(
        "SELECT pg_catalog.min(p.oid) FILTER (WHERE p.proname = 'lambda_invoke'),
                pg_catalog.min(p.oid) FILTER (WHERE p.proname = '_lambda_invoke_delegated')
           FROM pg_catalog.pg_extension e
           JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.refobjid = e.oid AND d.deptype = 'e' AND d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
           JOIN pg_catalog.pg_proc p ON p.oid = d.objid
          WHERE e.extname = 'lambdastore'",
        &[],
        &[],
        |rows| {
            let row = rows.first();
            let oid = |i| row.get::<pg_sys::Oid>(i).map(|oid| oid.unwrap_or(pg_sys::InvalidOid));
            Ok((oid(1)?, oid(2)?))
        },
    )?;
    CALL_FUNCTIONS.set(Some(oids));
    Ok(oids)
}

/// On the node a call was sent to alone, before anything else: this
/// transaction is that call's, and this node drives it. Citus tells the
/// backends it connected to by their `application_name` (`citus_internal
/// gpid=...`), refuses distributed queries there and closes, at the end of
/// each transaction, every connection they opened: a node driving a call
/// would open a new one (TLS) to each node it reaches, every time. Renamed
/// for this transaction (`SET LOCAL`, at the top of the statement so that
/// it lasts to the commit, where Citus decides), the backend is a client's
/// to Citus: it may send, and it keeps its connections (at most
/// `citus.max_cached_conns_per_worker` per node) for the session's next
/// call. Neither of Citus' reasons holds here: nothing of another
/// distributed transaction is in this one, and the coordinator keeps its
/// connection to this backend as long as the client's session. The node
/// that sent it holds its fence until the call ends: this one's is only
/// tried (`layout::arrive`).
pub(crate) fn arrive_alone() {
    ALONE.set(true);
    layout::arrive();
    gucs::set_local("application_name", "lambdastore");
}

/// Whether this backend runs a part of a transaction driven by another
/// node: calls for objects elsewhere cannot be sent from here. (A call
/// sent alone is not such a part: it is the whole transaction.)
pub(crate) fn arrived() -> bool {
    layout::arrived() && !ALONE.get()
}

/// Whether this transaction holds entry sets for writing on other nodes:
/// on a node a call of it wrote on, or on the side of the node that sent
/// this part a call. Such a transaction never waits for another one's
/// writers (txn/occ.rs), as one holding sets on this node does not: that
/// one may be waiting, there, for what it holds.
pub(crate) fn holds_sets_elsewhere() -> bool {
    REACH.with(|r| {
        let reach = r.borrow();
        reach.wrote_elsewhere || reach.sender_holds
    })
}

/// The node that sent this part a call holds entry sets for writing, or
/// a node it reached does, until the transaction ends.
pub(crate) fn sender_holds_sets() {
    REACH.with(|r| r.borrow_mut().sender_holds = true);
}

/// Whether the current transaction ran calls on more than one node.
pub(crate) fn spread() -> bool {
    REACH.with(|r| r.borrow().spread())
}

/// Before this node commits a transaction that ran calls on several
/// nodes and wrote nothing (one that wrote commits in two phases, and
/// each prepared node validates at PREPARE): every other node it ran
/// calls on validates its reads again. Reads on several nodes are one
/// serializable transaction only if they all still hold at one moment;
/// now, after the last read, is that moment if they all still hold.
pub(crate) fn validate_elsewhere() -> Result<()> {
    if REACH.with(|r| r.borrow().two_phase) {
        return Ok(());
    }
    validate_reached()
}

/// Every other node this transaction ran calls on validates its reads
/// now, whether or not it will prepare: before a failure computed here
/// from what calls there read leaves as an answer (txn/occ.rs, `failed`).
pub(crate) fn validate_reached() -> Result<()> {
    let objects: Vec<(i64, String)> = REACH.with(|r| {
        let reach = r.borrow();
        if !reach.spread() {
            return Vec::new();
        }
        reach.forwarded.iter().map(|(object, node, _)| (*object, node.clone())).collect()
    });
    if objects.is_empty() {
        return Ok(());
    }
    // At pre-commit no statement is running: SPI needs a snapshot.
    pg::xact::with_snapshot(|| {
        for (object, _) in objects {
            routed(here!("lambdastore._validate_here()"), object, Vec::new(), false)?;
        }
        Ok(())
    })
}

/// The node holding `object`'s shard when it is not this one (None when
/// the tables are not distributed). From now on the transaction holds
/// this node's fence (`layout::locate`): a migration waits for the
/// transaction's end, and one under way is waited for and then followed.
pub(crate) fn owner_elsewhere(object: i64) -> Result<Option<String>> {
    Ok(match layout::locate(object)? {
        layout::Located::Here(_) => None,
        layout::Located::There(node) => Some(node),
    })
}

/// Runs what the caller asked about `object` where the object lives, with
/// the tables' owner's rights (`as_storage`): `here` on this node, else
/// `there` forwards it to the node holding it (cluster/forward.rs).
pub(crate) fn at_owner<T>(
    object: i64,
    here: impl FnOnce(Caller) -> Result<T>,
    there: impl FnOnce(Caller, &str) -> Result<T>,
) -> Result<T> {
    as_storage(|caller| match owner_elsewhere(object)? {
        Some(node) => there(caller, &node),
        None => {
            let out = here(caller)?;
            ran_here()?;
            Ok(out)
        }
    })
}

/// Whether this transaction has written object data on this node (not
/// whether it has an XID: `nextval` takes one).
fn wrote_here() -> bool {
    catalog::wrote_data()
}

/// After a call ran on this node.
pub(crate) fn ran_here() -> Result<()> {
    REACH.with(|r| {
        let mut reach = r.borrow_mut();
        reach.here = true;
        reach.wrote |= wrote_here();
    });
    engage(None)
}

/// After a call ran on `node`, for `object`, sent `marked` as written
/// or not. A call that wrote marks its node as written for Citus at once,
/// whatever else the transaction does: Citus commits the nodes it saw
/// modified together (in two phases when there are several: the
/// gateway's idempotency key and the call it records, say), and the
/// others after them.
fn ran_on(node: &str, object: i64, wrote: bool, marked: bool) -> Result<()> {
    REACH.with(|r| {
        let mut reach = r.borrow_mut();
        reach.wrote |= wrote;
        reach.wrote_elsewhere |= wrote;
        match reach.forwarded.iter_mut().find(|(o, _, _)| *o == object) {
            Some(known) => known.2 |= marked,
            None => reach.forwarded.push((object, node.to_string(), marked)),
        }
    });
    engage(wrote.then_some(object))
}

/// Marks `written` (a forwarded call's object) as written for Citus; and
/// once a transaction that writes has run calls on two nodes, asks for
/// two-phase commit, with every node it ran calls on taking part.
fn engage(written: Option<i64>) -> Result<()> {
    let (newly_two_phase, unmarked): (bool, Vec<i64>) = REACH.with(|r| {
        let mut reach = r.borrow_mut();
        let before = reach.two_phase;
        reach.two_phase |= reach.wrote && reach.spread();
        let two_phase = reach.two_phase;
        let unmarked = reach
            .forwarded
            .iter_mut()
            .filter(|(object, _, marked)| !*marked && (two_phase || Some(*object) == written))
            .map(|(object, _, marked)| {
                *marked = true;
                *object
            })
            .collect();
        (two_phase && !before, unmarked)
    });
    // Even when every node is marked already (a call that wrote there,
    // then a write here): without the flag Citus commits the other nodes
    // in one phase, before this one, and a crash between keeps their part.
    if newly_two_phase {
        citus_function(Citus::Use2PCForCoordinatedTransaction)?;
    }
    // Citus prepares only the connections that ran a modification; a call
    // is a SELECT to it. A no-op UPDATE routed by the call's object runs on
    // that call's connection (Citus keeps a shard's placements on one
    // connection per transaction).
    for object in unmarked {
        as_storage(|_| {
            catalog::query_cluster(
                "UPDATE lambdastore.objects SET app = app WHERE object_id = $1 AND created IS NULL",
                &[INT8OID],
                &[object.into()],
                |_| Ok(()),
            )
        })?;
    }
    Ok(())
}

/// The result of a statement run by a forwarded call on its node: "w" or
/// "r" (whether that node's part of the transaction has written), then
/// the result.
pub(crate) fn here_result(result: String) -> String {
    let flag = if wrote_here() { 'w' } else { 'r' };
    format!("{flag}{result}")
}

/// Calls a function of citus.so, loaded since the tables are
/// distributed: `UseCoordinatedTransaction` makes Citus open a transaction
/// block on every node this transaction reaches from now on (it sends a
/// single-shard SELECT outside `BEGIN` as a statement of its own, which
/// the node commits at once: a forwarded call would commit there even if
/// the statement calling it failed afterwards); the other marks the
/// transaction for two-phase commit.
fn citus_function(f: Citus) -> Result<()> {
    if !pg::backend::call_citus(f) {
        return Err(LambdaError::Internal(format!("citus.so has no {f:?}")));
    }
    Ok(())
}

/// Runs `sql`, routed by `object` (its $1) to the node holding it, with
/// the other arguments (text but the sixth, a bigint, and the eighth, a
/// time: `_submit_here`'s due time, then its schedule), and returns its
/// one text value, and whether the statement marked the node written
/// (`mark`, when `sql` has that form). An error on the other node comes
/// back as an ERROR of the SPI call, which pgrx turns into a panic
/// carrying a Rust backtrace: caught, and raised again as that node's
/// error, which ends the transaction.
fn routed(sql: Routed, object: i64, args: Vec<pgrx::datum::DatumWithOid<'_>>, mark: bool) -> Result<(String, bool)> {
    const TYPES: [pg_sys::PgBuiltInOids; 9] =
        [INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID, TEXTOID, TIMESTAMPTZOID, TEXTOID];
    let mut all = vec![object.into()];
    all.extend(args);
    let types = &TYPES[..all.len()];
    let one = |rows: pgrx::spi::SpiTupleTable<'_>| {
        if rows.is_empty() {
            return Ok(None);
        }
        rows.first().get_one::<String>().map(|value| Some(value.unwrap_or_default()))
    };
    if let (true, Some(marked)) = (mark, sql.marked) {
        let key = layout::route_key(object)?;
        let answer = as_storage(|_| caught(|| catalog::query_routed(marked, key, types, &all, one)))?;
        return Ok((answer.unwrap_or_default(), true));
    }
    let run = |sql| as_storage(|_| caught(|| catalog::query_cluster(sql, types, &all, one)));
    match run(sql.by_row)? {
        Some(answer) => Ok((answer, false)),
        None => Ok((run(sql.any_row)?.unwrap_or_default(), false)),
    }
}

/// Runs `run` with an ERROR raised inside it (for a statement Citus sent
/// to another node, that node's) caught and returned, with its SQLSTATE
/// and words.
pub(crate) fn caught<T>(run: impl FnOnce() -> Result<T> + std::panic::UnwindSafe) -> Result<T> {
    PgTryBuilder::new(run)
        .catch_others(|caught| match caught {
            CaughtError::PostgresError(e) | CaughtError::ErrorReport(e) | CaughtError::RustPanic { ereport: e, .. } => {
                Err(LambdaError::Remote {
                    code: e.sql_error_code(),
                    message: e.message().to_string(),
                    detail: e.detail().unwrap_or_default().to_string(),
                })
            }
        })
        .execute()
}

/// Runs `sql` through Citus: a query over `lambdastore.objects` whose
/// rows are an object id and what a `_here` function answered for it,
/// called with `texts` as $1 and $2, then the caller (role, time left,
/// settings: $3 to $5), then `more` ($6 on). Citus makes it one task per
/// shard it touches, on the shard's node, the nodes in parallel. Returns
/// the rows, flags taken off, once it has recorded where they ran as
/// `send` does, by `layout` (read under the fence): one object stands for
/// each shard, the connection that ran the shard's task.
pub(crate) fn send_to_shards(
    layout: &layout::Layout,
    sql: &str,
    texts: [&str; 2],
    more: &[&str],
    caller: Caller,
    timeout: Duration,
) -> Result<Vec<(i64, String)>> {
    citus_function(Citus::UseCoordinatedTransaction)?;
    let (role, settings) = (caller.name(), gucs::travelling());
    let timeout = timeout.as_millis().max(1) as i64;
    let mut args: Vec<pgrx::datum::DatumWithOid<'_>> =
        vec![texts[0].into(), texts[1].into(), role.as_str().into(), timeout.into(), settings.as_str().into()];
    args.extend(more.iter().map(|text| (*text).into()));
    let run = || {
        pgrx::Spi::connect(|client| {
            client
                .select(sql, None, &args)?
                .map(|row| Ok((row.get::<i64>(1)?, row.get::<String>(2)?)))
                .collect::<pgrx::spi::Result<Vec<_>>>()
        })
        .map_err(|e: pgrx::spi::SpiError| LambdaError::Internal(format!("SPI: {e}")))
    };
    // One connection per node: the node's tasks run one after the other
    // in one backend, so that calls of two shards of a node that touch
    // one object (nested calls) do not meet as two writers in one
    // transaction. (And a connection already used reuses its caches.)
    // Forcing a connection per task overrides the pool's size.
    let one_connection_per_node =
        [(c"citus.max_adaptive_executor_pool_size", c"1"), (c"citus.force_max_query_parallelization", c"off")];
    let rows: Vec<(Option<i64>, Option<String>)> =
        gucs::with_settings(&one_connection_per_node, || as_storage(|_| caught(run)))?;
    let mut parts: std::collections::BTreeMap<usize, (i64, String, bool)> = Default::default();
    let mut answers = Vec::with_capacity(rows.len());
    for (object, answer) in rows {
        let (object, answer) = (object.unwrap_or_default(), answer.unwrap_or_default());
        let (flag, answer) = answer.split_at(answer.len().min(1));
        let wrote = flag == "w";
        if let (shard, Some(node)) = layout.owner(object) {
            let part = parts.entry(shard).or_insert_with(|| (object, node.to_string(), wrote));
            if wrote && !part.2 {
                *part = (object, node.to_string(), true);
            }
        }
        answers.push((object, answer.to_string()));
    }
    for (object, node, wrote) in parts.into_values() {
        ran_on(&node, object, wrote, false)?;
    }
    Ok(answers)
}

/// Runs `sql` (one of the `_here` functions) on `node`, routed by
/// `object`, for `caller` with `timeout` left and this session's settings,
/// and returns its result. The caller's three texts are its first
/// arguments after the object, `more` its last. `mark`: the node will
/// have to be counted as written whatever it does there (a spawn, or a
/// call from a lambda that may write: once the transaction writes on two
/// nodes, every node it reached is), so the statement marks it itself
/// (`Routed::marked`) instead of `engage`'s UPDATE after it, one round trip
/// more.
#[allow(clippy::too_many_arguments)]
pub(crate) fn send(
    sql: Routed,
    object: i64,
    node: &str,
    texts: [&str; 3],
    more: Vec<pgrx::datum::DatumWithOid<'_>>,
    caller: Caller,
    timeout: Duration,
    mark: bool,
) -> Result<String> {
    citus_function(Citus::UseCoordinatedTransaction)?;
    let (wrote, marked, result) = send_routed(sql, object, texts, more, caller, timeout, mark)?;
    ran_on(node, object, wrote, marked)?;
    Ok(result)
}

/// `send`, outside any distributed transaction (`may_send_alone` said
/// so): the node runs the statement as a transaction of its own.
pub(crate) fn send_alone(
    sql: Routed,
    object: i64,
    texts: [&str; 3],
    caller: Caller,
    timeout: Duration,
) -> Result<String> {
    Ok(send_routed(sql, object, texts, Vec::new(), caller, timeout, false)?.2)
}

/// Runs `sql` routed by `object` with the caller's texts, role, time left
/// and settings (`mark`ing the node written if it can, `send`); whether
/// the node wrote, whether it was marked, and its answer.
fn send_routed(
    sql: Routed,
    object: i64,
    texts: [&str; 3],
    more: Vec<pgrx::datum::DatumWithOid<'_>>,
    caller: Caller,
    timeout: Duration,
    mark: bool,
) -> Result<(bool, bool, String)> {
    let role = caller.name();
    let timeout = timeout.as_millis().max(1) as i64;
    let settings = gucs::travelling();
    let mut args = vec![
        texts[0].into(),
        texts[1].into(),
        texts[2].into(),
        role.as_str().into(),
        timeout.into(),
        settings.as_str().into(),
    ];
    args.extend(more);
    let (out, marked) = routed(sql, object, args, mark)?;
    let (flag, result) = out.split_at(out.len().min(1));
    Ok((flag == "w", marked, result.to_string()))
}

/// On the node a call was forwarded to: the caller's settings, for this
/// transaction, and the caller.
pub(crate) fn arrive(role: &str, timeout_ms: i64, settings: &str) -> Result<Caller> {
    let name = std::ffi::CString::new(role).map_err(|_| LambdaError::InvalidParameter("a role name".into()))?;
    let caller = Caller(pg::backend::role_oid(&name));
    gucs::set_local("lambdastore.timeout", &timeout_ms.to_string());
    gucs::arrive(settings);
    layout::arrive();
    Ok(caller)
}
