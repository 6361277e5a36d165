//! The counter application, version 2: deployed over `counter` (the same
//! application), it shows how a type whose fields change migrates the
//! objects the first version made. Version 1 kept one cell `value`;
//! version 2 keeps the count in `count` and when it last changed in
//! `changed` (microseconds, the host's clock).
//!
//! Every call on a version-1 object first runs `migrate(1)` on it, in the
//! same transaction (a readonly `get` too); `lambdastore.migrate_objects`
//! migrates the rest ahead of their calls. docs: docs/sql-api.md, "Redeploying".

use lambdastore_sdk::prelude::*;

/// A counter that remembers when it last changed.
#[lambda_object]
pub struct Counter {
    count: Cell<i64>,
    changed: Cell<i64>,
}

#[lambda_functions]
impl Counter {
    /// Starts at `initial`, or 0.
    #[constructor]
    fn new(&self, initial: Option<i64>) {
        self.count.set(&initial.unwrap_or(0));
        self.changed.set(&now_micros());
    }

    /// Brings an object whose fields are at version `from` to version 2:
    /// version 1's `value` becomes `count`; when it changed is unknown (0).
    #[migrate(2)]
    fn migrate(&self, from: u32) -> Result<()> {
        if from < 2 {
            let value = <Cell<i64> as Field>::bind("value");
            let old = value.try_get().map_err(|e| Error::new(format!("version 1's value: {e}")))?;
            self.count.set(&old.unwrap_or(0));
            self.changed.set(&0);
            value.clear();
        }
        Ok(())
    }

    /// The current value.
    #[readonly]
    fn get(&self) -> i64 {
        self.count.get_or_default()
    }

    /// When the value last changed (microseconds since the epoch; 0 if
    /// not since the migration).
    #[readonly]
    fn changed(&self) -> i64 {
        self.changed.get_or_default()
    }

    /// Adds one; returns the new value.
    fn increment(&self) -> Result<i64> {
        self.add(1)
    }

    /// Adds `n`; returns the new value, or an error if it would not fit in
    /// an `i64` (the value is then unchanged).
    fn add(&self, n: i64) -> Result<i64> {
        let count = self.count.get_or_default();
        let Some(sum) = count.checked_add(n) else {
            bail!("counter overflow: {count} + {n}");
        };
        self.count.set(&sum);
        self.changed.set(&now_micros());
        Ok(sum)
    }
}

lambdastore_sdk::app!(Counter);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::MockHost;
    use serde_json::json;

    /// Makes `id` look like an object version 1 wrote: `value` only.
    fn as_version_1(host: &MockHost, id: ObjectId, value: i64) {
        host.with_object(id, || {
            lambdastore_sdk::host::delete("lambdastore.version", b"");
            lambdastore_sdk::host::delete("count", b"");
            lambdastore_sdk::host::delete("changed", b"");
            <Cell<i64> as Field>::bind("value").set(&value);
        });
    }

    #[test]
    fn a_new_object_needs_no_migration() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!({"initial": 5})).unwrap();
        assert_eq!(host.invoke(id, "migrate", json!(null)).unwrap(), json!({"from": 2, "to": 2}));
        assert_eq!(host.invoke(id, "get", json!(null)).unwrap(), json!(5));
    }

    #[test]
    fn a_readonly_call_on_an_old_object_migrates_it_first() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        as_version_1(&host, id, 41);
        assert_eq!(host.invoke(id, "get", json!(null)).unwrap(), json!(41));
        assert_eq!(host.cell::<i64>(id, "value"), None, "version 1's field is gone");
        assert_eq!(host.cell::<u32>(id, "lambdastore.version"), Some(2));
        assert_eq!(host.invoke(id, "increment", json!(null)).unwrap(), json!(42));
        assert_eq!(host.invoke(id, "migrate", json!(null)).unwrap(), json!({"from": 2, "to": 2}));
    }

    #[test]
    fn migrate_called_directly_reports_what_it_did() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        as_version_1(&host, id, 7);
        assert_eq!(host.invoke(id, "migrate", json!(null)).unwrap(), json!({"from": 1, "to": 2}));
        assert_eq!(host.invoke(id, "changed", json!(null)).unwrap(), json!(0));
        assert_eq!(host.invoke(id, "get", json!(null)).unwrap(), json!(7));
    }

    #[test]
    fn fields_newer_than_the_code_are_refused_not_misread() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        host.with_object(id, || <Cell<u32> as Field>::bind("lambdastore.version").set(&3));
        let err = host.invoke(id, "get", json!(null)).unwrap_err();
        assert!(
            matches!(&err, CallError::Application(m) if m.contains("at version 3, newer than this code's 2")),
            "{err}"
        );
    }

    #[test]
    fn a_migration_that_fails_leaves_the_object_as_it_was() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        as_version_1(&host, id, 1);
        host.with_object(id, || lambdastore_sdk::host::put("value", b"", b"\"not a number\""));
        let err = host.invoke(id, "increment", json!(null)).unwrap_err();
        assert!(matches!(&err, CallError::Application(m) if m.contains("from version 1 to 2")), "{err}");
        assert_eq!(host.cell::<u32>(id, "lambdastore.version"), None, "still at version 1");
    }
}
