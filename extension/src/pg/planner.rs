//! A statement that is one function call, `SELECT f(args)`, planned as a
//! call of another function with a text in front, `SELECT g(text, args)`,
//! before Citus' planner sees it (cluster/delegate.rs says why and when).
//!
//! A plan may be kept and run again later (a prepared statement without
//! parameters always reuses its first plan), when the text may no longer
//! be what the rewriter would write. So a rewritten plan carries two
//! marks among its invalidation items, ours and the text's hash, and
//! before any plan so marked runs, the rewriter is asked whether that
//! text still holds: if not, every kept plan of this backend is dropped
//! (the next run plans again) and the statement fails with 0A000, before
//! it has done anything. (An invalidation item only makes PostgreSQL plan
//! again when the system cache entry it names changes: at worst, a plan
//! made again for nothing.) What the plan relies on until it has run is
//! taken before planning and before a kept plan runs (`Rewriter::hold`).

use crate::error::Result;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::hash::{Hash, Hasher};

/// What to rewrite.
pub(crate) struct Rewriter {
    /// The function to call instead of a statement's function, if any.
    pub(crate) instead_of: fn(pg_sys::Oid) -> Option<pg_sys::Oid>,
    /// The text to put in front of the arguments now; None when no
    /// statement may be rewritten now.
    pub(crate) text: fn() -> Option<String>,
    /// Takes, until the transaction ends, what a rewritten plan relies on
    /// from its planning until it has run, waiting for it if need be;
    /// whether nothing a plan made before relies on changed meanwhile.
    /// Asked before the statement is planned (on an error it is not
    /// rewritten) and before a kept plan runs (on an error, or a change,
    /// it fails, and is planned again at its next run).
    pub(crate) hold: fn() -> Result<bool>,
}

thread_local! {
    static REWRITER: Cell<Option<&'static Rewriter>> = const { Cell::new(None) };
    static PREVIOUS_PLANNER: Cell<pg_sys::planner_hook_type> = const { Cell::new(None) };
    static PREVIOUS_EXECUTOR_START: Cell<pg_sys::ExecutorStart_hook_type> = const { Cell::new(None) };
    /// The hash of the last text put in front, and the (local) transaction
    /// it was planned in: a plan run in the transaction that planned it
    /// (a statement of its own, or a protocol-level Bind and Execute) holds
    /// without asking again.
    static LAST: Cell<Option<(u32, u32)>> = const { Cell::new(None) };
}

/// Our mark among a rewritten plan's invalidation items (any value no
/// function's OID is likely to hash to).
const MARK: u32 = 0x4c53_4450;

/// Has `rewriter` asked about every top-level statement of this process
/// that is one function call; once per process.
pub(crate) fn rewrite_calls(rewriter: &'static Rewriter) {
    REWRITER.set(Some(rewriter));
    // SAFETY: the hooks are this process's; the previous ones are kept
    // and called by ours.
    unsafe {
        PREVIOUS_PLANNER.set(pg_sys::planner_hook);
        pg_sys::planner_hook = Some(plan);
        PREVIOUS_EXECUTOR_START.set(pg_sys::ExecutorStart_hook);
        pg_sys::ExecutorStart_hook = Some(start);
    }
}

fn text_hash(text: &str) -> u32 {
    // The std hasher's fixed keys: the same text hashes alike in every
    // process (a plan is only ever checked in the one that made it).
    let mut hasher = std::hash::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish() as u32
}

#[pg_guard]
unsafe extern "C-unwind" fn plan(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: std::ffi::c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the query PostgreSQL is about to plan, ours to change
    // (planners may scribble on it); the nodes are read after their tags.
    let text = unsafe { rewrite(parse) };
    let planned = match PREVIOUS_PLANNER.get() {
        // SAFETY: the hook that was installed before ours, same arguments.
        Some(previous) => unsafe { previous(parse, query_string, cursor_options, bound_params) },
        // SAFETY: PostgreSQL's own planner, same arguments.
        None => unsafe { pg_sys::standard_planner(parse, query_string, cursor_options, bound_params) },
    };
    if let Some(text) = text {
        let hash = text_hash(&text);
        // SAFETY: the plan just made, in the planner's memory context.
        unsafe { mark(planned, hash) };
        LAST.set(Some((hash, local_transaction())));
    }
    planned
}

/// Rewrites `parse` if it is a top-level `SELECT f(args)` that the
/// rewriter rewrites; the text it put in front, if so.
unsafe fn rewrite(parse: *mut pg_sys::Query) -> Option<String> {
    let rewriter = REWRITER.get()?;
    // SAFETY: read-only checks of the query's nodes, each after its tag.
    unsafe {
        // Top level: a client's backend (a background worker's SPI runs
        // no portal), where no portal runs (a function's statements,
        // EXPLAIN and EXECUTE are planned inside one).
        if pg_sys::MyBackendType != pg_sys::BackendType::B_BACKEND || !pg_sys::ActivePortal.is_null() || parse.is_null()
        {
            return None;
        }
        let query = &*parse;
        if query.commandType != pg_sys::CmdType::CMD_SELECT
            || !query.utilityStmt.is_null()
            || query.hasAggs
            || query.hasWindowFuncs
            || query.hasTargetSRFs
            || query.hasSubLinks
            || query.hasModifyingCTE
            || !query.cteList.is_null()
            || !query.setOperations.is_null()
            || !query.rtable.is_null()
            || query.jointree.is_null()
            || !(*query.jointree).fromlist.is_null()
            || !(*query.jointree).quals.is_null()
            || query.targetList.is_null()
            || (*query.targetList).length != 1
        {
            return None;
        }
        let target = pg_sys::list_nth(query.targetList, 0) as *mut pg_sys::TargetEntry;
        let call = (*target).expr as *mut pg_sys::FuncExpr;
        if call.is_null() || (*call).xpr.type_ != pg_sys::NodeTag::T_FuncExpr || (*call).funcretset {
            return None;
        }
        let function = (rewriter.instead_of)((*call).funcid)?;
        let text = (rewriter.text)()?;
        (rewriter.hold)().ok()?;
        let datum = text.as_str().into_datum()?;
        let constant = pg_sys::makeConst(pg_sys::TEXTOID, -1, pg_sys::DEFAULT_COLLATION_OID, -1, datum, false, false);
        (*call).funcid = function;
        (*call).args = pg_sys::lcons(constant.cast(), (*call).args);
        Some(text)
    }
}

/// Adds our mark and the text's hash to `planned`'s invalidation items.
unsafe fn mark(planned: *mut pg_sys::PlannedStmt, hash: u32) {
    if planned.is_null() {
        return;
    }
    for value in [MARK, hash] {
        // SAFETY: a new node in the current (the plan's) memory context.
        unsafe {
            let item = pg_sys::palloc0(std::mem::size_of::<pg_sys::PlanInvalItem>()) as *mut pg_sys::PlanInvalItem;
            (*item).type_ = pg_sys::NodeTag::T_PlanInvalItem;
            (*item).cacheId = pg_sys::SysCacheIdentifier::PROCOID as i32;
            (*item).hashValue = value;
            (*planned).invalItems = pg_sys::lappend((*planned).invalItems, item.cast());
        }
    }
}

/// The hash after our mark in `planned`'s invalidation items, if marked.
unsafe fn marked(planned: *const pg_sys::PlannedStmt) -> Option<u32> {
    // SAFETY: the plan about to run, its list read within its length.
    unsafe {
        let items = (*planned).invalItems;
        if items.is_null() {
            return None;
        }
        let hash_of = |i: i32| (*(pg_sys::list_nth(items, i) as *const pg_sys::PlanInvalItem)).hashValue;
        let n = (*items).length;
        (n >= 2 && hash_of(n - 2) == MARK).then(|| hash_of(n - 1))
    }
}

/// This backend's local transaction id (it counts every transaction).
fn local_transaction() -> u32 {
    // SAFETY: this backend's PGPROC, set before any statement runs.
    unsafe { (*pg_sys::MyProc).lxid }
}

/// Refuses a plan kept from an earlier transaction (its plans dropped)
/// unless the text still holds and `hold` finds nothing changed.
fn check_kept(rewriter: &Rewriter, hash: u32) {
    let refusal = if !(rewriter.text)().is_some_and(|text| text_hash(&text) == hash) {
        Some((
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "this statement was planned for other settings or another transaction state".to_string(),
        ))
    } else {
        match (rewriter.hold)() {
            Ok(true) => None,
            Ok(false) => Some((
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "could not serialize access: what this statement was planned with changed while it waited to run"
                    .to_string(),
            )),
            Err(e) => Some((e.sqlstate(), e.to_string())),
        }
    };
    if let Some((code, message)) = refusal {
        // SAFETY: marks every kept plan of this backend for planning again.
        unsafe { pg_sys::ResetPlanCache() };
        ereport!(ERROR, code, message, "It is planned again at its next run: run it again.");
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn start(query_desc: *mut pg_sys::QueryDesc, eflags: std::ffi::c_int) {
    // SAFETY: the statement about to run and its plan.
    let hash = unsafe { marked((*query_desc).plannedstmt) };
    if let (Some(hash), Some(rewriter)) = (hash, REWRITER.get()) {
        // Planned in this transaction: it holds, `hold` included.
        if LAST.get() != Some((hash, local_transaction())) {
            check_kept(rewriter, hash);
        }
    }
    match PREVIOUS_EXECUTOR_START.get() {
        // SAFETY: the hook that was installed before ours, same arguments.
        Some(previous) => unsafe { previous(query_desc, eflags) },
        // SAFETY: PostgreSQL's own, same arguments.
        None => unsafe { pg_sys::standard_ExecutorStart(query_desc, eflags) },
    }
}
