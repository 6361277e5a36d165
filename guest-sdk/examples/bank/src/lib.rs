//! Bank accounts: transfers are workflows of nested calls, and a failed
//! transfer leaves nothing behind.

use lambdastore_sdk::prelude::*;
use serde::{Deserialize, Serialize};

/// A bank account.
#[lambda_object]
pub struct Account {
    owner: Cell<String>,
    balance: Cell<i64>,
    /// Both sides of every transfer, keyed by a per-account sequence number.
    audit: Map<u64, AuditEntry>,
    /// Withdrawals `try_withdraw` asked for here and saw refused.
    refusals: Cell<u64>,
}

/// Which side of a transfer an audit entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Money left this account.
    Debit,
    /// Money arrived in this account.
    Credit,
}

/// One audit entry, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Debit or credit.
    pub kind: Kind,
    /// Always positive.
    pub amount: i64,
    /// The other account.
    pub counterparty: AccountRef,
    /// The transaction's time.
    pub at_micros: i64,
}

/// One audit entry with its sequence number, as `history` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Per-account sequence number, from 1.
    pub seq: u64,
    /// The entry.
    #[serde(flatten)]
    pub entry: AuditEntry,
}

#[lambda_functions]
impl Account {
    /// Opens an account for `owner` with `initial` money (default 0).
    #[constructor]
    fn new(&self, owner: String, initial: Option<i64>) -> Result<()> {
        let initial = initial.unwrap_or(0);
        if initial < 0 {
            bail!("initial balance must not be negative, got {initial}");
        }
        self.owner.set(&owner);
        self.balance.set(&initial);
        Ok(())
    }

    /// The owner's name.
    #[readonly]
    fn owner(&self) -> String {
        self.owner.get_or_default()
    }

    /// The current balance.
    #[readonly]
    fn balance(&self) -> i64 {
        self.balance.get_or_default()
    }

    /// Credits `amount` sent by `from`. Protected: only a transfer (a lambda
    /// of this application) may create money here.
    #[protected]
    fn deposit(&self, amount: i64, from: Option<AccountRef>) -> Result<i64> {
        if amount <= 0 {
            bail!("amount must be positive, got {amount}");
        }
        let balance = self.balance.get_or_default() + amount;
        self.balance.set(&balance);
        self.record(Kind::Credit, amount, from.unwrap_or(AccountRef::from_id(0)));
        Ok(balance)
    }

    /// Moves `amount` to account `to`; returns this account's new balance.
    fn transfer(&self, to: AccountRef, amount: i64) -> Result<i64> {
        if amount <= 0 {
            bail!("amount must be positive, got {amount}");
        }
        let me = AccountRef::from_id(self_id());
        if to == me {
            bail!("cannot transfer to the same account");
        }
        let balance = self.balance.get_or_default();
        if amount > balance {
            bail!("insufficient funds: balance {balance}, transfer {amount}");
        }
        self.balance.set(&(balance - amount));
        self.record(Kind::Debit, amount, to);
        // If the deposit fails, returning the error undoes the debit above.
        to.deposit(amount, Some(me)).map_err(|e| Error::new(format!("transfer to account {} failed: {e}", to.id())))?;
        Ok(balance - amount)
    }

    /// Debits `amount` from this account if this account and `other`
    /// together hold at least `amount`; returns this account's new balance,
    /// which may be negative (an overdraft covered by the other account).
    ///
    /// The check reads both balances and the debit writes only this one: two
    /// concurrent calls on either side of a pair are the textbook write
    /// skew, which only serializable execution prevents.
    fn withdraw_if_covered(&self, other: AccountRef, amount: i64) -> Result<i64> {
        if amount <= 0 {
            bail!("amount must be positive, got {amount}");
        }
        if other == AccountRef::from_id(self_id()) {
            bail!("the covering account must be another account");
        }
        let balance = self.balance.get_or_default();
        let covering = other.balance()?;
        if balance + covering < amount {
            bail!("not covered: balance {balance} + {covering} < {amount}");
        }
        self.balance.set(&(balance - amount));
        Ok(balance - amount)
    }

    /// Asks `account` to withdraw `amount` covered by `other`; a refusal is
    /// handled here (counted in `refusals`) instead of failing the call:
    /// returns whether the withdrawal went through. A caller that commits
    /// on a callee's error must have been given an error some serial order
    /// gives.
    fn try_withdraw(&self, account: AccountRef, other: AccountRef, amount: i64) -> bool {
        if account.withdraw_if_covered(other, amount).is_ok() {
            return true;
        }
        self.refusals.set(&(self.refusals.get_or_default() + 1));
        false
    }

    /// This account's and `other`'s balances together, if they cover
    /// `amount`; else fails "not covered", as `withdraw_if_covered` would,
    /// without writing anything (a check a job can run again and again).
    #[readonly]
    fn covered(&self, other: AccountRef, amount: i64) -> Result<i64> {
        let (balance, covering) = (self.balance.get_or_default(), other.balance()?);
        if balance + covering < amount {
            bail!("not covered: balance {balance} + {covering} < {amount}");
        }
        Ok(balance + covering)
    }

    /// How many withdrawals `try_withdraw` saw refused.
    #[readonly]
    fn refusals(&self) -> u64 {
        self.refusals.get_or_default()
    }

    /// This account's balance plus `other`'s: two reads that must see the
    /// same moment (a transfer between them leaves the sum unchanged).
    #[readonly]
    fn total_with(&self, other: AccountRef) -> Result<i64> {
        Ok(self.balance.get_or_default() + other.balance()?)
    }

    /// The newest `limit` audit entries (default 20), newest first.
    #[readonly]
    fn history(&self, limit: Option<u32>) -> Vec<HistoryEntry> {
        self.audit.iter().rev().limit(limit.unwrap_or(20)).map(|(seq, entry)| HistoryEntry { seq, entry }).collect()
    }
}

/// Helpers, not lambda functions.
impl Account {
    fn record(&self, kind: Kind, amount: i64, counterparty: AccountRef) {
        let seq = self.audit.last().map_or(1, |(seq, _)| seq + 1);
        let entry = AuditEntry { kind, amount, counterparty, at_micros: now_micros() };
        self.audit.insert(&seq, &entry);
    }
}

lambdastore_sdk::app!(Account);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::MockHost;
    use serde_json::{json, Value};

    fn open(host: &MockHost, owner: &str, initial: i64) -> ObjectId {
        host.create("Account", json!({"owner": owner, "initial": initial})).unwrap()
    }

    fn balance(host: &MockHost, id: ObjectId) -> i64 {
        host.invoke(id, "balance", json!(null)).unwrap().as_i64().unwrap()
    }

    #[test]
    fn transfer_moves_money_and_audits_both_sides() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 100), open(&host, "bob", 0));
        assert_eq!(host.invoke(a, "transfer", json!({"to": b, "amount": 30})).unwrap(), json!(70));
        assert_eq!((balance(&host, a), balance(&host, b)), (70, 30));

        let debit = &host.map::<u64, AuditEntry>(a, "audit")[0];
        assert_eq!((debit.0, debit.1.kind, debit.1.amount), (1, Kind::Debit, 30));
        assert_eq!(debit.1.counterparty.id(), b);
        let credit = &host.map::<u64, AuditEntry>(b, "audit")[0].1;
        assert_eq!((credit.kind, credit.counterparty.id()), (Kind::Credit, a));
    }

    #[test]
    fn history_is_newest_first_and_limited() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 100), open(&host, "bob", 0));
        for amount in 1..=5 {
            host.invoke(a, "transfer", json!([b, amount])).unwrap();
        }
        let history = host.invoke(a, "history", json!({"limit": 3})).unwrap();
        let amounts: Vec<i64> = history.as_array().unwrap().iter().map(|e| e["amount"].as_i64().unwrap()).collect();
        assert_eq!(amounts, [5, 4, 3]);
        assert_eq!(history[0]["seq"], json!(5));
        assert_eq!(history[0]["kind"], json!("debit"));
        assert_eq!(history[0]["counterparty"], json!(b));
        // Each workflow has its own (later) transaction time.
        assert!(history[0]["at_micros"].as_i64() > history[1]["at_micros"].as_i64());
        assert_eq!(host.invoke(a, "history", json!(null)).unwrap().as_array().unwrap().len(), 5);
    }

    #[test]
    fn overdraft_is_refused_and_changes_nothing() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 10), open(&host, "bob", 0));
        let err = host.invoke(a, "transfer", json!({"to": b, "amount": 11})).unwrap_err();
        assert_eq!(err, CallError::Application("insufficient funds: balance 10, transfer 11".into()));
        assert_eq!((balance(&host, a), balance(&host, b)), (10, 0));
        assert!(host.map::<u64, AuditEntry>(a, "audit").is_empty());
    }

    #[test]
    fn non_positive_amounts_are_refused() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 10), open(&host, "bob", 0));
        for amount in [0, -5] {
            let err = host.invoke(a, "transfer", json!({"to": b, "amount": amount}));
            assert!(matches!(err, Err(CallError::Application(m)) if m.contains("positive")));
        }
    }

    #[test]
    fn a_failed_deposit_undoes_the_debit() {
        let host = MockHost::for_app::<App>();
        let a = open(&host, "ada", 10);
        // The debit happens, then the nested deposit fails on an unknown object.
        let err = host.invoke(a, "transfer", json!({"to": 999, "amount": 5})).unwrap_err();
        assert_eq!(err, CallError::Application("transfer to account 999 failed: unknown object 999".into()));
        assert_eq!(balance(&host, a), 10);
        assert!(host.map::<u64, AuditEntry>(a, "audit").is_empty());
    }

    #[test]
    fn clients_cannot_deposit() {
        let host = MockHost::for_app::<App>();
        let a = open(&host, "ada", 0);
        let err = host.invoke(a, "deposit", json!({"amount": 1_000_000})).unwrap_err();
        assert!(matches!(err, CallError::NotAllowed(_)), "{err}");
        assert_eq!(balance(&host, a), 0);
    }

    #[test]
    fn constructor_checks_its_arguments() {
        let host = MockHost::for_app::<App>();
        let err = host.create("Account", json!({"initial": 5})).unwrap_err();
        assert_eq!(err, CallError::BadArguments("missing parameter `owner`".into()));
        let err = host.create("Account", json!({"owner": "eve", "initial": -1})).unwrap_err();
        assert!(matches!(err, CallError::Application(_)));
        // A failed constructor leaves no object behind.
        assert!(host.objects().is_empty());
        let a = host.create("Account", json!(["ada"])).unwrap();
        assert_eq!(host.invoke(a, "owner", Value::Null).unwrap(), json!("ada"));
        assert_eq!(balance(&host, a), 0);
    }

    #[test]
    fn withdraw_if_covered_may_overdraw_what_the_other_account_covers() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 100), open(&host, "bob", 100));
        let args = json!({"other": b, "amount": 150});
        assert_eq!(host.invoke(a, "withdraw_if_covered", args.clone()).unwrap(), json!(-50));
        assert_eq!((balance(&host, a), balance(&host, b)), (-50, 100));
        // 50 left between them: the same withdrawal on the other side is refused.
        let err = host.invoke(b, "withdraw_if_covered", json!({"other": a, "amount": 150})).unwrap_err();
        assert_eq!(err, CallError::Application("not covered: balance 100 + -50 < 150".into()));
        assert_eq!((balance(&host, a), balance(&host, b)), (-50, 100));
    }

    #[test]
    fn withdraw_if_covered_checks_its_arguments() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 100), open(&host, "bob", 100));
        for (other, amount) in [(b, 0), (b, -1), (a, 10)] {
            let args = json!({"other": other, "amount": amount});
            assert!(matches!(host.invoke(a, "withdraw_if_covered", args), Err(CallError::Application(_))));
        }
        // The covering account must exist: its error aborts the withdrawal.
        let err = host.invoke(a, "withdraw_if_covered", json!([999, 10])).unwrap_err();
        assert!(matches!(err, CallError::Application(ref m) if m.contains("999")), "{err}");
        assert_eq!(balance(&host, a), 100);
    }

    #[test]
    fn try_withdraw_handles_a_refusal_and_counts_it() {
        let host = MockHost::for_app::<App>();
        let (a, b, c) = (open(&host, "ada", 100), open(&host, "bob", 0), open(&host, "cy", 0));
        let ask = |amount: i64| host.invoke(c, "try_withdraw", json!({"account": a, "other": b, "amount": amount}));
        assert_eq!(ask(150).unwrap(), json!(false));
        assert_eq!(host.invoke(c, "refusals", Value::Null).unwrap(), json!(1));
        assert_eq!(ask(60).unwrap(), json!(true));
        assert_eq!((balance(&host, a), host.invoke(c, "refusals", Value::Null).unwrap()), (40, json!(1)));
    }

    #[test]
    fn covered_checks_both_balances_and_writes_nothing() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 70), open(&host, "bob", 30));
        assert_eq!(host.invoke(a, "covered", json!({"other": b, "amount": 100})).unwrap(), json!(100));
        let err = host.invoke(a, "covered", json!({"other": b, "amount": 101})).unwrap_err();
        assert_eq!(err, CallError::Application("not covered: balance 70 + 30 < 101".into()));
        assert_eq!((balance(&host, a), balance(&host, b)), (70, 30));
    }

    #[test]
    fn total_with_adds_both_balances() {
        let host = MockHost::for_app::<App>();
        let (a, b) = (open(&host, "ada", 70), open(&host, "bob", 30));
        host.invoke(a, "transfer", json!({"to": b, "amount": 20})).unwrap();
        assert_eq!(host.invoke(a, "total_with", json!({"other": b})).unwrap(), json!(100));
        assert_eq!(host.invoke(b, "total_with", json!([a])).unwrap(), json!(100));
    }

    #[test]
    fn typed_references_transfer_too() {
        let _host = MockHost::for_app::<App>();
        let a = AccountRef::new("ada".into(), Some(50)).unwrap();
        let b = AccountRef::new("bob".into(), None).unwrap();
        assert_eq!(a.transfer(b, 20).unwrap(), 30);
        assert_eq!(b.balance().unwrap(), 20);
        assert_eq!(b.history(Some(1)).unwrap()[0].entry.counterparty, a);
        assert!(matches!(b.deposit(1, None), Err(CallError::NotAllowed(_))));
    }
}
