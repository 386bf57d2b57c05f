//! An axum app with one route under a per-resource lock and one under a fleet-wide
//! concurrency limit.
//!
//! ```text
//! cargo run --release --example axum                  # serve on 127.0.0.1:3000
//! cargo run --release --example axum -- --load 5      # requests/s with and without the layer
//! ```
//!
//! It starts its own redis-server unless `REDIS_URL` names one. Try it with
//! `curl -X PUT localhost:3000/resources/42` (from two terminals at once: the second waits for
//! the first) and `curl localhost:3000/report` (at most 2 at once, across every instance).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, Request};
use axum::routing::{get, put};
use axum::{Extension, Router};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlatch::LockClient;
use redlatch::layer::{LockLayer, PermitLayer, RequestHold};
use redlatch_harness::server;

#[derive(Parser, Debug)]
#[command(about = "redlatch's tower layers in an axum app")]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// Instead of serving, measure requests/s through the app with and without the lock
    /// layer (distinct keys), for this many seconds each, side by side.
    #[arg(long)]
    load: Option<f64>,
    /// Concurrent connections of the load test.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Print the load test's figures as one JSON object too.
    #[arg(long)]
    json: bool,
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Updates a resource; the lock layer makes sure only one request per resource runs at once.
async fn update(Path(id): Path<String>, Extension(hold): Extension<RequestHold>) -> String {
    format!(
        "updated {id} under `{}`, fencing token {}\n",
        hold.name(),
        hold.fencing_token()
    )
}

/// An expensive report; the permit layer allows 2 at once across the fleet.
async fn report() -> &'static str {
    tokio::time::sleep(Duration::from_millis(500)).await;
    "report\n"
}

fn app(client: &LockClient) -> Router {
    let resources = Router::new().route("/resources/{id}", put(update)).layer(
        LockLayer::new(client.clone(), |req: &Request| {
            let id = req.uri().path().strip_prefix("/resources/")?;
            Some(format!("resource:{id}"))
        })
        .wait_timeout(Duration::from_secs(5))
        .respond_with_status(),
    );
    let reports = Router::new()
        .route("/report", get(report))
        .layer(PermitLayer::new(client.clone(), "reports", 2).respond_with_status());
    resources.merge(reports)
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let args = Args::parse();
    let (_server, url) = server::named_or_own(std::env::var("REDIS_URL").ok());
    let client = LockClient::builder(
        deadpool_redis::Config::from_url(&url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))?,
        url.as_str(),
    )
    .key_prefix(format!("redlatch-axum-{}", std::process::id()))
    .build()?;

    match args.load {
        None => {
            let listener = tokio::net::TcpListener::bind(args.addr).await?;
            println!("serving on http://{} (Redis at {url})", args.addr);
            println!("  curl -X PUT http://{}/resources/42", args.addr);
            println!("  curl http://{}/report", args.addr);
            axum::serve(listener, app(&client))
                .with_graceful_shutdown(async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
        }
        Some(seconds) => load(&client, &args, Duration::from_secs_f64(seconds.max(0.5))).await?,
    }
    Ok(())
}

/// Requests/s of `PUT /resources/{id}` with the lock layer (each connection on a key of its
/// own) beside the same route without it, in alternating rounds, one after the other.
async fn load(client: &LockClient, args: &Args, phase: Duration) -> AnyResult<()> {
    let bare = Router::new().route("/resources/{id}", put(|| async { "updated\n" }));
    let locked = Router::new()
        .route("/resources/{id}", put(|| async { "updated\n" }))
        .layer(
            LockLayer::new(client.clone(), |req: &Request| {
                let id = req.uri().path().strip_prefix("/resources/")?;
                Some(format!("resource:{id}"))
            })
            .respond_with_status(),
        );
    let bare_addr = serve(bare).await?;
    let locked_addr = serve(locked).await?;
    let mut rows = Vec::new();
    for round in 0..3 {
        for (label, addr) in [
            ("without the layer", bare_addr),
            ("with the lock layer", locked_addr),
        ] {
            let rate = hammer(addr, args.connections, phase).await?;
            println!("round {round}: {label:<20} {rate:>8.0} requests/s");
            rows.push((label, rate));
        }
    }
    let median = |label: &str| {
        let mut v: Vec<f64> = rows.iter().filter(|r| r.0 == label).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (without, with) = (median("without the layer"), median("with the lock layer"));
    println!(
        "median of 3: {without:.0} requests/s without the layer, {with:.0} with it ({:.0}%), {} connections, distinct keys",
        100.0 * with / without,
        args.connections
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "connections": args.connections,
                "seconds_per_round": phase.as_secs_f64(),
                "without_layer_rps": without,
                "with_layer_rps": with,
                "ratio": with / without,
            })
        );
    }
    Ok(())
}

async fn serve(app: Router) -> AnyResult<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// `connections` loops of `PUT /resources/c<i>` for `phase`; returns requests/s.
async fn hammer(addr: SocketAddr, connections: usize, phase: Duration) -> AnyResult<f64> {
    let http: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for c in 0..connections {
        let (http, stop, done) = (http.clone(), Arc::clone(&stop), Arc::clone(&done));
        let uri: http::Uri = format!("http://{addr}/resources/c{c}").parse()?;
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let request = http::Request::put(uri.clone()).body(Empty::new())?;
                let response = http.request(request).await?;
                if !response.status().is_success() {
                    return Err(format!("status {}", response.status()).into());
                }
                response.into_body().collect().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    tokio::time::sleep(phase).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    for w in workers {
        w.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64())
}
