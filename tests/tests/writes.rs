//! How a workflow's writes land in `lambdastore.entries`. A new value is
//! written straight to the heap (extension/src/catalog/in_place.rs), over
//! the row of an entry that exists or as a new row, not by the upsert
//! statement; these tests hold it to what the statement guarantees: the
//! index finds every row version, a trigger someone put on the table fires,
//! a row changed by a concurrent transaction gets the call's value, a new
//! entry never outlives its object, and a key another transaction inserts
//! meanwhile is updated, not refused.

mod common;

use common::*;
use postgres::{Client, GenericClient};
use serde_json::{json, Value};

/// The micro app's `data` entries of `object`, key by key, as the index
/// finds them and as a sequential scan does: (key, value).
fn data_by(c: &mut Client, object: i64, index: bool) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut tx = c.transaction().unwrap();
    let scans = if index {
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
    } else {
        "SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; SET LOCAL enable_bitmapscan = off"
    };
    tx.batch_execute(scans).unwrap();
    // One probe per key: what a lambda's read does.
    let mut rows = Vec::new();
    for k in 0..300i32 {
        let found = tx
            .query_opt(
                "SELECT key, value FROM lambdastore.entries WHERE object_id = $1 AND field = 'data' AND key = int4send($2)",
                &[&object, &k],
            )
            .unwrap();
        rows.extend(found.map(|r| (r.get(0), r.get(1))));
    }
    tx.commit().unwrap();
    rows
}

/// Where each `data` row of `object` is: (key, heap page).
fn pages(c: &mut impl GenericClient, object: i64) -> Vec<(Vec<u8>, String)> {
    c.query(
        "SELECT key, (ctid::text::point)[0]::text FROM lambdastore.entries
          WHERE object_id = $1 AND field = 'data' ORDER BY key",
        &[&object],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[test]
fn values_written_in_place_stay_found_through_the_index() {
    // A Bench object has 100 entries of 1 KiB: 7 to a page, its pages full,
    // so a new version often has to go to another page and needs an index
    // entry of its own (the update is not HOT).
    let (mut c, _, id) = micro_object("overwrite_index");
    let before = pages(&mut c, id);
    for round in 0..8u32 {
        for first in (0..100u32).step_by(5) {
            let keys: Vec<u32> = (first..first + 5).collect();
            let found = call(&mut c, id, "touch", json!({"keys": keys, "write": true}));
            assert_eq!(found, json!(5), "round {round}: the call read its 5 keys");
        }
    }
    let after = pages(&mut c, id);
    let moved = before.iter().zip(&after).filter(|(b, a)| b.1 != a.1).count();
    assert!(moved > 0, "no row left its page, so no update needed an index entry: {after:?}");

    // New keys, inserted as new rows, one workflow writing several.
    for first in (100..300u32).step_by(10) {
        let keys: Vec<u32> = (first..first + 10).collect();
        assert_eq!(call(&mut c, id, "touch", json!({"keys": keys, "write": true})), json!(0));
    }
    let inserted = count(&mut c, &format!("SELECT count(*) FROM lambdastore.entries WHERE object_id = {id}"));
    assert_eq!(inserted, 300, "every new key has its row");

    let by_index = data_by(&mut c, id, true);
    let by_scan = data_by(&mut c, id, false);
    assert_eq!(by_index.len(), 300, "the index finds every key ({moved} rows moved to another page)");
    assert_eq!(by_index, by_scan, "the index finds each key's latest value");
    let read = call(&mut c, id, "touch", json!({"keys": (0..300).collect::<Vec<u32>>(), "write": false}));
    assert_eq!(read, json!(300), "a lambda reads every key");

    // amcheck: every heap tuple that should be indexed is.
    c.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck").unwrap();
    c.batch_execute("SELECT bt_index_check('lambdastore.entries_pkey', true)").unwrap();
}

#[test]
fn a_trigger_on_the_entries_table_sees_every_write() {
    // A trigger changes the table for every test; this one has a database
    // of its own.
    let scratch = ScratchDatabase::new("overwrite_trigger");
    let mut c = scratch.connect();
    c.batch_execute("CREATE EXTENSION lambdastore").unwrap();
    let app = app("overwrite_trigger");
    deploy_example(&mut c, &app, "micro");
    let id = create(&mut c, &app, "Bench", json!({}));
    // This session writes over rows and inserts new ones, and remembers
    // that the table allows it.
    call(&mut c, id, "touch", json!({"keys": [6, 7, 300], "write": true}));

    // Another session adds a trigger on INSERT; the next write of this one
    // must fire it for its new entries (and not for the others).
    let mut other = scratch.connect();
    other
        .batch_execute(
            "CREATE TABLE audit (object_id bigint, key bytea, bytes int);
             CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.audit VALUES (NEW.object_id, NEW.key, length(NEW.value));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER audit_insert AFTER INSERT ON lambdastore.entries FOR EACH ROW EXECUTE FUNCTION audit();",
        )
        .unwrap();
    call(&mut c, id, "touch", json!({"keys": [1, 2, 200, 201], "write": true}));
    assert_eq!(audited(&mut c), [200, 201], "the INSERT trigger fired once for each new entry");

    // Then one on UPDATE: it fires for the entries written over.
    other
        .batch_execute(
            "CREATE TRIGGER audit_update AFTER UPDATE ON lambdastore.entries FOR EACH ROW EXECUTE FUNCTION audit()",
        )
        .unwrap();
    call(&mut c, id, "touch", json!({"keys": [3, 4, 5, 202], "write": true}));
    assert_eq!(audited(&mut c), [3, 4, 5, 200, 201, 202], "the triggers fired once for each entry written");
    let bytes = count(&mut c, "SELECT count(*) FROM audit WHERE bytes = 1026");
    assert_eq!(bytes, 6, "each with the call's 1 KiB value");
}

/// The keys the test's trigger audited, in order.
fn audited(c: &mut Client) -> Vec<u32> {
    let rows = c.query("SELECT key FROM audit ORDER BY key", &[]).unwrap();
    rows.iter().map(|r| u32::from_be_bytes(r.get::<_, Vec<u8>>(0).try_into().unwrap())).collect()
}

/// A call writing `key` of `object` (micro's `touch`, on a new session
/// that first runs `setup`) while another transaction has run `theirs` and
/// holds it: once the call waits for a lock, that transaction commits.
/// The call's outcome.
fn write_behind(c: &mut Client, object: i64, key: u32, setup: &str, theirs: &str) -> Result<Value, postgres::Error> {
    let mut other = connect();
    let mut tx = other.transaction().unwrap();
    tx.batch_execute(theirs).unwrap();
    let mut caller = connect();
    caller.batch_execute(setup).unwrap();
    let pid = backend_pid(&mut caller);
    let writer =
        std::thread::spawn(move || invoke(&mut caller, object, "touch", json!({"keys": [key], "write": true})));
    wait_until_waiting_for_a_lock(c, pid);
    tx.commit().unwrap();
    writer.join().unwrap()
}

/// The value of `data` entry `key` of `object`.
fn data_value(c: &mut Client, object: i64, key: u32) -> Vec<u8> {
    let sql = "SELECT value FROM lambdastore.entries WHERE object_id = $1 AND field = 'data' AND key = int4send($2)";
    c.query_one(sql, &[&object, &(key as i32)]).unwrap().get(0)
}

#[test]
fn a_row_updated_by_a_concurrent_transaction_gets_the_calls_value() {
    let (mut c, _, id) = micro_object("overwrite_concurrent");
    // The call read the row before the other transaction's update commits;
    // its write waits for it.
    let theirs = format!(
        "UPDATE lambdastore.entries SET value = '\"theirs\"' WHERE object_id = {id} AND field = 'data' AND key = int4send(3)"
    );
    assert_eq!(write_behind(&mut c, id, 3, "", &theirs).unwrap(), json!(1));
    let value = data_value(&mut c, id, 3);
    assert_eq!(value.len(), 1026, "the call committed after the other transaction: its 1 KiB value is the row's");
}

#[test]
fn a_new_entry_of_an_object_being_deleted_waits_and_is_refused() {
    let (mut c, _, id) = micro_object("insert_deleted_object");
    // Another transaction deletes the object (its entries go with it). The
    // call read the object before that commits; its new key's insert waits
    // for the deletion, as the foreign key's check would, then conflicts
    // with it (the statement's check said 23503).
    let theirs = format!("DELETE FROM lambdastore.objects WHERE object_id = {id}");
    let refused = expect_sqlstate(write_behind(&mut c, id, 500, "", &theirs), "40001");
    assert!(refused.contains("deleted by a concurrent transaction"), "{refused}");
    let left = count(&mut c, &format!("SELECT count(*) FROM lambdastore.entries WHERE object_id = {id}"));
    assert_eq!(left, 0, "no entry outlives its object");
}

#[test]
fn a_key_inserted_by_a_concurrent_transaction_gets_the_calls_value() {
    let (mut c, _, id) = micro_object("insert_concurrent");
    // Without OCC nothing keeps two writers of a key apart: the call's
    // write waits for the other's insert and then updates its row, as the
    // upsert statement does, rather than failing on the unique key.
    let theirs = format!(
        "INSERT INTO lambdastore.entries (object_id, field, key, value) VALUES ({id}, 'data', int4send(400), '\"theirs\"')"
    );
    let outcome = write_behind(&mut c, id, 400, "SET lambdastore.concurrency_control = off", &theirs);
    assert_eq!(outcome.expect("the call commits"), json!(0));
    let value = data_value(&mut c, id, 400);
    assert_eq!(value.len(), 1026, "the call committed after the other transaction: its 1 KiB value is the row's");
}
