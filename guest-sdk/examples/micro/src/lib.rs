//! Microbenchmark and fault-injection lambdas, for the host's benchmarks and
//! tests: compute, reads, writes, nested-call depth, savepoints, functions
//! that misbehave on purpose (spin, allocate, panic, huge results, results
//! jsonb cannot hold, field names with a NUL byte), and functions that push
//! the host's limits on writes, scans, logs and spawns.

use std::hint::black_box;

use lambdastore_sdk::prelude::*;
use sha2::{Digest, Sha512};

/// Entries in the `data` map.
const ENTRIES: u32 = 100;
/// Bytes per `data` value and per hashed buffer.
const VALUE_BYTES: usize = 1024;

/// The benchmark object.
#[lambda_object]
pub struct Bench {
    /// Keys 0..100, 1 KiB strings.
    data: Map<u32, String>,
    /// A plain key-value map for generic tests.
    kv: Map<String, String>,
    /// How many times `tally` ran.
    count: Cell<i64>,
    /// Per `tally` tag, how many times it ran with that tag.
    seen: Map<u64, u32>,
}

/// A 1 KiB value derived from `seed`: 32 printable characters drawn from
/// it, repeated 32 times, as the PL/pgSQL baseline makes its value (md5's
/// 32 hex digits, repeated; bench/sql/plpgsql/micro.sql). Drawing all 1,024
/// characters cost the guest 9 µs of a 100%-write transaction's 240 (perf),
/// work the baseline does not do.
fn value(seed: u64) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed;
    const DRAWN: usize = 32; // md5's hex digits
    let drawn: Vec<u8> = (0..DRAWN)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            alphabet[(x >> 58) as usize % alphabet.len()]
        })
        .collect();
    // Checked as UTF-8 before it is repeated: 32 bytes, not 1,024.
    String::from_utf8(drawn).expect("the alphabet is ASCII").repeat(VALUE_BYTES / DRAWN)
}

/// `k` distinct keys of `data`, chosen with host randomness.
fn random_keys(k: u32) -> Result<Vec<u32>> {
    if k > ENTRIES {
        bail!("k must be at most {ENTRIES}, got {k}");
    }
    // Partial Fisher-Yates shuffle.
    let mut keys: Vec<u32> = (0..ENTRIES).collect();
    for i in 0..k as usize {
        let j = i + (random_u64() % (keys.len() - i) as u64) as usize;
        keys.swap(i, j);
    }
    keys.truncate(k as usize);
    Ok(keys)
}

#[lambda_functions]
impl Bench {
    /// Fills `data` with `entries` (default 100) entries of 1 KiB. With
    /// `partner`: draws a tag, tallies the partner with it (a constructor's
    /// nested call), keeps the count it returned in `kv` under "partner",
    /// and spawns a second tally there with the next tag.
    #[constructor]
    fn new(&self, entries: Option<u32>, partner: Option<BenchRef>) -> Result<()> {
        for key in 0..entries.unwrap_or(ENTRIES) {
            self.data.insert(&key, &value(key.into()));
        }
        if let Some(partner) = partner {
            let tag = random_u64();
            let count = partner.tally(tag)?;
            self.kv.insert(&"partner".to_string(), &count.to_string());
            lambdastore_sdk::spawn(partner.id(), "tally", &serde_json::json!({ "tag": tag.wrapping_add(1) }))?;
        }
        Ok(())
    }

    /// Reads the entries `keys` of `data`, or overwrites them with new 1 KiB
    /// values if `write`; returns how many there were. The contention
    /// benchmark's transaction.
    fn touch(&self, keys: Vec<u32>, write: bool) -> u32 {
        let mut found = 0;
        for key in &keys {
            found += u32::from(self.data.contains_key(key));
            if write {
                self.data.insert(key, &value(random_u64()));
            }
        }
        found
    }

    /// `n` chained rounds of SHA-512 over a 1 KiB buffer; the hex of the last digest.
    #[readonly]
    fn hash(&self, n: u32) -> String {
        let mut buffer = [0u8; VALUE_BYTES];
        let mut digest = [0u8; 64];
        for _ in 0..n {
            digest.copy_from_slice(&Sha512::digest(buffer));
            // Feed the digest back so no round can be skipped.
            buffer[..64].copy_from_slice(&digest);
        }
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// SHA-512 over every value of `data`, in key order (1 MiB for an
    /// object of 1,000 entries): read-heavy and compute-heavy, the light
    /// replicas' benchmark (scripts/bench-replicas.sh).
    #[readonly]
    fn digest(&self) -> String {
        let mut hasher = Sha512::new();
        for (_, value) in self.data.iter() {
            hasher.update(value.as_bytes());
        }
        hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads `k` distinct random entries; returns their total length.
    #[readonly]
    fn read(&self, k: u32) -> Result<u64> {
        let keys = random_keys(k)?;
        Ok(keys.iter().map(|key| self.data.get(key).map_or(0, |v| v.len() as u64)).sum())
    }

    /// Overwrites `k` distinct random entries with new 1 KiB values; returns `k`.
    fn write(&self, k: u32) -> Result<u32> {
        for key in random_keys(k)? {
            self.data.insert(&key, &value(random_u64()));
        }
        Ok(k)
    }

    /// Never returns, without host calls: for the host's time limit.
    fn spin(&self) {
        let mut x = 0u64;
        loop {
            x = black_box(x.wrapping_add(1));
        }
    }

    /// Allocates and touches `bytes` bytes; returns the count. Past the
    /// host's memory limit, the allocation fails and the lambda traps.
    fn alloc(&self, bytes: u64) -> Result<u64> {
        let Ok(len) = usize::try_from(bytes) else {
            bail!("{bytes} bytes do not fit in the address space");
        };
        let mut buffer = vec![0u8; len];
        // Fresh pages are zero: write one byte per page so they are really used.
        for i in (0..len).step_by(4096) {
            buffer[i] = 1;
        }
        Ok(black_box(buffer).len() as u64)
    }

    /// Panics: a trap for the host.
    fn panic(&self) {
        panic!("micro: deliberate panic");
    }

    /// A string of `bytes` bytes: for the host's result size limit.
    fn big_result(&self, bytes: u64) -> Result<String> {
        let Ok(len) = usize::try_from(bytes) else {
            bail!("{bytes} bytes do not fit in the address space");
        };
        Ok("x".repeat(len))
    }

    /// Fails with `message`: an application error.
    fn fail(&self, message: String) -> Result<(), String> {
        Err(message)
    }

    /// Stores `value` under `key` in `kv`.
    fn put(&self, key: String, value: String) {
        self.kv.insert(&key, &value);
    }

    /// The value of `key` in `kv`.
    #[readonly]
    fn get(&self, key: String) -> Option<String> {
        self.kv.get(&key)
    }

    /// Entries of `kv` with `start <= key < end`, at most `limit` (default
    /// all), in key order or reversed: for the host's range scans.
    #[readonly]
    fn list(
        &self,
        start: Option<String>,
        end: Option<String>,
        limit: Option<u32>,
        reverse: Option<bool>,
    ) -> Vec<(String, String)> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let start = start.map_or(Unbounded, Included);
        let end = end.map_or(Unbounded, Excluded);
        let mut iter = self.kv.range((start, end)).limit(limit.unwrap_or(u32::MAX));
        if reverse.unwrap_or(false) {
            iter = iter.rev();
        }
        iter.collect()
    }

    /// Counts the entries of `kv` with `start <= key < end`; if there are
    /// fewer than `max`, inserts `key` (which must be in the range, value
    /// "x") and returns true, else returns false.
    ///
    /// The decision rests on a range scan, so two concurrent calls that
    /// both count `max - 1` and both insert are a phantom, which only
    /// serializable execution prevents.
    fn insert_if_fewer(&self, start: String, end: String, max: u32, key: String) -> Result<bool> {
        if !(start <= key && key < end) {
            bail!("key {key:?} is not in [{start:?}, {end:?})");
        }
        // `limit`: once `max` entries are seen the answer is known.
        let count = self.kv.range(start..end).limit(max).count() as u32;
        if count >= max {
            return Ok(false);
        }
        self.kv.insert(&key, "x");
        Ok(true)
    }

    /// Applies `puts` and `deletes` to `kv`, then lists it like `list`: the
    /// scan must merge this call's pending writes with the stored entries.
    fn write_then_list(
        &self,
        puts: Vec<(String, String)>,
        deletes: Vec<String>,
        limit: Option<u32>,
        reverse: Option<bool>,
    ) -> Vec<(String, String)> {
        for (key, value) in &puts {
            self.kv.insert(key, value);
        }
        for key in &deletes {
            self.kv.remove(key);
        }
        self.list(None, None, limit, reverse)
    }

    /// Calls itself `depth` levels deep on this object; returns `depth`.
    /// For the host's call-depth limit.
    fn deep(&self, depth: u32) -> Result<u32> {
        if depth == 0 {
            return Ok(0);
        }
        let me = BenchRef::from_id(self_id());
        Ok(me.deep(depth - 1)? + 1)
    }

    /// Reads `first` of `kv`, creates an empty Bench (a step a test can hold
    /// up: object ids come from a sequence it can lock), then copies `from`
    /// to `to`. A workflow that learns the object's entry sets before a
    /// concurrent split and reads after it: for the split check of OCC.
    fn read_pause_copy(&self, first: String, from: String, to: String) -> Result<Option<String>> {
        self.kv.get(&first);
        BenchRef::new(Some(0), None)?;
        let value = self.kv.get(&from);
        if let Some(value) = &value {
            self.kv.insert(&to, value);
        }
        Ok(value)
    }

    /// `read_pause_copy` with a second pause between reading `from` and
    /// writing `to`: a read of `key` on `wait`, which waits while another
    /// transaction holds that key's entry set for writing. A workflow that
    /// learns the entry sets before a concurrent merge, reads under a set
    /// the merge removed, and validates after a writer of the merged set
    /// has committed: for the split count of OCC.
    fn read_pause_copy_wait(
        &self,
        first: String,
        from: String,
        to: String,
        wait: BenchRef,
        key: String,
    ) -> Result<Option<String>> {
        self.kv.get(&first);
        BenchRef::new(Some(0), None)?;
        let value = self.kv.get(&from);
        wait.get(key)?;
        if let Some(value) = &value {
            self.kv.insert(&to, value);
        }
        Ok(value)
    }

    /// Copies `from` to `to` in `kv`; returns the value copied.
    fn copy(&self, from: String, to: String) -> Option<String> {
        let value = self.kv.get(&from)?;
        self.kv.insert(&to, &value);
        Some(value)
    }

    /// Writes, then fails: none of the write may be kept.
    fn put_then_fail(&self, key: String, value: String) -> Result<()> {
        self.kv.insert(&key, &value);
        bail!("put_then_fail: failing after writing `{key}`");
    }

    /// Calls `put_then_fail` on `target`, ignores its error; returns whether
    /// the error was seen. The write must be gone, the caller goes on.
    fn call_and_recover(&self, target: BenchRef, key: String, value: String) -> bool {
        target.put_then_fail(key, value).is_err()
    }

    /// Adds one to `count` and counts `tag` in `seen`. Run as jobs with
    /// distinct tags, a tag seen twice is a job applied twice.
    fn tally(&self, tag: u64) -> i64 {
        let count = self.count.get_or_default() + 1;
        self.count.set(&count);
        self.seen.insert(&tag, &(self.seen.get(&tag).unwrap_or(0) + 1));
        count
    }

    /// Spawns `method(args)` on `target`, then fails if `fail`: a failed
    /// workflow's spawns must never run.
    fn spawn_then(&self, target: ObjectId, method: String, args: serde_json::Value, fail: bool) -> Result<()> {
        lambdastore_sdk::spawn(target, &method, &args)?;
        if fail {
            bail!("spawn_then: failing after spawning {method}");
        }
        Ok(())
    }

    /// `tally(tag)`, and the time it ran (the clock, in microseconds) kept
    /// in `kv` under `at:<tag>`: a delayed job or a timer shows when it fired.
    fn tally_at(&self, tag: u64) -> i64 {
        self.kv.insert(&format!("at:{tag}"), &now_micros().to_string());
        self.tally(tag)
    }

    /// How many times `tally` ran with each tag, and when each tag last ran
    /// (`tally_at`'s clock, in microseconds; 0 if only `tally` ran it).
    #[readonly]
    fn tallies(&self) -> Vec<(u64, u32, i64)> {
        let at = |tag: u64| self.kv.get(&format!("at:{tag}")).and_then(|at| at.parse().ok()).unwrap_or(0);
        self.seen.iter().map(|(tag, runs)| (tag, runs, at(tag))).collect()
    }

    /// Runs for `ms` milliseconds of the clock, and keeps when it started
    /// and ended in `kv` (`ran:<tag>`: "start end", in microseconds): jobs
    /// of an application with a concurrency limit show how many ran at once.
    fn busy(&self, tag: u64, ms: u64) {
        let start = now_micros();
        let mut x = 1u64;
        while now_micros() < start + 1000 * ms as i64 {
            // Between looks at the clock: each look is a host call, kept
            // for a replay.
            for _ in 0..100_000 {
                x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
        }
        self.kv.insert(&format!("ran:{tag}"), &format!("{start} {}", now_micros()));
    }

    /// Spawns `method(args)` on `target`, due `delay_ms` after now.
    fn spawn_after(&self, target: ObjectId, method: String, args: serde_json::Value, delay_ms: u64) -> Result<()> {
        lambdastore_sdk::spawn_after(target, &method, &args, std::time::Duration::from_millis(delay_ms))?;
        Ok(())
    }

    /// Sets this object's timer `name` to run `method(args)` `delay_ms`
    /// after now, then fails if `fail`: a failed workflow's timer must
    /// never fire.
    fn set_timer(
        &self,
        name: String,
        delay_ms: u64,
        method: String,
        args: serde_json::Value,
        fail: bool,
    ) -> Result<()> {
        lambdastore_sdk::set_timer_after(&name, std::time::Duration::from_millis(delay_ms), &method, &args)?;
        if fail {
            bail!("set_timer: failing after setting {name}");
        }
        Ok(())
    }

    /// Sets a timer with a NUL in its name (`in_name`) or in its
    /// arguments: what a lambda can make and SQL cannot send, for the
    /// host's checks of what jsonb and text can store.
    fn set_timer_with_nul(&self, in_name: bool) -> Result<()> {
        let (name, args) =
            if in_name { ("a\0b", serde_json::json!({})) } else { ("t", serde_json::json!({"tag": "a\0b"})) };
        lambdastore_sdk::set_timer_after(name, std::time::Duration::ZERO, "tally_at", &args)?;
        Ok(())
    }

    /// Clears this object's timer `name`.
    fn clear_timer(&self, name: String) -> Result<()> {
        lambdastore_sdk::clear_timer(&name)?;
        Ok(())
    }

    /// A repeating timer: `tally_at(tag)`, then, while `left` > 1, sets
    /// timer `name` again to tick `every_ms` later with the next tag.
    fn tick(&self, name: String, every_ms: u64, left: u32, tag: u64) -> Result<i64> {
        let count = self.tally_at(tag);
        if left > 1 {
            let next = serde_json::json!({"name": name, "every_ms": every_ms, "left": left - 1, "tag": tag + 1});
            lambdastore_sdk::set_timer_after(&name, std::time::Duration::from_millis(every_ms), "tick", &next)?;
        }
        Ok(count)
    }

    /// Calls `spawn_then(.., fail: true)` on itself and ignores the error:
    /// the callee's spawn goes with its other effects.
    fn spawn_in_failed_callee(&self, target: ObjectId, method: String, args: serde_json::Value) -> bool {
        BenchRef::from_id(self_id()).spawn_then(target, method, args, true).is_err()
    }

    /// Calls `method(args)` on `target` and returns its result: a nested
    /// call to any object (on a Citus cluster, maybe on another node).
    fn relay(&self, target: ObjectId, method: String, args: serde_json::Value) -> Result<serde_json::Value> {
        let result = lambdastore_sdk::host::call(target, &method, &args.to_string())?;
        Ok(serde_json::from_str(&result)?)
    }

    /// `relay`s twice, creating an empty Bench in between (a step a test
    /// can hold up, as in `read_pause_copy`): both calls run one code
    /// version of `target`'s application, whatever is deployed meanwhile.
    fn relay_twice(
        &self,
        target: ObjectId,
        method: String,
        args: serde_json::Value,
    ) -> Result<(serde_json::Value, serde_json::Value)> {
        let first = self.relay(target, method.clone(), args.clone())?;
        BenchRef::new(Some(0), None)?;
        Ok((first, self.relay(target, method, args)?))
    }

    /// Puts `key` = `value` in `kv`, then `relay`s: a callee that reads the
    /// key back through a chain of calls must see the new value.
    fn put_and_relay(
        &self,
        key: String,
        value: String,
        target: ObjectId,
        method: String,
        args: serde_json::Value,
    ) -> Result<serde_json::Value> {
        self.kv.insert(&key, &value);
        self.relay(target, method, args)
    }

    /// `relay`, then fails: what the relayed call wrote must be undone with it.
    fn relay_then_fail(&self, target: ObjectId, method: String, args: serde_json::Value) -> Result<()> {
        self.relay(target, method.clone(), args)?;
        bail!("relay_then_fail: failing after {method} on {target:?}");
    }

    /// Calls `method(args)` on `target` and ignores its error; returns
    /// whether there was one.
    fn call_and_ignore(&self, target: ObjectId, method: String, args: serde_json::Value) -> bool {
        lambdastore_sdk::host::call(target, &method, &args.to_string()).is_err()
    }

    /// Draws a random number, then writes `stamp-<number>` in `target`'s
    /// `kv`; returns the number. The key a run writes depends on a draw
    /// made before the call.
    fn stamp(&self, target: BenchRef) -> Result<u64> {
        let n = random_u64();
        target.put(format!("stamp-{n}"), now_micros().to_string())?;
        Ok(n)
    }

    /// Protected: only lambdas of this application may call it.
    #[protected]
    fn secret(&self) -> String {
        "the secret".to_string()
    }

    /// The transaction's clock.
    #[readonly]
    fn now(&self) -> i64 {
        now_micros()
    }

    /// Host randomness.
    #[readonly]
    fn random(&self) -> u64 {
        random_u64()
    }

    /// Writes `message` to the server log at NOTICE.
    #[readonly]
    fn log(&self, message: String) {
        lambdastore_sdk::log::notice(message);
    }

    /// Logs `message` `count` times at NOTICE: for the host's limit on what
    /// one call may log.
    fn log_many(&self, count: u32, message: String) {
        for _ in 0..count {
            lambdastore_sdk::log::notice(&message);
        }
    }

    /// The string of the Unicode code points `codes` (an error for a code
    /// that is not one). `[97, 0, 98]` is "a\0b", a result jsonb cannot
    /// hold: for the host's check of results.
    fn chars(&self, codes: Vec<u32>) -> Result<String> {
        codes
            .into_iter()
            .map(|code| {
                char::from_u32(code).ok_or_else(|| Error::new(format!("{code:#x} is not a Unicode scalar value")))
            })
            .collect()
    }

    /// Stores the UTF-8 of `value` under the UTF-8 of `key` in `field`
    /// (or in the field named by the code points `field_codes`), through
    /// the raw host interface, whatever the field's name: for the host's
    /// refusal of field names with a NUL byte, which JSON arguments cannot
    /// carry (jsonb refuses "\u0000"), hence the code points.
    fn put_raw(&self, field: Option<String>, field_codes: Option<Vec<u32>>, key: String, value: String) -> Result<()> {
        let field = match field_codes {
            Some(codes) => self.chars(codes)?,
            None => field.unwrap_or_default(),
        };
        lambdastore_sdk::host::put(&field, key.as_bytes(), value.as_bytes());
        Ok(())
    }

    /// Inserts `count` entries into `kv`, keys "k00000000", "k00000001", …,
    /// values of `bytes` x's; returns `count`. For the host's limit on what
    /// one workflow may write, and, below it, to fill `kv` for large scans.
    fn put_many(&self, count: u32, bytes: u32) -> u32 {
        let value = "x".repeat(bytes as usize);
        for i in 0..count {
            self.kv.insert(&format!("k{i:08}"), &value);
        }
        count
    }

    /// Writes `bytes` x's under key "hot" of `kv` `count` times; returns
    /// `count`. One entry, but the host's undo journal keeps every value it
    /// replaced: for the write limit, which counts them.
    fn overwrite(&self, count: u32, bytes: u32) -> u32 {
        let value = "x".repeat(bytes as usize);
        for _ in 0..count {
            self.kv.insert("hot", &value);
        }
        count
    }

    /// Spawns `method` with no arguments on this object `count` times;
    /// returns `count`. For the host's limit on spawns per workflow.
    fn spawn_many(&self, count: u32, method: String) -> Result<u32> {
        let no_args = serde_json::Map::new();
        for _ in 0..count {
            lambdastore_sdk::spawn(self_id(), &method, &no_args)?;
        }
        Ok(count)
    }

    /// The bytes of the keys and values of all of `kv`, read with a single
    /// host scan without a limit (where the fields' iterators read pages):
    /// for the host's limit on what one scan may return.
    #[readonly]
    fn scan_count(&self) -> u64 {
        use lambdastore_sdk::host::{self, Direction};
        host::scan(self.kv.name(), None, None, u32::MAX, Direction::Forward)
            .iter()
            .map(|entry| (entry.key.len() + entry.value.len()) as u64)
            .sum()
    }

    /// Calls the protected `secret` of `target` (allowed: a nested call).
    #[readonly]
    fn ask_secret(&self, target: BenchRef) -> Result<String> {
        Ok(target.secret()?)
    }

    /// What a caller receives from each failure it may handle, as the
    /// kind of `CallError` of each probe: calls on a missing object and
    /// function, arguments that do not fit, a missing type (call and
    /// create), the callee's own error, and a success. The mock host and
    /// the server give the same (the unit test below, and
    /// tests/tests/errors.rs against the server).
    /// `foreign`, an object of another application (the server only: the
    /// mock holds one application), adds a call the server refuses.
    #[readonly]
    fn probe_failures(&self, missing: ObjectId, foreign: Option<ObjectId>) -> Vec<String> {
        use lambdastore_sdk::host::{call, call_static, create};
        let me = lambdastore_sdk::self_id();
        let kind = |outcome: std::result::Result<String, CallError>| {
            match outcome {
                Ok(_) => "ok",
                Err(CallError::Application(_)) => "application",
                Err(CallError::BadArguments(_)) => "bad-arguments",
                Err(CallError::UnknownObject(_)) => "unknown-object",
                Err(CallError::UnknownFunction(_)) => "unknown-function",
                Err(CallError::NotAllowed(_)) => "not-allowed",
            }
            .to_string()
        };
        let mut probed = vec![
            kind(call(missing, "get", r#"{"key": "k"}"#)),
            kind(call(me, "no_such_method", "{}")),
            kind(call(me, "get", r#"{"key": 5}"#)),
            kind(call_static("NoSuchType", "version", "null")),
            kind(create("NoSuchType", "{}").map(|id| id.to_string())),
            kind(call(me, "fail", r#"{"message": "no"}"#)),
            kind(call(me, "get", r#"{"key": "k"}"#)),
        ];
        probed.extend(foreign.map(|other| kind(call(other, "get", r#"{"key": "k"}"#))));
        probed
    }

    /// A static function: this application's version.
    fn version() -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }
}

lambdastore_sdk::app!(Bench);

#[cfg(test)]
mod tests {
    use super::*;
    use lambdastore_sdk::mock::{MockHost, SpawnedCall};
    use serde_json::json;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    fn bench() -> (MockHost, ObjectId) {
        let host = MockHost::for_app::<App>();
        let id = host.create("Bench", json!(null)).unwrap();
        (host, id)
    }

    #[test]
    fn constructor_fills_100_entries_of_1_kib() {
        let (host, id) = bench();
        let data = host.map::<u32, String>(id, "data");
        assert_eq!(data.len(), 100);
        assert!(data.iter().enumerate().all(|(i, (k, v))| *k == i as u32 && v.len() == 1024));
    }

    #[test]
    fn hash_chains_sha512_rounds() {
        let (host, id) = bench();
        let once = host.invoke(id, "hash", json!({"n": 1})).unwrap();
        // SHA-512 of 1024 zero bytes.
        let expected: String = Sha512::digest([0u8; 1024]).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(once, json!(expected));
        let twice = host.invoke(id, "hash", json!([2])).unwrap();
        assert_ne!(once, twice);
        assert_eq!(twice.as_str().unwrap().len(), 128);
    }

    #[test]
    fn read_and_write_touch_k_distinct_entries() {
        let (host, id) = bench();
        assert_eq!(host.invoke(id, "read", json!({"k": 10})).unwrap(), json!(10 * 1024));
        let before = host.map::<u32, String>(id, "data");
        assert_eq!(host.invoke(id, "write", json!({"k": 7})).unwrap(), json!(7));
        let after = host.map::<u32, String>(id, "data");
        let changed = before.iter().zip(&after).filter(|(b, a)| b != a).count();
        assert_eq!(changed, 7);
        assert!(matches!(host.invoke(id, "read", json!([101])), Err(CallError::Application(_))));
    }

    #[test]
    fn fail_is_an_application_error() {
        let (host, id) = bench();
        assert_eq!(host.invoke(id, "fail", json!({"message": "boom"})), Err(CallError::Application("boom".into())));
    }

    #[test]
    fn put_get_and_list() {
        let (host, id) = bench();
        for k in ["b", "a", "c", "d"] {
            host.invoke(id, "put", json!({"key": k, "value": k.to_uppercase()})).unwrap();
        }
        assert_eq!(host.invoke(id, "get", json!(["a"])).unwrap(), json!("A"));
        assert_eq!(host.invoke(id, "get", json!(["zz"])).unwrap(), json!(null));
        let list = host.invoke(id, "list", json!({"start": "b", "end": "d"})).unwrap();
        assert_eq!(list, json!([["b", "B"], ["c", "C"]]));
        let list = host.invoke(id, "list", json!({"limit": 2, "reverse": true})).unwrap();
        assert_eq!(list, json!([["d", "D"], ["c", "C"]]));
    }

    #[test]
    fn insert_if_fewer_fills_a_range_up_to_max() {
        let (host, id) = bench();
        // Entries outside the range do not count.
        for key in ["a", "q", "q/", "z"] {
            host.invoke(id, "put", json!([key, "outside"])).unwrap();
        }
        let attempt = |key: &str| {
            host.invoke(id, "insert_if_fewer", json!({"start": "p/", "end": "p0", "max": 3, "key": key})).unwrap()
        };
        let inserted: Vec<_> = ["p/5", "p/1", "p/9", "p/3", "p/"].map(attempt).into();
        assert_eq!(inserted, [true, true, true, false, false].map(|b| json!(b)).to_vec());
        let list = host.invoke(id, "list", json!({"start": "p/", "end": "p0"})).unwrap();
        assert_eq!(list, json!([["p/1", "x"], ["p/5", "x"], ["p/9", "x"]]));
    }

    #[test]
    fn insert_if_fewer_refuses_a_key_outside_its_range() {
        let (host, id) = bench();
        for key in ["a", "p0", "p1"] {
            let args = json!({"start": "p/", "end": "p0", "max": 5, "key": key});
            assert!(matches!(host.invoke(id, "insert_if_fewer", args), Err(CallError::Application(_))));
        }
        assert_eq!(host.invoke(id, "list", json!({})).unwrap(), json!([]));
    }

    #[test]
    fn deep_recurses_on_its_own_object() {
        let (host, id) = bench();
        assert_eq!(host.invoke(id, "deep", json!({"depth": 10})).unwrap(), json!(10));
    }

    #[test]
    fn deep_past_the_depth_limit_aborts_the_workflow() {
        let (host, id) = bench();
        host.set_max_depth(8);
        // As the server's `max_call_depth` 8: eight calls nested in the first.
        assert_eq!(host.invoke(id, "deep", json!([8])).unwrap(), json!(8));
        let result = catch_unwind(AssertUnwindSafe(|| host.invoke(id, "deep", json!([9]))));
        assert!(result.is_err());
        // The host is usable afterwards.
        assert_eq!(host.invoke(id, "deep", json!([3])).unwrap(), json!(3));
    }

    #[test]
    fn a_failing_call_keeps_none_of_its_writes() {
        let (host, id) = bench();
        let err = host.invoke(id, "put_then_fail", json!({"key": "k", "value": "v"}));
        assert!(matches!(err, Err(CallError::Application(_))));
        assert_eq!(host.invoke(id, "get", json!(["k"])).unwrap(), json!(null));
    }

    #[test]
    fn the_caller_of_a_failing_nested_call_recovers() {
        let (host, a) = bench();
        let b = host.create("Bench", json!(null)).unwrap();
        let args = json!({"target": b, "key": "k", "value": "v"});
        assert_eq!(host.invoke(a, "call_and_recover", args).unwrap(), json!(true));
        assert_eq!(host.invoke(b, "get", json!(["k"])).unwrap(), json!(null));
    }

    #[test]
    fn a_panic_aborts_the_workflow_and_keeps_nothing() {
        let (host, id) = bench();
        host.invoke(id, "put", json!(["before", "1"])).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| host.invoke(id, "panic", json!(null))));
        assert!(result.is_err());
        assert_eq!(host.invoke(id, "get", json!(["before"])).unwrap(), json!("1"));
    }

    #[test]
    fn protected_secret_only_through_a_nested_call() {
        let (host, a) = bench();
        let b = host.create("Bench", json!(null)).unwrap();
        assert!(matches!(host.invoke(b, "secret", json!(null)), Err(CallError::NotAllowed(_))));
        assert_eq!(host.invoke(a, "ask_secret", json!([b])).unwrap(), json!("the secret"));
    }

    /// What the server must answer too (tests/tests/errors.rs reads the file).
    #[test]
    fn failures_a_caller_may_handle() {
        let (host, id) = bench();
        let expected: serde_json::Value = serde_json::from_str(include_str!("../probed_failures.json")).unwrap();
        assert_eq!(host.invoke(id, "probe_failures", json!({"missing": 999_999})).unwrap(), expected);
    }

    #[test]
    fn static_version() {
        let host = MockHost::for_app::<App>();
        assert_eq!(host.invoke_static("Bench", "version", json!(null)).unwrap(), json!(env!("CARGO_PKG_VERSION")));
        assert_eq!(BenchRef::version().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn alloc_and_big_result() {
        let (host, id) = bench();
        assert_eq!(host.invoke(id, "alloc", json!([1 << 20])).unwrap(), json!(1 << 20));
        let big = host.invoke(id, "big_result", json!({"bytes": 5000})).unwrap();
        assert_eq!(big.as_str().unwrap().len(), 5000);
    }

    #[test]
    fn log_reaches_the_server_log() {
        let (host, id) = bench();
        host.invoke(id, "log", json!(["hello"])).unwrap();
        let record = host.logs().pop().unwrap();
        assert_eq!(
            (record.level, record.message.as_str(), record.object),
            (lambdastore_sdk::host::LogLevel::Notice, "hello", id)
        );
    }

    #[test]
    fn chars_builds_a_string_of_code_points() {
        let (host, id) = bench();
        assert_eq!(host.invoke(id, "chars", json!({"codes": [97, 0, 98]})).unwrap(), json!("a\0b"));
        assert_eq!(
            host.invoke(id, "chars", json!([[0xD800]])),
            Err(CallError::Application("0xd800 is not a Unicode scalar value".into()))
        );
    }

    #[test]
    fn put_raw_writes_bytes_under_any_field_name() {
        let (host, id) = bench();
        host.invoke(id, "put_raw", json!({"field": "raw", "key": "k", "value": "v"})).unwrap();
        let stored = host.entries(id).into_iter().find(|e| e.field == "raw").unwrap();
        assert_eq!((stored.key, stored.value), (b"k".to_vec(), b"v".to_vec()));
        // The host refuses a NUL in a field name, which aborts the workflow.
        let args = json!({"field": "kv\u{0}evil", "key": "k", "value": "v"});
        let result = catch_unwind(AssertUnwindSafe(|| host.invoke(id, "put_raw", args)));
        assert!(result.is_err());
    }

    #[test]
    fn put_many_fills_kv_and_scan_count_sizes_it() {
        let (host, id) = bench();
        let filled = host.invoke(id, "put_many", json!({"count": 3, "bytes": 4}));
        assert_eq!(filled, Ok(json!(3)));
        assert_eq!(
            host.invoke(id, "list", json!({})).unwrap(),
            json!([["k00000000", "xxxx"], ["k00000001", "xxxx"], ["k00000002", "xxxx"]])
        );
        // A key is its 9 bytes and a 2-byte terminator; a value, `"xxxx"` in JSON.
        let size = host.invoke(id, "scan_count", json!({}));
        assert_eq!(size, Ok(json!(3 * (11 + 6))));
    }

    #[test]
    fn overwrite_rewrites_one_entry() {
        let (host, id) = bench();
        let written = host.invoke(id, "overwrite", json!({"count": 5, "bytes": 2}));
        assert_eq!(written, Ok(json!(5)));
        assert_eq!(host.map::<String, String>(id, "kv"), [("hot".into(), "xx".into())]);
    }

    #[test]
    fn log_many_logs_count_times() {
        let (host, id) = bench();
        host.invoke(id, "log_many", json!({"count": 3, "message": "again"})).unwrap();
        assert_eq!(host.logs().len(), 3);
    }

    #[test]
    fn spawn_many_spawns_count_times() {
        let (host, id) = bench();
        let spawned = host.invoke(id, "spawn_many", json!({"count": 2, "method": "tally"}));
        assert_eq!(spawned, Ok(json!(2)));
        let tally = SpawnedCall { target: id, function: "tally".into(), args: "{}".into(), ..Default::default() };
        assert_eq!(host.take_spawned(), [tally.clone(), tally]);
    }

    #[test]
    fn tally_counts_runs_and_tags() {
        let (host, id) = bench();
        host.invoke(id, "tally", json!({"tag": 7})).unwrap();
        assert_eq!(host.invoke(id, "tally", json!({"tag": 8})).unwrap(), json!(2));
        assert_eq!(host.cell::<i64>(id, "count"), Some(2));
    }

    #[test]
    #[should_panic(expected = "an entry's field name and key are 3004 bytes together")]
    fn a_key_past_what_the_servers_index_holds_aborts_the_workflow() {
        let (host, id) = bench();
        host.invoke(id, "put", json!({"key": "k".repeat(2000), "value": "v"})).unwrap();
        let _ = host.invoke(id, "put", json!({"key": "k".repeat(3000), "value": "v"}));
    }

    #[test]
    fn a_delayed_spawn_runs_once_due() {
        let (host, id) = bench();
        let start = host.now_micros();
        let args = json!({"target": id, "method": "tally", "args": {"tag": 1}, "delay_ms": 500});
        host.invoke(id, "spawn_after", args).unwrap();
        assert!(host.run_spawned().is_empty(), "ran before it was due");
        host.set_now_micros(start + 500_000);
        assert_eq!(host.run_spawned(), [Ok(json!(1))]);
    }

    #[test]
    fn a_timer_set_again_replaces_it_and_a_failed_workflow_sets_none() {
        let (host, id) = bench();
        let start = host.now_micros();
        let set = |tag: u64, delay_ms: u64, fail: bool| {
            let args = json!({"tag": tag});
            host.invoke(
                id,
                "set_timer",
                json!({"name": "t", "delay_ms": delay_ms, "method": "tally_at", "args": args, "fail": fail}),
            )
        };
        set(1, 100, false).unwrap();
        set(2, 200, false).unwrap();
        assert!(set(3, 50, true).is_err());
        host.set_now_micros(start + 10_000_000);
        assert_eq!(host.run_spawned(), [Ok(json!(1))], "only the last timer set fires");
        assert_eq!(host.map::<u64, u32>(id, "seen"), [(2, 1)]);
        set(4, 100, false).unwrap();
        host.invoke(id, "clear_timer", json!({"name": "t"})).unwrap();
        host.set_now_micros(start + 20_000_000);
        assert!(host.run_spawned().is_empty(), "a cleared timer fired");
    }

    #[test]
    fn a_repeating_timer_ticks_once_per_period() {
        let (host, id) = bench();
        let start = host.now_micros();
        host.invoke(id, "tick", json!({"name": "t", "every_ms": 1000, "left": 3, "tag": 1})).unwrap();
        for second in 1..=3 {
            host.set_now_micros(start + second * 1_000_000 + 5_000);
            host.run_spawned();
        }
        assert_eq!(host.map::<u64, u32>(id, "seen"), [(1, 1), (2, 1), (3, 1)]);
    }

    #[test]
    fn only_a_committed_workflow_spawns() {
        let (host, id) = bench();
        let args = json!({"target": id, "method": "tally", "args": {"tag": 1}});
        host.invoke(id, "spawn_then", json!({"fail": false, "target": id, "method": "tally", "args": {"tag": 1}}))
            .unwrap();
        assert_eq!(host.take_spawned().len(), 1);
        let failing = json!({"fail": true, "target": id, "method": "tally", "args": {"tag": 2}});
        assert!(host.invoke(id, "spawn_then", failing).is_err());
        assert_eq!(host.invoke(id, "spawn_in_failed_callee", args).unwrap(), json!(true));
        assert!(host.take_spawned().is_empty(), "a failed workflow or callee spawned");
    }
}
