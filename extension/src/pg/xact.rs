//! The current transaction: its state, its snapshot, its subtransactions.

use pgrx::pg_sys;

/// `SET TRANSACTION READ ONLY`, a hot standby, or `default_transaction_read_only`.
pub(crate) fn read_only() -> bool {
    // SAFETY: a plain bool of the current transaction.
    unsafe { pg_sys::XactReadOnly }
}

/// REPEATABLE READ or SERIALIZABLE: a transaction snapshot, not one per statement.
pub(crate) fn has_transaction_snapshot() -> bool {
    // SAFETY: a plain int of the current transaction.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Inside `BEGIN … COMMIT` (not a statement committing on its own).
pub(crate) fn in_block() -> bool {
    // SAFETY: reads the transaction state of this backend.
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Whether the statement running is `SELECT f(...)` of `function` and
/// nothing else, the only statement of a transaction that is not a block:
/// one top-level plan, a Result without input (no FROM; a subquery in an
/// argument may read), and one column, a call of `function`, or its
/// result as text (`::text`: an output function, which cannot fail once
/// the call has committed).
pub(crate) fn only_statement_is_call_of(function: pg_sys::Oid) -> bool {
    if in_block() {
        return false;
    }
    // SAFETY: ActivePortal is the portal the client's statement runs in,
    // with its plans, valid while it runs (this function runs inside it);
    // every node is read after its tag is checked.
    unsafe {
        let portal = pg_sys::ActivePortal;
        if portal.is_null() || (*portal).stmts.is_null() || (*(*portal).stmts).length != 1 {
            return false;
        }
        let stmt = pg_sys::list_nth((*portal).stmts, 0) as *mut pg_sys::PlannedStmt;
        if stmt.is_null()
            || (*stmt).type_ != pg_sys::NodeTag::T_PlannedStmt
            || (*stmt).commandType != pg_sys::CmdType::CMD_SELECT
            || (*stmt).hasModifyingCTE
        {
            return false;
        }
        let plan = (*stmt).planTree;
        if plan.is_null() || (*plan).type_ != pg_sys::NodeTag::T_Result || !(*plan).lefttree.is_null() {
            return false;
        }
        let targets = (*plan).targetlist;
        if targets.is_null() || (*targets).length != 1 {
            return false;
        }
        let target = pg_sys::list_nth(targets, 0) as *mut pg_sys::TargetEntry;
        let mut expr = (*target).expr;
        if !expr.is_null() && (*expr).type_ == pg_sys::NodeTag::T_CoerceViaIO {
            let coerce = expr as *mut pg_sys::CoerceViaIO;
            if (*coerce).resulttype != pg_sys::TEXTOID {
                return false;
            }
            expr = (*coerce).arg;
        }
        let call = expr as *mut pg_sys::FuncExpr;
        !call.is_null() && (*call).xpr.type_ == pg_sys::NodeTag::T_FuncExpr && (*call).funcid == function
    }
}

/// This backend's local transaction id: it counts every top-level
/// transaction, read-only ones too.
pub(crate) fn local_transaction() -> u32 {
    // SAFETY: this backend's PGPROC, set before any statement runs.
    unsafe { (*pg_sys::MyProc).lxid }
}

/// The top transaction's XID, 0 when it has written nothing.
pub(crate) fn top_xid() -> u32 {
    // SAFETY: reads this backend's transaction state; assigns nothing.
    unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner()
}

/// Whether transaction `xid` is still running (prepared ones count).
pub(crate) fn in_progress(xid: u32) -> bool {
    // SAFETY: a proc-array lookup by XID.
    unsafe { pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(xid)) }
}

/// Whether ended transaction `xid` committed.
pub(crate) fn committed(xid: u32) -> bool {
    // SAFETY: a commit-log lookup by XID.
    unsafe { pg_sys::TransactionIdDidCommit(pg_sys::TransactionId::from(xid)) }
}

/// Whether a statement's snapshot is set (SPI queries need one).
pub(crate) fn has_snapshot() -> bool {
    // SAFETY: reads this backend's snapshot stack.
    unsafe { pg_sys::ActiveSnapshotSet() }
}

/// Runs `f` with a snapshot, pushing the transaction's own when no
/// statement runs (at PREPARE or pre-commit). An error inside aborts the
/// transaction, which pops what was pushed.
pub(crate) fn with_snapshot<R>(f: impl FnOnce() -> R) -> R {
    if has_snapshot() {
        return f();
    }
    // SAFETY: inside a transaction; popped below, or by the abort.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let result = f();
    // SAFETY: pairs with the push above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// An internal subtransaction (as PL/pgSQL's exception blocks use): on a
/// Citus cluster, Citus sends SAVEPOINT, RELEASE and ROLLBACK TO to every
/// node the transaction has reached, so rolling it back undoes, on every
/// node, what ran inside it.
pub(crate) struct Subtransaction {
    context: pg_sys::MemoryContext,
    owner: pg_sys::ResourceOwner,
    /// Its nesting level (the top-level transaction's is 1).
    level: i32,
}

impl Subtransaction {
    pub(crate) fn begin() -> Self {
        // SAFETY: inside a transaction, with no SPI connection open (each
        // catalog query opens and closes its own).
        unsafe {
            let (context, owner) = (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
            pg_sys::BeginInternalSubTransaction(std::ptr::null());
            pg_sys::MemoryContextSwitchTo(context);
            Subtransaction { context, owner, level: pg_sys::GetCurrentTransactionNestLevel() }
        }
    }

    /// Keeps what ran inside it (it commits with the transaction).
    pub(crate) fn release(self) {
        self.end_inner();
        // SAFETY: ends the subtransaction `begin` started, now the current
        // one: everything inside it has returned.
        unsafe { pg_sys::ReleaseCurrentSubTransaction() };
        self.restore();
    }

    /// Undoes what ran inside it.
    pub(crate) fn roll_back(self) {
        self.end_inner();
        // SAFETY: as for `release`; an error caught inside it has been
        // flushed (PgTryBuilder does).
        unsafe { pg_sys::RollbackAndReleaseCurrentSubTransaction() };
        self.restore();
    }

    /// Rolls back the subtransactions begun inside this one that an error
    /// unwound past before they ended (a `Subtransaction` is a value, not
    /// a guard). Ending only the current one ended such an inner one and
    /// left this one open, and the transaction around it never committed:
    /// CommitTransactionCommand inside a subtransaction commits nothing. A
    /// job runner whose cross-node call lost its connection (remote.rs's
    /// `hops`) ran every later job in one transaction that never ended,
    /// holding the shards against moves, until it was killed.
    fn end_inner(&self) {
        // SAFETY: each is the current subtransaction when it is rolled
        // back, and every one of them is inside this one.
        unsafe {
            while pg_sys::GetCurrentTransactionNestLevel() > self.level {
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
            }
        }
    }

    fn restore(&self) {
        // SAFETY: both were current when the subtransaction began, and
        // outlive it.
        unsafe {
            pg_sys::MemoryContextSwitchTo(self.context);
            pg_sys::CurrentResourceOwner = self.owner;
        }
    }
}

/// A function PostgreSQL calls at every transaction event (xact.rs).
pub(crate) type XactCallback = unsafe extern "C-unwind" fn(pg_sys::XactEvent::Type, *mut std::ffi::c_void);

/// Has `callback` called at every transaction event of this process;
/// once per process. It must be a `#[pg_guard]` function.
pub(crate) fn on_transaction_events(callback: XactCallback) {
    // SAFETY: registers a plain function with no argument.
    unsafe { pg_sys::RegisterXactCallback(Some(callback), std::ptr::null_mut()) };
}

/// Has `callback` called at the end of every top-level transaction
/// (commit, abort or PREPARE) once PostgreSQL has released its
/// heavyweight locks, which the transaction callbacks run before; once
/// per process. It must not fail.
pub(crate) fn after_locks_released(callback: fn()) {
    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn released(
        phase: pg_sys::ResourceReleasePhase::Type,
        _is_commit: bool,
        is_top_level: bool,
        arg: *mut std::ffi::c_void,
    ) {
        // Called for each resource owner released, children first, with
        // the owner being released as the current one: only the top
        // transaction's has released the locks by now.
        // SAFETY: reads two of PostgreSQL's globals.
        let top = unsafe { pg_sys::CurrentResourceOwner == pg_sys::TopTransactionResourceOwner };
        if is_top_level && top && phase == pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_LOCKS {
            // SAFETY: `arg` is the `fn()` registered below.
            let callback: fn() = unsafe { std::mem::transmute::<*mut std::ffi::c_void, fn()>(arg) };
            callback();
        }
    }
    // SAFETY: registers a plain function whose argument is a function pointer.
    unsafe { pg_sys::RegisterResourceReleaseCallback(Some(released), callback as *mut std::ffi::c_void) };
}

thread_local! {
    static PREVIOUS_UTILITY: std::cell::Cell<pg_sys::ProcessUtility_hook_type> = const { std::cell::Cell::new(None) };
    /// The name given by the last `PREPARE TRANSACTION` of this backend.
    static PREPARING: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// Told of this process's statements (`watch_statements`).
    static WATCHERS: std::cell::Cell<Option<StatementWatchers>> = const { std::cell::Cell::new(None) };
}

/// What the statements `watch_statements` watches tell, each in the
/// statement's transaction (an ERROR refuses the statement).
#[derive(Clone, Copy)]
pub(crate) struct StatementWatchers {
    /// The OID of each database dropped, once dropped (`DROP DATABASE`
    /// runs outside a transaction block).
    pub database_dropped: fn(u32),
    /// Each role renamed, once renamed.
    pub role_renamed: fn(pg_sys::Oid),
    /// The roles a `DROP ROLE` is about to drop.
    pub roles_dropping: fn(&[pg_sys::Oid]),
    /// The roles and the new owner of a `REASSIGN OWNED`, once run.
    pub owned_reassigned: fn(&[pg_sys::Oid], pg_sys::Oid),
    /// The roles of a `DROP OWNED`, once run.
    pub owned_dropped: fn(&[pg_sys::Oid]),
}

/// Has each `PREPARE TRANSACTION` statement of this process note its name
/// for `preparing_name`, and tells `watchers` of the statements they
/// watch; once per process.
pub(crate) fn watch_statements(watchers: StatementWatchers) {
    WATCHERS.set(Some(watchers));
    // SAFETY: the hook is this process's; the previous one is kept and
    // called by ours.
    unsafe {
        PREVIOUS_UTILITY.set(pg_sys::ProcessUtility_hook);
        pg_sys::ProcessUtility_hook = Some(utility);
    }
}

/// The roles of a parse tree's list of `RoleSpec`s that exist.
///
/// SAFETY: `specs` is such a list (or NULL).
unsafe fn roles_of(specs: *mut pg_sys::List) -> Vec<pg_sys::Oid> {
    // SAFETY: the caller's promise.
    unsafe {
        pgrx::PgList::<pg_sys::RoleSpec>::from_pg(specs)
            .iter_ptr()
            .map(|spec| pg_sys::get_rolespec_oid(spec, true))
            .filter(|oid| *oid != pg_sys::InvalidOid)
            .collect()
    }
}

/// `statement`, a `REASSIGN OWNED ... TO CURRENT_USER` (or SESSION_USER,
/// CURRENT_ROLE), with its new owner named instead: the same role,
/// resolved now as PostgreSQL resolves it. Citus 13.2 sends the statement
/// to the workers after looking the new owner up by its name, which those
/// forms leave NULL, and the backend died of it (SIGSEGV), taking every
/// session of the server into recovery (our tests' role cleanup did).
/// Copied first when the tree is read-only.
///
/// SAFETY: `statement` runs a `ReassignOwnedStmt` whose new owner is
/// `new_owner`.
unsafe fn with_new_owner_named(
    statement: *mut pg_sys::PlannedStmt,
    read_only_tree: bool,
    new_owner: pg_sys::Oid,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: the caller's promise; a copy is ours to change, and a tree
    // that is not read-only is the hook's to change.
    unsafe {
        let statement = if read_only_tree {
            pg_sys::copyObjectImpl(statement.cast()).cast::<pg_sys::PlannedStmt>()
        } else {
            statement
        };
        let new_role = (*((*statement).utilityStmt as *mut pg_sys::ReassignOwnedStmt)).newrole;
        (*new_role).rolename = pg_sys::GetUserNameFromId(new_owner, false);
        (*new_role).roletype = pg_sys::RoleSpecType::ROLESPEC_CSTRING;
        statement
    }
}

/// At PREPARE TRANSACTION, the name it gives the transaction (PostgreSQL
/// keeps it to itself until the transaction is prepared): every PREPARE
/// runs as a statement, whose name the hook noted.
pub(crate) fn preparing_name() -> Option<String> {
    PREPARING.with(|p| p.borrow().clone())
}

#[allow(clippy::too_many_arguments)] // PostgreSQL's hook
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn utility(
    statement: *mut pg_sys::PlannedStmt,
    text: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    environment: *mut pg_sys::QueryEnvironment,
    destination: *mut pg_sys::DestReceiver,
    completion: *mut pg_sys::QueryCompletion,
) {
    // Rebound rather than declared `mut`: pg_guard's wrapper passes the
    // parameters on, and warned of a needless `mut` in it.
    let (mut statement, mut read_only_tree) = (statement, read_only_tree);
    let watchers = WATCHERS.get().expect("the hook is installed with its watchers");
    let (mut dropping, mut renaming, mut reassigning, mut dropping_owned) = (None, None, None, None);
    // SAFETY: the statement about to run, read after its tag; the names
    // are C strings of the parse tree, the role lists lists of RoleSpec.
    unsafe {
        let node = (*statement).utilityStmt;
        let tag = if node.is_null() { pg_sys::NodeTag::T_Invalid } else { (*node).type_ };
        if tag == pg_sys::NodeTag::T_DropdbStmt {
            let name = (*(node as *mut pg_sys::DropdbStmt)).dbname;
            dropping = Some(pg_sys::get_database_oid(name, true)).filter(|oid| *oid != pg_sys::InvalidOid);
        }
        if tag == pg_sys::NodeTag::T_RenameStmt {
            let rename = node as *mut pg_sys::RenameStmt;
            if (*rename).renameType == pg_sys::ObjectType::OBJECT_ROLE && !(*rename).subname.is_null() {
                renaming = Some(pg_sys::get_role_oid((*rename).subname, true)).filter(|oid| *oid != pg_sys::InvalidOid);
            }
        }
        if tag == pg_sys::NodeTag::T_DropRoleStmt {
            (watchers.roles_dropping)(&roles_of((*(node as *mut pg_sys::DropRoleStmt)).roles));
        }
        if tag == pg_sys::NodeTag::T_ReassignOwnedStmt {
            let reassign = node as *mut pg_sys::ReassignOwnedStmt;
            let new_owner = pg_sys::get_rolespec_oid((*reassign).newrole, true);
            reassigning = Some((roles_of((*reassign).roles), new_owner)).filter(|_| new_owner != pg_sys::InvalidOid);
            if new_owner != pg_sys::InvalidOid
                && (*(*reassign).newrole).roletype != pg_sys::RoleSpecType::ROLESPEC_CSTRING
            {
                (statement, read_only_tree) = (with_new_owner_named(statement, read_only_tree, new_owner), false);
            }
        }
        if tag == pg_sys::NodeTag::T_DropOwnedStmt {
            dropping_owned = Some(roles_of((*(node as *mut pg_sys::DropOwnedStmt)).roles));
        }
        if tag == pg_sys::NodeTag::T_TransactionStmt {
            let transaction = node as *mut pg_sys::TransactionStmt;
            if (*transaction).kind == pg_sys::TransactionStmtKind::TRANS_STMT_PREPARE && !(*transaction).gid.is_null() {
                let name = std::ffi::CStr::from_ptr((*transaction).gid).to_string_lossy().into_owned();
                PREPARING.with(|p| *p.borrow_mut() = Some(name));
            }
        }
    }
    // SAFETY: the hook installed before ours, or PostgreSQL's own, with
    // the same arguments.
    unsafe {
        match PREVIOUS_UTILITY.get() {
            Some(previous) => {
                previous(statement, text, read_only_tree, context, params, environment, destination, completion)
            }
            None => pg_sys::standard_ProcessUtility(
                statement,
                text,
                read_only_tree,
                context,
                params,
                environment,
                destination,
                completion,
            ),
        }
    }
    // DROP DATABASE runs outside a transaction block, and is done once
    // it returns.
    if let Some(oid) = dropping {
        (watchers.database_dropped)(oid.to_u32());
    }
    if let Some(role) = renaming {
        (watchers.role_renamed)(role);
    }
    if let Some((roles, new_owner)) = reassigning {
        (watchers.owned_reassigned)(&roles, new_owner);
    }
    if let Some(roles) = dropping_owned {
        (watchers.owned_dropped)(&roles);
    }
}
