//! The systems under test, each running the same operations:
//! - `lambdastore`: `SELECT lambda_invoke(...)`, the lambda runs in the backend;
//! - `disaggregated`: the same component runs in this process (`remote`),
//!   every entry access a SQL round trip;
//! - `plpgsql`: stored procedures doing the same reads and writes (bench/sql/plpgsql);
//! - `raw-sql`: the fewest statements doing them (bench/sql/raw), the ceiling.

use super::driver::Outcome;
use super::workloads::Op;
use crate::remote::{RemoteApp, RemoteError, RemoteSession};
use anyhow::{bail, Result};
use postgres::types::ToSql;
use serde_json::Value;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum System {
    Lambdastore,
    Disaggregated,
    Plpgsql,
    RawSql,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Lambdastore => "lambdastore",
            System::Disaggregated => "disaggregated",
            System::Plpgsql => "plpgsql",
            System::RawSql => "raw-sql",
        }
    }
}

/// The keys of a touch as SQL `int[]` (the statements encode them).
fn int_keys(keys: &[u32]) -> Vec<i32> {
    keys.iter().map(|&k| k as i32).collect()
}

/// A disaggregated client: a new connection (`setup` runs on it first, e.g.
/// `SET lambdastore.timeout`) and its own instance of the application (a
/// Store and its instances are per thread: the host state is Rc-based),
/// of a component compiled once per process.
pub fn connect_remote(url: &str, setup: &str, wasm: &[u8]) -> Result<RemoteSession> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    client.batch_execute(setup)?;
    Ok(RemoteSession::new(Rc::new(RemoteApp::load(wasm)?), client))
}

/// Runs `op` once through the disaggregated host; the lambda's result.
pub fn call_remote(remote: &mut RemoteSession, op: &Op) -> Result<Value> {
    let (object, method, args) = op.call();
    match remote.invoke(object, method, &args.to_string()) {
        Ok(result) => Ok(serde_json::from_str(&result)?),
        // The PostgreSQL error itself, so that `is_retryable` finds its SQLSTATE.
        Err(RemoteError::Retry(e)) => Err(e.into()),
        Err(e) => Err(e.into()),
    }
}

/// What a call's result means to the driver.
pub fn outcome(result: Result<Value>) -> Result<Outcome> {
    match result {
        Ok(_) => Ok(Outcome::Done),
        Err(e) if is_retryable(&e) => Ok(Outcome::Retry),
        Err(e) => Err(e),
    }
}

/// A SQL system's connection, through tokio-postgres so that one thread
/// serves many connections (driver.rs says why).
pub struct SqlSession {
    system: System,
    client: tokio_postgres::Client,
    statements: HashMap<&'static str, tokio_postgres::Statement>,
}

impl SqlSession {
    /// A new connection; `setup` runs on it first. Its connection task is
    /// spawned on the current runtime.
    pub async fn connect(system: System, url: &str, setup: &str) -> Result<SqlSession> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("database connection: {e}");
            }
        });
        client.batch_execute(setup).await?;
        Ok(SqlSession { system, client, statements: HashMap::new() })
    }

    /// Runs `op` once and returns the first column of the statement's
    /// first row as JSON (null if none).
    pub async fn call(&mut self, op: &Op) -> Result<Value> {
        let (sql, params) = statement(self.system, op)?;
        let stmt = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = self.client.prepare(sql).await?;
                self.statements.insert(sql, s.clone());
                s
            }
        };
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let rows = self.client.query(&stmt, &refs).await?;
        rows.first().map_or(Ok(Value::Null), first_column)
    }
}

pub(super) fn is_retryable(e: &anyhow::Error) -> bool {
    e.downcast_ref::<postgres::Error>().and_then(|e| e.code()).is_some_and(|c| matches!(c.code(), "40001" | "40P01"))
}

fn first_column(row: &postgres::Row) -> Result<Value> {
    use postgres::types::Type;
    let ty = row.columns()[0].type_().clone();
    Ok(match ty {
        Type::JSONB | Type::JSON => row.get::<_, Option<Value>>(0).unwrap_or(Value::Null),
        Type::INT4 => row.get::<_, Option<i32>>(0).map_or(Value::Null, Value::from),
        Type::INT8 => row.get::<_, Option<i64>>(0).map_or(Value::Null, Value::from),
        Type::TEXT => row.get::<_, Option<String>>(0).map_or(Value::Null, Value::from),
        _ => Value::Null, // rows as stored (raw get_thread): not compared
    })
}

type Param = Box<dyn ToSql + Sync + Send>;

/// The statement and parameters `system` runs for `op`.
fn statement(system: System, op: &Op) -> Result<(&'static str, Vec<Param>)> {
    Ok(match system {
        System::Lambdastore => {
            let (object, method, args) = op.call();
            (
                "SELECT lambda_invoke($1, $2, $3::jsonb)",
                vec![Box::new(object), Box::new(method.to_string()), Box::new(args)],
            )
        }
        System::Plpgsql => match op {
            Op::Touch { object, keys, write } => (
                "SELECT bench_plpgsql.touch($1, $2, $3)",
                vec![Box::new(*object), Box::new(int_keys(keys)), Box::new(*write)],
            ),
            Op::Hash { n, .. } => ("SELECT bench_plpgsql.hash($1)", vec![Box::new(*n as i32)]),
            Op::GetThread { thread } => ("SELECT bench_plpgsql.forum_get_thread($1)", vec![Box::new(*thread)]),
            Op::AddComment { account, thread, text } => (
                "SELECT bench_plpgsql.forum_add_comment($1, $2, $3)",
                vec![Box::new(*account), Box::new(*thread), Box::new(text.clone())],
            ),
            Op::Timeline { user } => ("SELECT bench_plpgsql.retwis_get_timeline($1, 50)", vec![Box::new(*user)]),
            Op::Post { user, text } => {
                ("SELECT bench_plpgsql.retwis_create_post($1, $2)", vec![Box::new(*user), Box::new(text.clone())])
            }
            Op::Spin { .. } => ("SELECT bench_plpgsql.spin()", vec![]),
        },
        System::RawSql => match op {
            Op::Touch { object, keys, write: false } => {
                (include_str!("../../sql/raw/touch_read.sql"), vec![Box::new(*object), Box::new(int_keys(keys))])
            }
            Op::Touch { object, keys, write: true } => {
                (include_str!("../../sql/raw/touch_write.sql"), vec![Box::new(*object), Box::new(int_keys(keys))])
            }
            Op::GetThread { thread } => (include_str!("../../sql/raw/forum_get_thread.sql"), vec![Box::new(*thread)]),
            Op::AddComment { account, thread, text } => (
                include_str!("../../sql/raw/forum_add_comment.sql"),
                vec![Box::new(*account), Box::new(*thread), Box::new(text.clone())],
            ),
            Op::Timeline { user } => {
                (include_str!("../../sql/raw/retwis_get_timeline.sql"), vec![Box::new(*user), Box::new(50i32)])
            }
            Op::Post { user, text } => {
                (include_str!("../../sql/raw/retwis_create_post.sql"), vec![Box::new(*user), Box::new(text.clone())])
            }
            Op::Hash { .. } | Op::Spin { .. } => bail!("raw SQL has no form of {op:?}"),
        },
        System::Disaggregated => unreachable!("disaggregated sessions do not run SQL statements"),
    })
}
