//! An axum app with one route under a per-resource lock and one under a fleet-wide
//! concurrency limit.
//!
//! ```text
//! cargo run --release --example axum                  # serve on 127.0.0.1:3000
//! cargo run --release --example axum -- --load 5      # requests/s with and without the layer
//! ```
//!
//! The load test runs three apps on one route, each connection on a key of its own: without a
//! lock, under `LockLayer`, and with a handler that runs redlatch's acquire and release scripts
//! itself (`EVALSHA` on one shared connection, no library logic): the layer's own cost is its
//! figure over that one.
//!
//! It starts its own redis-server unless `REDIS_URL` names one. Try it with
//! `curl -X PUT localhost:3000/resources/42` (from two terminals at once: the second waits for
//! the first) and `curl localhost:3000/report` (at most 2 at once, across every instance).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Extension, Router};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlatch::LockClient;
use redlatch::layer::{LockLayer, PermitLayer, RequestHold, decoded_path};
use redlatch_harness::measure::{raw_mutex_acquire, raw_mutex_release, server_micros};
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

/// The name of a resource's lock: from the decoded path, as the handler's `Path(id)` is, so
/// every spelling of one id (`42`, `%34%32`) is one lock.
fn resource_lock(req: &Request) -> Option<String> {
    let path = decoded_path(req)?;
    let id = path.strip_prefix("/resources/")?;
    Some(format!("resource:{id}"))
}

fn app(client: &LockClient) -> Router {
    // `route_layer`, not `layer`: the router's 404 fallback is left out, so an unknown URL takes
    // no lock and no permit.
    let resources = Router::new()
        .route("/resources/{id}", put(update))
        .route_layer(
            LockLayer::new(client.clone(), resource_lock)
                .wait_timeout(Duration::from_secs(5))
                .respond_with_status(),
        );
    let reports = Router::new()
        .route("/report", get(report))
        .route_layer(PermitLayer::new(client.clone(), "reports", 2).respond_with_status());
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
        Some(seconds) => {
            load(
                &client,
                &url,
                &args,
                Duration::from_secs_f64(seconds.max(0.5)),
            )
            .await?;
        }
    }
    Ok(())
}

/// What the raw app's handler needs: one shared connection, the key prefix, and the server's
/// clock read once and moved on by ours (as the library's estimate is).
#[derive(Clone)]
struct Raw {
    conn: redis::aio::MultiplexedConnection,
    prefix: Arc<str>,
    clock: (u64, Instant),
}

/// The raw app's handler: redlatch's acquire and release scripts by hand around the work.
async fn raw_update(
    State(raw): State<Raw>,
    Path(id): Path<String>,
) -> Result<&'static str, StatusCode> {
    let lock = format!("{}:{{resource:{id}}}", raw.prefix);
    let owner = uuid::Uuid::new_v4().simple().to_string();
    let floor = raw.clock.0 + u64::try_from(raw.clock.1.elapsed().as_micros()).unwrap_or(0);
    let mut conn = raw.conn;
    let granted = raw_mutex_acquire(&mut conn, &lock, &owner, floor)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    if granted.first().map(String::as_str) != Some("1") {
        return Err(StatusCode::CONFLICT);
    }
    let released = raw_mutex_release(&mut conn, &lock, &owner)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    if released != 2 {
        return Err(StatusCode::INTERNAL_SERVER_ERROR);
    }
    Ok("updated\n")
}

/// Requests/s of `PUT /resources/{id}` (each connection on a key of its own) without a lock,
/// under the lock layer, and with the raw scripts in the handler, in alternating rounds, one
/// after the other.
async fn load(client: &LockClient, url: &str, args: &Args, phase: Duration) -> AnyResult<()> {
    let bare = Router::new().route("/resources/{id}", put(|| async { "updated\n" }));
    let locked = Router::new()
        .route("/resources/{id}", put(|| async { "updated\n" }))
        .route_layer(LockLayer::new(client.clone(), resource_lock).respond_with_status());
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let clock = (server_micros(&mut conn).await?, Instant::now());
    let raw = Router::new()
        .route("/resources/{id}", put(raw_update))
        .with_state(Raw {
            conn,
            prefix: format!("{}-raw", client.key_prefix()).into(),
            clock,
        });
    let addrs = [
        ("without a lock", serve(bare).await?),
        ("with the lock layer", serve(locked).await?),
        ("raw scripts", serve(raw).await?),
    ];
    let mut rows = Vec::new();
    for round in 0..3 {
        for (label, addr) in addrs {
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
    let (without, with, raw) = (
        median("without a lock"),
        median("with the lock layer"),
        median("raw scripts"),
    );
    println!(
        "median of 3: {without:.0} requests/s without a lock, {with:.0} under the lock layer \
         ({:.0}% of it), {raw:.0} with the raw scripts in the handler (the layer: {:.0}% of \
         that), {} connections, distinct keys",
        100.0 * with / without,
        100.0 * with / raw,
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
                "raw_scripts_rps": raw,
                "ratio": with / without,
                "layer_over_raw": with / raw,
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
