//! The paper's workloads: their data (created through the extension, so
//! every system reads and writes the same rows) and the operations clients
//! draw. Sizes scale down with `--quick`; `Suite::scale` records them.

use super::driver::{self, Outcome};
use super::systems::{self, SqlSession, System};
use super::Suite;
use crate::contention::next;
use crate::remote::RemoteSession;
use anyhow::Result;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub enum Op {
    /// micro `Bench.touch`: read (or overwrite) 5 entries of one object.
    Touch { object: i64, keys: [u32; 5], write: bool },
    /// micro `Bench.hash(n)`: n rounds of SHA-512 over 1 KiB.
    Hash { object: i64, n: u32 },
    /// CloudForum `Thread.get_thread`.
    GetThread { thread: i64 },
    /// CloudForum `Account.add_comment`: two nested calls deep.
    AddComment { account: i64, thread: i64, text: String },
    /// Retwis `User.get_timeline`: the 50 newest posts.
    Timeline { user: i64 },
    /// Retwis `User.create_post`: fans out to every follower.
    Post { user: i64, text: String },
    /// micro `Bench.spin`: never returns.
    Spin { object: i64 },
}

impl Op {
    /// The lambda call this operation is: (object, method, JSON arguments).
    pub fn call(&self) -> (i64, &'static str, Value) {
        match self {
            Op::Touch { object, keys, write } => (*object, "touch", json!({"keys": keys, "write": write})),
            Op::Hash { object, n } => (*object, "hash", json!({"n": n})),
            Op::GetThread { thread } => (*thread, "get_thread", json!({})),
            Op::AddComment { account, thread, text } => {
                (*account, "add_comment", json!({"thread": thread, "text": text}))
            }
            Op::Timeline { user } => (*user, "get_timeline", json!({"limit": 50})),
            Op::Post { user, text } => (*user, "create_post", json!({"text": text})),
            Op::Spin { object } => (*object, "spin", json!({})),
        }
    }
}

/// A client of a workload: a session (`RemoteSession` for the
/// disaggregated baseline, `SqlSession` for the others) and a generator of
/// operations.
struct Load<S, G> {
    session: S,
    /// Which client this is, from 0.
    n: usize,
    rng: u64,
    generate: Arc<G>,
}

impl<S, G: Fn(usize, &mut u64) -> Op> Load<S, G> {
    fn new(session: S, n: usize, generate: Arc<G>) -> Self {
        Load { session, n, rng: seed(n), generate }
    }
    fn next(&mut self) -> Op {
        (self.generate)(self.n, &mut self.rng)
    }
}

impl<G: Fn(usize, &mut u64) -> Op> driver::Client for Load<RemoteSession, G> {
    fn attempt(&mut self, op: &Op) -> Result<Outcome> {
        systems::outcome(systems::call_remote(&mut self.session, op))
    }
    fn next_op(&mut self) -> Op {
        self.next()
    }
}

impl<G: Fn(usize, &mut u64) -> Op + Send + Sync + 'static> driver::AsyncClient for Load<SqlSession, G> {
    async fn attempt(&mut self, op: &Op) -> Result<Outcome> {
        systems::outcome(self.session.call(op).await)
    }
    fn next_op(&mut self) -> Op {
        self.next()
    }
}

fn pick(rng: &mut u64, ids: &[i64]) -> i64 {
    ids[(next(rng) % ids.len() as u64) as usize]
}

fn percent(rng: &mut u64) -> u64 {
    next(rng) % 100
}

impl Suite {
    /// Measures `systems` on the operations `generate` draws, one run each.
    fn measure<G>(
        &mut self,
        workload: &str,
        variant: &str,
        x: Option<f64>,
        systems: &[System],
        setup: &str,
        generate: G,
    ) -> Result<()>
    where
        G: Fn(usize, &mut u64) -> Op + Send + Sync + 'static,
    {
        let generate = Arc::new(generate);
        for &system in systems {
            if !self.systems.contains(&system) {
                continue;
            }
            self.settle()?;
            let (url, setup) = (self.url.clone(), setup.to_string());
            let generate = generate.clone();
            let label = format!("{workload} {variant} {}", system.name());
            let measured = if system == System::Disaggregated {
                let wasm = self.component(workload)?;
                driver::drive(&label, self.clients, self.mode, &self.timing, move |n| {
                    Ok(Load::new(systems::connect_remote(&url, &setup, &wasm)?, n, generate.clone()))
                })?
            } else {
                driver::drive_tasks(&label, self.clients, self.mode, &self.timing, move |n| {
                    let (url, setup, generate) = (url.clone(), setup.clone(), generate.clone());
                    async move { Ok(Load::new(SqlSession::connect(system, &url, &setup).await?, n, generate)) }
                })?
            };
            let run = measured.into_run(workload, variant, x, system.name());
            println!(
                "  {label:<44} {:>9.0} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms  retries {:>6}  errors {}",
                run.throughput,
                run.latency_us.p50 / 1e3,
                run.latency_us.p99 / 1e3,
                run.retries,
                run.errors
            );
            self.results.runs.push(run);
        }
        Ok(())
    }

    /// Every run starts from the same state: no dead rows or stale
    /// statistics left by the load or the previous run, and no checkpoint
    /// due. Otherwise autovacuum of the entries table (seconds of a core)
    /// or a checkpoint lands in whichever system's run comes next: a full
    /// suite showed a run's throughput dropping by a quarter for five
    /// seconds while the system measured after it ran undisturbed.
    pub(super) fn settle(&mut self) -> Result<()> {
        self.admin.batch_execute("VACUUM ANALYZE")?;
        if self.may_checkpoint {
            self.admin.batch_execute("CHECKPOINT")?;
        }
        Ok(())
    }

    /// The component a workload's lambdas come from, for the system that
    /// runs them itself (`disaggregated`).
    fn component(&self, workload: &str) -> Result<Vec<u8>> {
        let app = match workload {
            "cloudforum" => "forum",
            "retwis" => "retwis",
            _ => "micro",
        };
        self.wasm(app)
    }

    /// Creates `count` objects of `type_name` with constructor arguments
    /// `args(i)`, 500 per statement; returns their ids in order.
    fn create_objects(
        &mut self,
        app: &str,
        type_name: &str,
        count: usize,
        args: impl Fn(usize) -> Value,
    ) -> Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(count);
        for chunk in (0..count).collect::<Vec<_>>().chunks(500) {
            let batch: Vec<Value> = chunk.iter().map(|&i| args(i)).collect();
            let rows = self.admin.query(
                "SELECT lambdastore.create_object($1, $2, a) FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS t(a, i) ORDER BY i",
                &[&app, &type_name, &Value::Array(batch)],
            )?;
            ids.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        }
        Ok(ids)
    }

    /// Runs `method` with `args(i)` on `objects[i]` for every i, 500 calls per statement.
    fn invoke_all(&mut self, objects: &[i64], method: &str, args: impl Fn(usize) -> Value) -> Result<()> {
        for (c, chunk) in objects.chunks(500).enumerate() {
            let ids: Vec<i64> = chunk.to_vec();
            let batch: Vec<Value> = (0..chunk.len()).map(|i| args(c * 500 + i)).collect();
            self.admin.execute(
                "SELECT count(lambda_invoke(o, $1, a)) FROM unnest($2::bigint[], ARRAY(SELECT jsonb_array_elements($3::jsonb))) AS t(o, a)",
                &[&method, &ids, &Value::Array(batch)],
            )?;
        }
        Ok(())
    }

    /// The read/write mix: objects × 100 entries × 1 KiB; 5 entries per
    /// transaction, 0–100% of transactions writing.
    pub fn rw_mix(&mut self) -> Result<()> {
        let objects = if self.quick { 1_000 } else { 10_000 };
        self.results.scale.push(format!("rw-mix: {objects} objects x 100 entries x 1 KiB, 5 entries per transaction"));
        self.deploy("micro")?;
        self.admin.batch_execute(include_str!("../../sql/plpgsql/micro.sql"))?;
        let started = Instant::now();
        let ids = Arc::new(self.create_objects("micro", "Bench", objects, |_| json!({}))?);
        println!("rw-mix: {objects} objects created in {:.1} s", started.elapsed().as_secs_f64());
        for write_percent in [0u64, 25, 50, 75, 100] {
            let ids = ids.clone();
            self.measure(
                "rw-mix",
                &format!("{write_percent}% writes"),
                Some(write_percent as f64),
                &System::ALL,
                "",
                move |_, rng| {
                    let object = pick(rng, &ids);
                    let mut keys = [0u32; 5];
                    // Distinct keys, as a transaction over 5 entries means.
                    let mut i = 0;
                    while i < 5 {
                        let k = (next(rng) % 100) as u32;
                        if !keys[..i].contains(&k) {
                            keys[i] = k;
                            i += 1;
                        }
                    }
                    Op::Touch { object, keys, write: percent(rng) < write_percent }
                },
            )?;
        }
        self.pgbench_read_only(&ids)
    }

    /// Job length: hash(n) for growing n. The lambdas' own time limit is
    /// lifted for the longest jobs.
    pub fn job_length(&mut self) -> Result<()> {
        let rounds: &[u32] = if self.quick { &[1, 100, 10_000] } else { &[1, 10, 100, 1_000, 10_000, 100_000] };
        self.results.scale.push(format!("job-length: hash(n) for n in {rounds:?}, SHA-512 over 1 KiB"));
        self.deploy("micro")?;
        self.admin.batch_execute(include_str!("../../sql/plpgsql/micro.sql"))?;
        let object = self.create_objects("micro", "Bench", 1, |_| json!({"entries": 0}))?[0];
        for &n in rounds {
            let setup = "SET lambdastore.timeout = '600s'";
            let systems = [System::Lambdastore, System::Disaggregated, System::Plpgsql];
            self.measure("job-length", &format!("n = {n}"), Some(n as f64), &systems, setup, move |_, _| Op::Hash {
                object,
                n,
            })?;
        }
        Ok(())
    }

    /// CloudForum: communities and threads; 90% get-thread, 10% add-comment.
    pub fn cloudforum(&mut self) -> Result<()> {
        let (communities, threads, accounts) = if self.quick { (10, 2_000, 200) } else { (100, 100_000, 1_000) };
        self.results.scale.push(format!("cloudforum: {communities} communities, {threads} threads, {accounts} accounts; 90% get-thread, 10% add-comment"));
        self.deploy("forum")?;
        self.admin.batch_execute(include_str!("../../sql/plpgsql/forum.sql"))?;
        let started = Instant::now();
        let community_ids =
            self.create_objects("forum", "Community", communities, |i| json!({"name": format!("community {i}")}))?;
        let account_ids =
            Arc::new(self.create_objects("forum", "Account", accounts, |i| json!({"name": format!("user {i}")}))?);
        let authors: Vec<i64> = (0..threads).map(|i| account_ids[i % accounts]).collect();
        // Threads come from create_thread on their author: a nested
        // constructor and a nested call to the community, as users make them.
        let mut thread_ids = Vec::with_capacity(threads);
        for (c, chunk) in authors.chunks(500).enumerate() {
            let args: Vec<Value> = (0..chunk.len())
                .map(|i| {
                    let t = c * 500 + i;
                    json!({"community": community_ids[t % communities], "title": format!("thread {t}"), "text": "x".repeat(200)})
                })
                .collect();
            let rows = self.admin.query(
                "SELECT lambda_invoke(o, 'create_thread', a)::bigint FROM unnest($1::bigint[], ARRAY(SELECT jsonb_array_elements($2::jsonb))) WITH ORDINALITY AS t(o, a, i) ORDER BY i",
                &[&chunk.to_vec(), &Value::Array(args)],
            )?;
            thread_ids.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        }
        println!("cloudforum: {threads} threads created in {:.1} s", started.elapsed().as_secs_f64());
        let thread_ids = Arc::new(thread_ids);
        self.measure("cloudforum", "90% get-thread, 10% add-comment", None, &System::ALL, "", move |_, rng| {
            if percent(rng) < 90 {
                Op::GetThread { thread: pick(rng, &thread_ids) }
            } else {
                Op::AddComment {
                    account: pick(rng, &account_ids),
                    thread: pick(rng, &thread_ids),
                    text: format!("comment {}", next(rng) % 1_000_000),
                }
            }
        })
    }

    /// Retwis: users with 20 followers each; 90% get-timeline, 10% create-post.
    pub fn retwis(&mut self) -> Result<()> {
        let users = if self.quick { 1_000 } else { 10_000 };
        const FOLLOWERS: usize = 20;
        self.results.scale.push(format!(
            "retwis: {users} users x {FOLLOWERS} followers; 90% get-timeline (50 newest), 10% create-post"
        ));
        self.deploy("retwis")?;
        self.admin.batch_execute(include_str!("../../sql/plpgsql/retwis.sql"))?;
        let started = Instant::now();
        let ids = self.create_objects("retwis", "User", users, |i| json!({"name": format!("user {i}")}))?;
        let followers = ids.clone();
        self.invoke_all(&ids, "add_followers", move |i| {
            let mut rng = seed(i);
            let mut chosen: Vec<i64> = Vec::with_capacity(FOLLOWERS);
            while chosen.len() < FOLLOWERS {
                let f = pick(&mut rng, &followers);
                if f != followers[i] && !chosen.contains(&f) {
                    chosen.push(f);
                }
            }
            json!({"followers": chosen})
        })?;
        // A few posts per user, so timelines are not empty.
        self.invoke_all(&ids, "create_post", |i| json!({"text": format!("hello from user {i}")}))?;
        println!("retwis: {users} users with followers created in {:.1} s", started.elapsed().as_secs_f64());
        let ids = Arc::new(ids);
        self.measure("retwis", "90% get-timeline, 10% create-post", None, &System::ALL, "", move |_, rng| {
            let user = pick(rng, &ids);
            if percent(rng) < 90 {
                Op::Timeline { user }
            } else {
                Op::Post { user, text: format!("post {}", next(rng) % 1_000_000) }
            }
        })
    }

    /// Faulty functions: a steady load of 5-entry reads, then every
    /// connection at once runs a lambda that never returns, stopped by a
    /// 1 s time limit. The timeline shows when throughput is back.
    pub fn faulty(&mut self) -> Result<()> {
        self.deploy("micro")?;
        self.admin.batch_execute(include_str!("../../sql/plpgsql/micro.sql"))?;
        // PL/pgSQL's own runaway: stopped by statement_timeout.
        self.admin.batch_execute("CREATE OR REPLACE FUNCTION bench_plpgsql.spin() RETURNS void LANGUAGE plpgsql AS $$ BEGIN LOOP END LOOP; END $$")?;
        let ids = Arc::new(self.create_objects("micro", "Bench", 100, |_| json!({}))?);
        let fault_at = self.timing.warmup + self.timing.measure / 3;
        self.results.scale.push(format!(
            "faulty: 100 objects; at {:.1} s into the measurement every client calls spin() once (1 s limit)",
            (fault_at - self.timing.warmup).as_secs_f64()
        ));
        let setups = [
            (System::Lambdastore, "SET lambdastore.timeout = '1s'"),
            (System::Plpgsql, "SET statement_timeout = '1s'"),
        ];
        for (system, setup) in setups {
            let ids = ids.clone();
            // Every client's clock starts at its first operation; they start together.
            let origin = Arc::new(std::sync::OnceLock::<Instant>::new());
            let spun = Arc::new(std::sync::Mutex::new(std::collections::HashSet::<usize>::new()));
            self.measure("faulty", "1 s limit", None, &[system], setup, move |client, rng| {
                let started = *origin.get_or_init(Instant::now);
                let object = pick(rng, &ids);
                // Each client's first operation after the fault time is its spin.
                if started.elapsed() >= fault_at && spun.lock().expect("not poisoned").insert(client) {
                    return Op::Spin { object };
                }
                Op::Touch { object, keys: [1, 2, 3, 4, 5], write: false }
            })?;
            if let Some(run) = self.results.runs.last().filter(|r| r.workload == "faulty") {
                let offset = (fault_at - self.timing.warmup).as_secs_f64();
                self.results.findings.push(match recovery(&run.timeline, run.timeline_step_s, offset) {
                    Some((before, after)) => format!(
                        "faulty, {}: {before:.0} ops/s before the fault; back to 90% of it {after:.1} s after every connection started spinning (time limit 1 s; goal: within 2 s)",
                        run.system
                    ),
                    None => format!("faulty, {}: throughput did not return to 90% of its earlier level within the run", run.system),
                });
            }
        }
        Ok(())
    }

    /// Cold start: the first call in a new connection right after a deploy,
    /// against the second call; PL/pgSQL reading the same row side by side.
    pub fn cold_start(&mut self) -> Result<()> {
        let connections = if self.quick { 50 } else { 200 };
        self.results.scale.push(format!("cold-start: {connections} new connections per system, a redeploy every 10"));
        let counter = self.wasm("counter")?;
        self.admin.execute("SELECT lambdastore.deploy('bench_counter', $1)", &[&counter])?;
        let id: i64 =
            self.admin.query_one("SELECT lambdastore.create_object('bench_counter', 'Counter', '{}')", &[])?.get(0);
        self.admin.batch_execute(crate::PLPGSQL_GET)?;
        let mut lambda = crate::ColdStart::default();
        let mut plpgsql = crate::ColdStart::default();
        let mut redeployed = counter.clone();
        for i in 0..connections {
            if i % 10 == 0 {
                redeployed.extend_from_slice(&crate::custom_section(&format!("v{i}")));
                self.admin.execute("SELECT lambdastore.deploy('bench_counter', $1)", &[&redeployed])?;
            }
            lambda.measure(&self.url, "SELECT lambda_invoke($1, 'get')", id)?;
            plpgsql.measure(&self.url, "SELECT bench_plpgsql_get($1)", id)?;
        }
        for (system, c) in [("lambdastore", &lambda), ("plpgsql", &plpgsql)] {
            for (variant, h) in [
                ("first call in a new connection", &c.first),
                ("second call", &c.second),
                ("first minus second", &c.extra),
            ] {
                self.results.runs.push(super::results::Run {
                    workload: "cold-start".into(),
                    variant: variant.into(),
                    x: None,
                    system: system.into(),
                    mode: "sequential".into(),
                    clients: 1,
                    seconds: 0.0,
                    ops: h.len(),
                    throughput: 0.0,
                    errors: 0,
                    retries: 0,
                    latency_us: driver::latency(h),
                    timeline: Vec::new(),
                    timeline_step_s: 0.0,
                    cpu_us: None,
                });
            }
            println!(
                "  cold-start {system:<14} first {:>7.0} µs  second {:>6.0} µs  extra p50 {:>6.0} µs",
                driver::latency(&c.first).p50,
                driver::latency(&c.second).p50,
                driver::latency(&c.extra).p50
            );
        }
        Ok(())
    }
}

/// From a timeline of rates (one per `step` seconds) and the time of the
/// fault: the mean rate before it (the first half second left out), and how
/// long after the fault the rate was first back to 90% of that, after having
/// dropped below half of it.
pub fn recovery(timeline: &[f64], step: f64, fault: f64) -> Option<(f64, f64)> {
    let start = ((0.5 / step) as usize).min(timeline.len());
    let fault_slice = ((fault / step) as usize).min(timeline.len());
    let before = &timeline[start..fault_slice.max(start)];
    if before.is_empty() {
        return None;
    }
    let level = before.iter().sum::<f64>() / before.len() as f64;
    let dip = fault_slice + timeline[fault_slice..].iter().position(|&r| r < 0.5 * level)?;
    let back = dip + timeline[dip..].iter().position(|&r| r >= 0.9 * level)?;
    Some((level, (back + 1) as f64 * step - fault))
}

impl System {
    pub const ALL: [System; 4] = [System::Lambdastore, System::Disaggregated, System::Plpgsql, System::RawSql];
}

/// The start of random stream `n` (client `n`, or setup item `n`).
fn seed(n: usize) -> u64 {
    (n as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

#[cfg(test)]
mod tests {
    use super::recovery;

    #[test]
    fn recovery_is_measured_from_the_fault_to_the_first_slice_back_at_level() {
        // 100 ops/s for 2 s, nothing for 1 s from the fault at 2.0 s, then
        // 60 (not back), then 95 (back) in the slice ending at 3.3 s.
        let mut timeline = vec![100.0; 20];
        timeline.extend([0.0; 10]);
        timeline.extend([60.0, 60.0, 95.0, 100.0]);
        let (level, after) = recovery(&timeline, 0.1, 2.0).unwrap();
        assert!((level - 100.0).abs() < 1e-9);
        assert!((after - 1.3).abs() < 1e-9, "{after}");
    }

    #[test]
    fn no_dip_or_no_return_is_no_recovery() {
        assert_eq!(recovery(&[100.0; 40], 0.1, 2.0), None, "never dropped");
        let mut timeline = vec![100.0; 20];
        timeline.extend([0.0; 20]);
        assert_eq!(recovery(&timeline, 0.1, 2.0), None, "never came back");
    }
}
