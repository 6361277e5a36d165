//! The smallest LambdaStore application: a counter object.

use lambdastore_sdk::prelude::*;

/// A counter: one integer cell.
#[lambda_object]
pub struct Counter {
    value: Cell<i64>,
}

#[lambda_functions]
impl Counter {
    /// Starts at `initial`, or 0.
    #[constructor]
    fn new(&self, initial: Option<i64>) {
        self.value.set(&initial.unwrap_or(0));
    }

    /// The current value.
    #[readonly]
    fn get(&self) -> i64 {
        self.value.get_or_default()
    }

    /// Adds one; returns the new value.
    fn increment(&self) -> Result<i64> {
        self.add(1)
    }

    /// Adds `n`; returns the new value, or an error if it would not fit in
    /// an `i64` (the value is then unchanged).
    fn add(&self, n: i64) -> Result<i64> {
        let value = self.value.get_or_default();
        let Some(sum) = value.checked_add(n) else {
            bail!("counter overflow: {value} + {n}");
        };
        self.value.set(&sum);
        Ok(sum)
    }

    /// Adds `n` to each of `counters` with one map call, and adds here the
    /// number that took it: each counter's new value, or why it failed
    /// (that counter unchanged, the others kept).
    fn add_to_each(
        &self,
        counters: Vec<CounterRef>,
        n: i64,
    ) -> Result<Vec<(ObjectId, std::result::Result<i64, String>)>> {
        let ids: Vec<ObjectId> = counters.into_iter().map(CounterRef::id).collect();
        let outcomes = lambdastore_sdk::map_call::<i64, _>(&ids, "add", &serde_json::json!({ "n": n }))?;
        self.add(outcomes.iter().filter(|(_, outcome)| outcome.is_ok()).count() as i64)?;
        Ok(outcomes.into_iter().map(|(id, outcome)| (id, outcome.map_err(|err| err.to_string()))).collect())
    }
}

lambdastore_sdk::app!(Counter);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::MockHost;
    use serde_json::json;

    #[test]
    fn starts_at_the_initial_value_or_zero() {
        let host = MockHost::for_app::<App>();
        let a = host.create("Counter", json!({"initial": 5})).unwrap();
        let b = host.create("Counter", json!(null)).unwrap();
        assert_eq!(host.invoke(a, "get", json!({})).unwrap(), json!(5));
        assert_eq!(host.invoke(b, "get", json!(null)).unwrap(), json!(0));
    }

    #[test]
    fn increment_and_add_return_the_new_value() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!([])).unwrap();
        assert_eq!(host.invoke(id, "increment", json!(null)).unwrap(), json!(1));
        assert_eq!(host.invoke(id, "add", json!({"n": 41})).unwrap(), json!(42));
        assert_eq!(host.invoke(id, "add", json!([-2])).unwrap(), json!(40));
        assert_eq!(host.cell::<i64>(id, "value"), Some(40));
    }

    #[test]
    fn overflow_is_an_error_and_keeps_the_value() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!({"initial": i64::MAX})).unwrap();
        assert_eq!(
            host.invoke(id, "increment", json!(null)),
            Err(CallError::Application("counter overflow: 9223372036854775807 + 1".into()))
        );
        let low = host.create("Counter", json!([i64::MIN + 1])).unwrap();
        assert_eq!(
            host.invoke(low, "add", json!([-2])),
            Err(CallError::Application("counter overflow: -9223372036854775807 + -2".into()))
        );
        assert_eq!(host.cell::<i64>(id, "value"), Some(i64::MAX));
        assert_eq!(host.cell::<i64>(low, "value"), Some(i64::MIN + 1));
    }

    #[test]
    fn typed_references_work_from_tests_too() {
        let _host = MockHost::for_app::<App>();
        let counter = CounterRef::new(Some(1)).unwrap();
        assert_eq!(counter.add(2).unwrap(), 3);
        assert_eq!(counter.get().unwrap(), 3);
    }

    #[test]
    fn add_to_each_reports_each_counter_and_rolls_back_only_the_one_that_failed() {
        let host = MockHost::for_app::<App>();
        let me = host.create("Counter", json!(null)).unwrap();
        let a = host.create("Counter", json!({"initial": 1})).unwrap();
        let full = host.create("Counter", json!({"initial": i64::MAX})).unwrap();
        let outcomes = host.invoke(me, "add_to_each", json!({"counters": [a, full, a], "n": 2})).unwrap();
        let overflow = format!("counter overflow: {} + 2", i64::MAX);
        assert_eq!(outcomes, json!([[a, {"Ok": 3}], [full, {"Err": overflow}]]), "each counter once, in order");
        assert_eq!(host.cell::<i64>(a, "value"), Some(3));
        assert_eq!(host.cell::<i64>(full, "value"), Some(i64::MAX));
        assert_eq!(host.cell::<i64>(me, "value"), Some(1), "one counter took it");
    }

    #[test]
    fn mistyped_or_missing_arguments_are_rejected() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        let err = host.invoke(id, "add", json!({"n": "two"})).unwrap_err();
        assert!(matches!(err, CallError::BadArguments(ref m) if m.starts_with("parameter `n`")), "{err}");
        let err = host.invoke(id, "add", json!({})).unwrap_err();
        assert_eq!(err, CallError::BadArguments("missing parameter `n`".into()));
        let err = host.invoke(id, "get", json!({"n": 1})).unwrap_err();
        assert!(matches!(err, CallError::BadArguments(_)), "{err}");
    }

    #[test]
    fn unknown_objects_and_functions_are_errors() {
        let host = MockHost::for_app::<App>();
        let id = host.create("Counter", json!(null)).unwrap();
        assert_eq!(host.invoke(id, "reset", json!(null)), Err(CallError::UnknownFunction("Counter.reset".into())));
        assert_eq!(host.invoke(99, "get", json!(null)), Err(CallError::UnknownObject(99)));
        assert!(matches!(host.create("Nope", json!(null)), Err(CallError::UnknownFunction(_))));
    }

    #[test]
    fn describes_its_type() {
        use lambdastore_sdk::desc::FunctionKind;
        use lambdastore_sdk::Application;
        let app = App::describe();
        let counter = &app.types[0];
        assert_eq!(counter.name, "Counter");
        assert_eq!(counter.fields[0].name, "value");
        let get = counter.function("get").unwrap();
        assert!(get.readonly && !get.protected && get.kind == FunctionKind::Method);
        assert_eq!(counter.constructor().unwrap().name, "new");
    }
}
