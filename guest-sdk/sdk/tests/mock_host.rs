//! The mock host enforces the real host's rules: savepoints, visibility,
//! readonly, kinds; and the fields behave over many pages of entries.

use std::panic::{catch_unwind, AssertUnwindSafe};

use lambdastore_sdk::desc::FunctionKind;
use lambdastore_sdk::mock::MockHost;
use lambdastore_sdk::prelude::*;
use lambdastore_sdk::Application;
use serde_json::json;

#[lambda_object]
pub struct Node {
    value: Cell<i64>,
    events: MultiMap<String, i64>,
    tags: Set<String>,
}

#[lambda_functions]
impl Node {
    #[constructor]
    fn new(&self, value: Option<i64>) -> Result<()> {
        if value == Some(-1) {
            bail!("-1 is not a value");
        }
        self.value.set(&value.unwrap_or(0));
        Ok(())
    }

    fn set(&self, value: i64) {
        self.value.set(&value);
    }

    #[readonly]
    fn get(&self) -> i64 {
        self.value.get_or_default()
    }

    #[readonly]
    fn try_get(&self) -> Result<Option<i64>> {
        Ok(self.value.try_get()?)
    }

    /// Writes `value` here and on `target`, then fails if asked to.
    fn relay(&self, value: i64, target: NodeRef, fail: bool) -> Result<()> {
        self.value.set(&value);
        target.set(value)?;
        if fail {
            bail!("relay failed after writing");
        }
        Ok(())
    }

    /// Calls a failing relay, ignores the error, writes, and reports it.
    fn recover(&self, via: NodeRef, target: NodeRef) -> String {
        let err = via.relay(7, target, true).unwrap_err();
        self.value.set(&100);
        err.to_string()
    }

    #[readonly]
    fn sneaky_write(&self) {
        self.value.set(&666);
    }

    #[readonly]
    fn readonly_calls_writer(&self, target: NodeRef) -> Result<()> {
        Ok(target.set(1)?)
    }

    /// Returns the clock twice around a nested call.
    fn clocks(&self, other: NodeRef) -> Result<(i64, i64)> {
        let before = now_micros();
        other.get()?;
        Ok((before, now_micros()))
    }

    fn record(&self, event: String, value: i64) {
        self.events.insert(&event, &value);
        self.tags.insert(&event);
    }

    #[readonly]
    fn events(&self, event: String) -> Vec<i64> {
        let mut values = self.events.get_all(&event);
        values.sort();
        values
    }

    #[readonly]
    fn tags(&self) -> Vec<String> {
        self.tags.iter().collect()
    }

    fn schedule(&self, target: NodeRef, value: i64) -> Result<()> {
        Ok(lambdastore_sdk::spawn(target, "set", &json!({ "value": value }))?)
    }

    /// Sets `value`, then writes `field` through the raw host interface.
    fn set_then_put_raw(&self, value: i64, field: String) {
        self.value.set(&value);
        lambdastore_sdk::host::put(&field, &[], b"1");
    }

    /// `n / d` for each pair: 0/0 is NaN, 1/0 infinity.
    #[readonly]
    fn ratios(&self, pairs: Vec<(f64, f64)>) -> Vec<f64> {
        pairs.into_iter().map(|(n, d)| n / d).collect()
    }

    #[protected]
    fn internal() -> u8 {
        1
    }

    fn create_many(n: u32) -> Result<Vec<NodeRef>> {
        Ok((0..n).map(|i| NodeRef::new(Some(i.into()))).collect::<Result<_, _>>()?)
    }
}

/// A type without constructor or fields.
#[lambda_object]
pub struct Plain;

#[lambda_functions]
impl Plain {
    fn hello(&self) -> String {
        format!("hello from {}", self_id())
    }
}

lambdastore_sdk::app!(Node, Plain);

fn node(host: &MockHost, value: i64) -> ObjectId {
    host.create("Node", json!({ "value": value })).unwrap()
}

fn get(host: &MockHost, id: ObjectId) -> i64 {
    host.cell(id, "value").unwrap()
}

#[test]
fn a_failing_call_undoes_its_callees_writes() {
    let host = MockHost::for_app::<App>();
    let (a, b) = (node(&host, 0), node(&host, 0));
    let err = host.invoke(a, "relay", json!({"value": 5, "target": b, "fail": true}));
    assert_eq!(err, Err(CallError::Application("relay failed after writing".into())));
    assert_eq!((get(&host, a), get(&host, b)), (0, 0));

    host.invoke(a, "relay", json!([5, b, false])).unwrap();
    assert_eq!((get(&host, a), get(&host, b)), (5, 5));
}

#[test]
fn the_caller_of_a_failed_nested_call_goes_on() {
    let host = MockHost::for_app::<App>();
    let (a, b, c) = (node(&host, 1), node(&host, 2), node(&host, 3));
    let message = host.invoke(a, "recover", json!([b, c])).unwrap();
    assert_eq!(message, json!("relay failed after writing"));
    // b and c wrote 7 inside the failed call: gone. a's own write stays.
    assert_eq!((get(&host, a), get(&host, b), get(&host, c)), (100, 2, 3));
}

#[test]
fn readonly_functions_and_their_callees_may_not_write() {
    let host = MockHost::for_app::<App>();
    let (a, b) = (node(&host, 1), node(&host, 2));
    let panic = catch_unwind(AssertUnwindSafe(|| host.invoke(a, "sneaky_write", json!(null))));
    let message = *panic.unwrap_err().downcast::<String>().unwrap();
    assert!(message.starts_with("readonly function Node.sneaky_write may not write"), "{message}");
    assert_eq!(get(&host, a), 1);

    let panic = catch_unwind(AssertUnwindSafe(|| host.invoke(a, "readonly_calls_writer", json!([b]))));
    assert!(panic.is_err());
    assert_eq!(get(&host, b), 2);
    // The host still works after an aborted workflow.
    host.invoke(b, "set", json!([3])).unwrap();
    assert_eq!(get(&host, b), 3);
}

#[test]
fn a_field_name_with_a_nul_byte_aborts_the_workflow() {
    let host = MockHost::for_app::<App>();
    let a = node(&host, 1);
    let panic = catch_unwind(AssertUnwindSafe(|| host.invoke(a, "set_then_put_raw", json!([2, "value\0evil"]))));
    let message = *panic.unwrap_err().downcast::<String>().unwrap();
    assert_eq!(message, r#"field name "value\0evil" of "Node.set_then_put_raw" contains a NUL byte"#);
    assert_eq!(get(&host, a), 1);
    // Reads are refused too.
    let read = catch_unwind(AssertUnwindSafe(|| host.with_object(a, || lambdastore_sdk::host::get("\0", &[]))));
    assert!(read.is_err());
}

#[test]
fn a_result_holding_nan_or_infinity_fails_the_call() {
    let host = MockHost::for_app::<App>();
    let a = node(&host, 0);
    let ratios = |pairs| host.invoke(a, "ratios", json!({ "pairs": pairs }));
    assert_eq!(ratios(json!([[1, 2], [3, 4]])), Ok(json!([0.5, 0.75])));
    // serde_json alone would return these as `null`.
    for (n, d) in [(0, 0), (1, 0), (-1, 0)] {
        assert_eq!(
            ratios(json!([[1, 2], [n, d]])),
            Err(CallError::Application(
                "cannot encode the result as JSON: it contains a non-finite float \
                 (NaN or infinity), which JSON cannot represent"
                    .into()
            ))
        );
    }
}

#[test]
fn a_failed_constructor_leaves_no_object() {
    let host = MockHost::for_app::<App>();
    let err = host.create("Node", json!({"value": -1})).unwrap_err();
    assert_eq!(err, CallError::Application("-1 is not a value".into()));
    assert!(host.objects().is_empty());
    // Ids are not reused, like a sequence.
    assert_eq!(node(&host, 0), 2);
}

#[test]
fn kinds_must_match() {
    let host = MockHost::for_app::<App>();
    let a = node(&host, 0);
    let unknown = |name: &str| Err(CallError::UnknownFunction(name.into()));
    assert_eq!(host.invoke(a, "new", json!(null)), unknown("Node.new"));
    assert_eq!(host.invoke_static("Node", "get", json!(null)), unknown("Node.get"));
    assert_eq!(host.invoke_static("Nope", "get", json!(null)), unknown("Nope.get"));
    // The dispatcher checks kinds too, and unknown types.
    let err = |name: &str| CallError::UnknownFunction(name.into());
    assert_eq!(App::dispatch(FunctionKind::Static, "Node", "set", 0, "[1]").unwrap_err(), err("Node.set"));
    assert_eq!(App::dispatch(FunctionKind::Method, "Nope", "f", 1, "null").unwrap_err(), err("Nope"));
}

#[test]
fn protected_static_functions_are_for_lambdas_only() {
    let host = MockHost::for_app::<App>();
    let err = host.invoke_static("Node", "internal", json!(null)).unwrap_err();
    assert!(matches!(err, CallError::NotAllowed(_)), "{err}");
}

#[test]
fn static_functions_create_objects() {
    let host = MockHost::for_app::<App>();
    let created = host.invoke_static("Node", "create_many", json!({"n": 3})).unwrap();
    assert_eq!(created, json!([1, 2, 3]));
    assert_eq!(get(&host, 3), 2);
}

#[test]
fn types_without_constructor_take_no_arguments() {
    let host = MockHost::for_app::<App>();
    let p = host.create("Plain", json!(null)).unwrap();
    assert_eq!(host.invoke(p, "hello", json!({})).unwrap(), json!(format!("hello from {p}")));
    assert!(matches!(host.create("Plain", json!([1])), Err(CallError::BadArguments(_))));
}

#[test]
fn a_stored_value_that_does_not_decode_fails_the_call() {
    let host = MockHost::for_app::<App>();
    let a = node(&host, 0);
    host.with_object(a, || Cell::<String>::new("value").set("not a number"));
    let err = host.invoke(a, "get", json!(null)).unwrap_err();
    let CallError::Application(message) = err else { panic!("{err:?}") };
    assert!(message.starts_with("field `value`: stored value does not decode as i64"), "{message}");
    // try_get hands the error to the function instead.
    let err = host.invoke(a, "try_get", json!(null)).unwrap_err();
    assert!(err.to_string().starts_with("field `value`"), "{err}");
}

#[test]
fn the_clock_is_the_transactions() {
    let host = MockHost::for_app::<App>();
    let (a, b) = (node(&host, 0), node(&host, 0));
    host.set_now_micros(42);
    let clocks: (i64, i64) = serde_json::from_value(host.invoke(a, "clocks", json!([b])).unwrap()).unwrap();
    assert_eq!(clocks, (42, 42));
    assert!(host.now_micros() > 42);
}

#[test]
fn multimaps_and_sets() {
    let host = MockHost::for_app::<App>();
    let a = node(&host, 0);
    for (event, value) in [("click", 2), ("view", 9), ("click", 1), ("click", 2)] {
        host.invoke(a, "record", json!([event, value])).unwrap();
    }
    assert_eq!(host.invoke(a, "events", json!(["click"])).unwrap(), json!([1, 2, 2]));
    assert_eq!(host.invoke(a, "events", json!(["none"])).unwrap(), json!([]));
    assert_eq!(host.invoke(a, "tags", json!(null)).unwrap(), json!(["click", "view"]));
}

#[test]
fn spawned_calls_run_after_their_workflow_commits() {
    let host = MockHost::for_app::<App>();
    let (a, b) = (node(&host, 0), node(&host, 0));
    host.invoke(a, "schedule", json!([b, 9])).unwrap();
    assert_eq!(get(&host, b), 0);
    assert_eq!(host.run_spawned(), [Ok(json!(null))]);
    assert_eq!(get(&host, b), 9);
    assert!(host.take_spawned().is_empty());
}

#[test]
fn references_serialize_as_plain_ids() {
    let r = NodeRef::from_id(12);
    assert_eq!(serde_json::to_value(r).unwrap(), json!(12));
    assert_eq!(serde_json::from_value::<NodeRef>(json!(12)).unwrap(), r);
    assert_eq!(format!("{r:?}"), "NodeRef(12)");
    assert_eq!(ObjectId::from(r), 12);
}

#[test]
fn iteration_pages_through_many_entries() {
    let _host = MockHost::standalone();
    let map: Map<u32, u32> = Map::new("numbers");
    for i in 0..1000u32 {
        map.insert(&i, &(i * 2));
    }
    assert_eq!(map.iter().count(), 1000);
    assert!(map.iter().enumerate().all(|(i, (k, v))| k == i as u32 && v == k * 2));
    let newest: Vec<u32> = map.iter().rev().map(|(k, _)| k).take(300).collect();
    assert_eq!(newest, (700..1000).rev().collect::<Vec<_>>());
    assert_eq!(map.range(100..400).count(), 300);
    assert_eq!(map.range(..=0).count(), 1);
    assert_eq!(map.range(998..).rev().limit(1).next(), Some((999, 1998)));
    assert_eq!(map.iter().limit(200).count(), 200);
    assert_eq!((map.first(), map.last()), (Some((0, 0)), Some((999, 1998))));

    let multi: MultiMap<u32, u32> = MultiMap::new("multi");
    for i in 0..300u32 {
        multi.insert(&(i % 3), &i);
    }
    assert_eq!(multi.get_all(&1).len(), 100);
    assert_eq!(multi.range(1..=1).count(), 100);
    assert_eq!(multi.range(1..).count(), 200);
    assert!(multi.iter().map(|(k, _)| k).is_sorted());
    assert_eq!(multi.remove_all(&0), 100);
    assert_eq!(multi.iter().count(), 200);
}
