//! A statement that is one function call, `SELECT f(args)`, planned as a
//! call of another function with a text in front, `SELECT g(text, args)`,
//! before Citus' planner sees it (cluster/delegate.rs says why and when).
//!
//! The rewriter may decide by the call's first argument (the object of
//! `lambda_invoke`) when it is a bigint known at planning: a constant, or a
//! parameter of a plan made for its values.
//!
//! A plan may be kept and run again later (a prepared statement without
//! parameters always reuses its first plan), when the text may no longer
//! be what the rewriter would write. So a rewritten plan carries marks
//! among its invalidation items, ours, the text's hash and the first
//! argument, and before any plan so marked runs, the rewriter is asked
//! whether that text still holds for that argument: if not, every kept
//! plan of this backend is dropped (the next run plans again) and the
//! statement fails with 0A000, before it has done anything. (An invalidation item only makes PostgreSQL plan
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
    /// The text to put in front of the arguments now, given the call's
    /// first argument if it is a bigint known at planning; None when the
    /// statement may not be rewritten now.
    pub(crate) text: fn(Option<i64>) -> Option<String>,
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
    /// The marks of the last plan rewritten, and the (local) transaction
    /// it was planned in: a plan run in the transaction that planned it
    /// (a statement of its own, or a protocol-level Bind and Execute) holds
    /// without asking again. The first argument is part of it: the text
    /// may differ by object, and a kept plan of another object with the
    /// same text must still be asked about.
    static LAST: Cell<Option<(Marks, u32)>> = const { Cell::new(None) };
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
    // (planners may scribble on it), with its parameters' values if the
    // plan is made for them; the nodes are read after their tags.
    let rewritten = unsafe { rewrite(parse, bound_params) };
    let planned = match PREVIOUS_PLANNER.get() {
        // SAFETY: the hook that was installed before ours, same arguments.
        Some(previous) => unsafe { previous(parse, query_string, cursor_options, bound_params) },
        // SAFETY: PostgreSQL's own planner, same arguments.
        None => unsafe { pg_sys::standard_planner(parse, query_string, cursor_options, bound_params) },
    };
    if let Some((text, first)) = rewritten {
        let hash = text_hash(&text);
        // SAFETY: the plan just made, in the planner's memory context.
        unsafe { mark(planned, Marks { hash, first }) };
        LAST.set(Some((Marks { hash, first }, crate::pg::xact::local_transaction())));
    }
    planned
}

/// Rewrites `parse` if it is a top-level `SELECT f(args)` that the
/// rewriter rewrites; the text it put in front and the first argument it
/// was given, if so.
unsafe fn rewrite(parse: *mut pg_sys::Query, params: pg_sys::ParamListInfo) -> Option<(String, Option<i64>)> {
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
        let first = first_bigint((*call).args, params);
        let text = (rewriter.text)(first)?;
        (rewriter.hold)().ok()?;
        let datum = text.as_str().into_datum()?;
        let constant = pg_sys::makeConst(pg_sys::TEXTOID, -1, pg_sys::DEFAULT_COLLATION_OID, -1, datum, false, false);
        (*call).funcid = function;
        (*call).args = pg_sys::lcons(constant.cast(), (*call).args);
        Some((text, first))
    }
}

/// The first of `args` if it is a bigint known now: a constant, or an
/// external parameter whose value the plan is made for.
unsafe fn first_bigint(args: *mut pg_sys::List, params: pg_sys::ParamListInfo) -> Option<i64> {
    // SAFETY: the call's argument list and the plan's parameters, each
    // node read after its tag, each parameter within the list's length.
    unsafe {
        if args.is_null() || (*args).length < 1 {
            return None;
        }
        let node = pg_sys::list_nth(args, 0) as *mut pg_sys::Node;
        match (*node).type_ {
            pg_sys::NodeTag::T_Const => {
                let constant = &*(node as *mut pg_sys::Const);
                (constant.consttype == pg_sys::INT8OID && !constant.constisnull)
                    .then(|| i64::from_datum(constant.constvalue, false))
                    .flatten()
            }
            pg_sys::NodeTag::T_Param => {
                let param = &*(node as *mut pg_sys::Param);
                // A hook may fetch parameters lazily (PL/pgSQL's): not here.
                if params.is_null()
                    || (*params).paramFetch.is_some()
                    || param.paramkind != pg_sys::ParamKind::PARAM_EXTERN
                {
                    return None;
                }
                let index = usize::try_from(param.paramid - 1).ok().filter(|i| *i < (*params).numParams as usize)?;
                let value = &*(*params).params.as_ptr().add(index);
                // Not a constant for this plan: it may run with other values.
                let constant = u32::from(value.pflags) & pg_sys::PARAM_FLAG_CONST != 0;
                (constant && value.ptype == pg_sys::INT8OID && !value.isnull)
                    .then(|| i64::from_datum(value.value, false))
                    .flatten()
            }
            _ => None,
        }
    }
}

/// What a rewritten plan is marked with: the hash of the text put in front
/// and the first argument the rewriter was given.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Marks {
    hash: u32,
    first: Option<i64>,
}

impl Marks {
    /// The invalidation items' values after `MARK`.
    fn values(self) -> [u32; 4] {
        let first = self.first.unwrap_or_default() as u64;
        [self.hash, u32::from(self.first.is_some()), first as u32, (first >> 32) as u32]
    }

    fn from_values([hash, known, low, high]: [u32; 4]) -> Marks {
        let first = (u64::from(high) << 32 | u64::from(low)) as i64;
        Marks { hash, first: (known == 1).then_some(first) }
    }
}

/// Adds our mark and `marks` to `planned`'s invalidation items.
unsafe fn mark(planned: *mut pg_sys::PlannedStmt, marks: Marks) {
    if planned.is_null() {
        return;
    }
    let [a, b, c, d] = marks.values();
    for value in [MARK, a, b, c, d] {
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

/// The marks after our mark in `planned`'s invalidation items, if marked.
unsafe fn marked(planned: *const pg_sys::PlannedStmt) -> Option<Marks> {
    // SAFETY: the plan about to run, its list read within its length.
    unsafe {
        let items = (*planned).invalItems;
        if items.is_null() {
            return None;
        }
        let value = |i: i32| (*(pg_sys::list_nth(items, i) as *const pg_sys::PlanInvalItem)).hashValue;
        let n = (*items).length;
        (n >= 5 && value(n - 5) == MARK).then(|| Marks::from_values([n - 4, n - 3, n - 2, n - 1].map(value)))
    }
}

/// Refuses a plan kept from an earlier transaction (its plans dropped)
/// unless the text still holds and `hold` finds nothing changed.
fn check_kept(rewriter: &Rewriter, marks: Marks) {
    let refusal = if !(rewriter.text)(marks.first).is_some_and(|text| text_hash(&text) == marks.hash) {
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
    let marks = unsafe { marked((*query_desc).plannedstmt) };
    if let (Some(marks), Some(rewriter)) = (marks, REWRITER.get()) {
        // Planned in this transaction: it holds, `hold` included.
        if LAST.get() != Some((marks, crate::pg::xact::local_transaction())) {
            check_kept(rewriter, marks);
        }
    }
    match PREVIOUS_EXECUTOR_START.get() {
        // SAFETY: the hook that was installed before ours, same arguments.
        Some(previous) => unsafe { previous(query_desc, eflags) },
        // SAFETY: PostgreSQL's own, same arguments.
        None => unsafe { pg_sys::standard_ExecutorStart(query_desc, eflags) },
    }
}
