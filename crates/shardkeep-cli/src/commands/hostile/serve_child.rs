//! The `serve` process under load: this binary started as `shardkeep serve` over the scratch
//! database and namespace, with its memory read from `/proc`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use shardkeep_sim::bench::BenchEnv;

/// A running `serve`.
pub(super) struct ServeChild {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub(super) base: String,
    /// Where its stderr goes.
    pub(super) log_path: std::path::PathBuf,
}

impl ServeChild {
    /// Starts `serve` with the signing key `key_id`/`secret` and waits until it is ready.
    pub(super) async fn start(env: &BenchEnv, key_id: &str, secret: &[u8]) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let exe = std::env::current_exe().context("cannot find this binary to start serve")?;
        let keys = format!("{key_id}:{}", String::from_utf8_lossy(secret));
        // Its errors go to a file named in any failure, so a crash can be read afterwards.
        let log_path = std::env::temp_dir().join(format!("shardkeep-hostile-serve-{port}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let child = Command::new(exe)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--namespace", env.redis.keys().namespace()])
            // Reconciliation and retention stay out of the way of the fingerprints; the
            // workload's jobs retry quickly.
            .args(["--reconcile-seconds", "86400"])
            .args(["--retry-backoff-millis", "100"])
            .env("DATABASE_URL", env.database_url())
            .env("REDIS_URL", env.redis_url())
            .env("SHARDKEEP_INTERNAL_KEYS", keys)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .context("cannot start serve")?;
        let mut serve = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log_path,
        };
        let http = reqwest::Client::new();
        for _ in 0..300 {
            if serve.healthy(&http).await {
                return Ok(serve);
            }
            if !serve.alive() {
                anyhow::bail!(
                    "serve exited at start-up (its log: {})",
                    serve.log_path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        serve.stop();
        anyhow::bail!(
            "serve was not ready within 30 s (its log: {})",
            serve.log_path.display()
        )
    }

    /// Whether the process is still running.
    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether `/readyz` answers 200.
    pub(super) async fn healthy(&self, http: &reqwest::Client) -> bool {
        http.get(format!("{}/readyz", self.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// Resident memory of the process, from `/proc/<pid>/status`.
    pub(super) fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Stops the process.
    pub(super) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        self.stop();
    }
}
