//! A gateway process on a free loopback port, killed when dropped: the
//! gateway's own tests (harness/mod.rs) and the Citus tests
//! (tests/tests/citus/gateway.rs) start it so.

use reqwest::blocking::Client as Http;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Gateway {
    pub base: String,
    pub child: Child,
    pub http: Http,
}

impl Gateway {
    /// Starts `binary` against `database_url` with extra command-line
    /// `flags`; returns once it answers /healthz (it binds before serving,
    /// after reading the shard map on a cluster).
    pub fn spawn(binary: &Path, database_url: &str, flags: &[&str]) -> Gateway {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(binary)
            .args(["--database-url", database_url, "--listen", &format!("127.0.0.1:{port}")])
            .args(flags)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start the gateway");
        let gateway = Gateway {
            base: format!("http://127.0.0.1:{port}"),
            child,
            http: Http::builder().timeout(Duration::from_secs(60)).build().unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while gateway.http.get(gateway.url("/healthz")).send().is_err() {
            assert!(Instant::now() < deadline, "the gateway did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        gateway
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The value of a Prometheus sample (summed over label sets that
    /// contain every `labels` fragment), 0 if absent.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let text = self.http.get(self.url("/metrics")).send().unwrap().text().unwrap();
        text.lines()
            .filter(|line| {
                line.starts_with(name)
                    && line[name.len()..].starts_with(['{', ' '])
                    && labels.iter().all(|l| line.contains(l))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
