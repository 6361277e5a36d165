//! How a workflow's writes land in `lambdastore.entries`. A new value of an
//! entry that exists is written over its row straight through the heap
//! (extension/src/catalog/probe.rs, `overwrite`), not by the upsert
//! statement; these tests hold it to what the statement guarantees: the
//! index finds every row version, a trigger someone put on the table fires,
//! and a row changed by a concurrent transaction gets the call's value.

mod common;

use common::*;
use postgres::{Client, GenericClient};
use serde_json::json;

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
    for k in 0..100i32 {
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
fn values_written_over_their_rows_stay_found_through_the_index() {
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

    let by_index = data_by(&mut c, id, true);
    let by_scan = data_by(&mut c, id, false);
    assert_eq!(by_index.len(), 100, "the index finds every key ({moved} rows moved to another page)");
    assert_eq!(by_index, by_scan, "the index finds each key's latest value");
    let read = call(&mut c, id, "touch", json!({"keys": (0..100).collect::<Vec<u32>>(), "write": false}));
    assert_eq!(read, json!(100), "a lambda reads every key");

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
    // This session writes over rows, and remembers that the table allows it.
    call(&mut c, id, "touch", json!({"keys": [6, 7], "write": true}));

    // Another session adds a trigger; the next write of this one must fire it.
    scratch
        .connect()
        .batch_execute(
            "CREATE TABLE audit (object_id bigint, key bytea, bytes int);
             CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.audit VALUES (NEW.object_id, NEW.key, length(NEW.value));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER audit AFTER UPDATE ON lambdastore.entries FOR EACH ROW EXECUTE FUNCTION audit();",
        )
        .unwrap();
    call(&mut c, id, "touch", json!({"keys": [1, 2, 3, 4, 5], "write": true}));
    let audited: Vec<(i64, Vec<u8>, i32)> = c
        .query("SELECT object_id, key, bytes FROM audit ORDER BY key", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected: Vec<(i64, Vec<u8>, i32)> = (1..=5u32).map(|k| (id, k.to_be_bytes().to_vec(), 1026)).collect();
    assert_eq!(audited, expected, "the trigger fired once for each entry written");
}

#[test]
fn a_row_updated_by_a_concurrent_transaction_gets_the_calls_value() {
    let (mut c, _, id) = micro_object("overwrite_concurrent");
    let key = 3u32.to_be_bytes().to_vec();
    let theirs = br#""theirs""#.to_vec();

    // Another transaction updates the row and holds it.
    let mut other = connect();
    let mut tx = other.transaction().unwrap();
    tx.execute(
        "UPDATE lambdastore.entries SET value = $3 WHERE object_id = $1 AND field = 'data' AND key = $2",
        &[&id, &key, &theirs],
    )
    .unwrap();

    // The call read the row before that commits; its write waits for it.
    let mut caller = connect();
    let pid = backend_pid(&mut caller);
    let writer = std::thread::spawn(move || call(&mut caller, id, "touch", json!({"keys": [3], "write": true})));
    wait_until_waiting_for_a_lock(&mut c, pid);
    tx.commit().unwrap();
    assert_eq!(writer.join().unwrap(), json!(1));

    let value: Vec<u8> = c
        .query_one(
            "SELECT value FROM lambdastore.entries WHERE object_id = $1 AND field = 'data' AND key = $2",
            &[&id, &key],
        )
        .unwrap()
        .get(0);
    assert_ne!(value, theirs, "the call committed after the other transaction: its value is the row's");
    assert_eq!(value.len(), 1026, "the call's 1 KiB value");
}
