//! Metrics through Prometheus: redlatch records through the `metrics` facade (feature
//! `metrics`), and the application installs the exporter it wants, here
//! `metrics-exporter-prometheus`. A short workload on a fair mutex and a semaphore, then the
//! metrics in Prometheus's text format.
//!
//! ```sh
//! cargo run --example metrics --features metrics
//! ```
//!
//! Starts a redis-server of its own unless `REDIS_URL` names one (then it writes only under
//! its own key prefix and deletes nothing else).

use std::time::Duration;

use deadpool_redis::{Config, Runtime};
use metrics_exporter_prometheus::PrometheusBuilder;
use redlatch::LockClient;
use redlatch_harness::measure::{self, AnyResult};
use redlatch_harness::server;

#[tokio::main]
async fn main() -> AnyResult<()> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let (server, url) = server::try_named_or_own(std::env::var("REDIS_URL").ok())?;
    if server.is_none() {
        eprintln!(
            "{}",
            measure::given_server_note("metrics", &url, "REDIS_URL")
        );
    }
    let prefix = format!("redlatch-metrics-{}", std::process::id());
    let client = |prefix: &str| -> AnyResult<LockClient> {
        let pool = Config::from_url(&url).create_pool(Some(Runtime::Tokio1))?;
        Ok(LockClient::builder(pool, url.as_str())
            .key_prefix(prefix)
            .build()?)
    };
    // Two clients: stand-ins for two processes sharing the locks.
    let clients = [client(&prefix)?, client(&prefix)?];
    let mut tasks = Vec::new();
    for i in 0..8 {
        let fair = clients[i % 2].fair_mutex("report")?;
        let permits = clients[i % 2].semaphore("renderers", 2)?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let turn = fair.lock().await?;
                tokio::time::sleep(Duration::from_micros(200)).await;
                turn.unlock().await?;
                let permit = permits.acquire().await?;
                tokio::time::sleep(Duration::from_micros(500)).await;
                permit.release().await?;
            }
            Ok::<_, redlatch::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    // One wait that gives up.
    let held = clients[0].fair_mutex("report")?.lock().await?;
    let late = clients[1]
        .fair_mutex("report")?
        .lock_timeout(Duration::from_millis(20))
        .await;
    println!("# a wait that gave up: {}", late.is_err());
    held.unlock().await?;
    print!("{}", prometheus.render());
    drop(server);
    Ok(())
}
