//! A singleton job in an axum service: every instance campaigns in one election, only the
//! leader runs the job (each run fenced with its term), and `GET /leader` on any instance says
//! who leads.
//!
//! ```text
//! cargo run --example election                          # one instance on 127.0.0.1:3001
//! cargo run --example election -- --addr 127.0.0.1:3002 # another, in a second terminal
//! cargo run --example election -- --demo                # three instances in one process
//! ```
//!
//! Instances share an election when they share a server: run them with `REDIS_URL` set (for
//! instance `REDIS_URL=redis://127.0.0.1:6379`), else each starts a redis-server of its own.
//! Stop the leading instance (Ctrl-C) and another takes the job over at once: the leadership
//! is resigned on the way out. Kill it instead (`kill -9`) and the next leader takes over when
//! the lease (2 s here) runs out. `--demo` runs three instances on free ports, asks each of
//! them who leads, shuts the leader down until none is left, and prints what an observer saw.
//!
//! On a server it did not start, it writes only under its own key prefix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use clap::Parser;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redlatch::{Election, LockClient};
use redlatch_harness::server;
use tokio::sync::watch;

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
#[command(about = "a singleton job under redlatch's leader election")]
struct Args {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:3001")]
    addr: SocketAddr,
    /// Run three instances in this process, shut the leader down until none is left, and exit.
    #[arg(long)]
    demo: bool,
    /// The key prefix (instances that share one election share it).
    #[arg(long, default_value = "redlatch-example")]
    prefix: String,
}

/// One instance of the service.
struct Instance {
    id: String,
    election: Election,
    /// The term this instance leads in, if it leads.
    leading: watch::Sender<Option<u64>>,
}

/// `GET /leader`: who leads, as every instance sees it.
async fn leader(State(me): State<Arc<Instance>>) -> String {
    match me.election.leader().await {
        Ok(Some(l)) => format!("{} leads (term {}); asked {}\n", l.value, l.term, me.id),
        Ok(None) => format!("nobody leads; asked {}\n", me.id),
        Err(e) => format!("unknown: {e}\n"),
    }
}

/// Campaigns, runs the job while leading, and campaigns again when the leadership is lost,
/// until `stop` says so; then resigns.
async fn lead(me: Arc<Instance>, mut stop: watch::Receiver<bool>) -> redlatch::Result<()> {
    while !*stop.borrow() {
        let leadership = tokio::select! {
            won = me.election.campaign(me.id.clone()) => won?,
            _ = stop.changed() => break,
        };
        let term = leadership.term();
        me.leading.send_replace(Some(term));
        println!("{} leads, term {term}", me.id);
        let mut runs = 0u64;
        loop {
            tokio::select! {
                // The singleton job: here a tick; a real one would send `term` with its writes
                // so that a deposed leader's late write is refused.
                _ = tokio::time::sleep(Duration::from_millis(200)) => runs += 1,
                _ = leadership.lost() => {
                    println!("{} lost term {term} after {runs} runs", me.id);
                    break;
                }
                _ = stop.changed() => break,
            }
        }
        me.leading.send_replace(None);
        if leadership.is_held() {
            leadership.resign().await?;
            println!("{} resigned term {term} after {runs} runs", me.id);
        }
    }
    Ok(())
}

/// Starts an instance serving on `addr`; `stop` ends its campaign (resigning) and its server.
async fn start(
    client: &LockClient,
    id: String,
    addr: SocketAddr,
    stop: watch::Receiver<bool>,
) -> AnyResult<(Arc<Instance>, SocketAddr, tokio::task::JoinHandle<()>)> {
    let election = client
        .election("singleton-job")?
        .with_lease(Duration::from_secs(2))?;
    let me = Arc::new(Instance {
        id,
        election,
        leading: watch::Sender::new(None),
    });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/leader", get(leader))
        .with_state(Arc::clone(&me));
    let task = {
        let me = Arc::clone(&me);
        let mut until = stop.clone();
        tokio::spawn(async move {
            let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = until.wait_for(|s| *s).await;
            });
            let (served, led) = tokio::join!(serving, lead(me, stop));
            if let Err(e) = served {
                eprintln!("server: {e}");
            }
            if let Err(e) = led {
                eprintln!("election: {e}");
            }
        })
    };
    Ok((me, bound, task))
}

async fn get_text(addr: SocketAddr, path: &str) -> AnyResult<String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let response = client.get(format!("http://{addr}{path}").parse()?).await?;
    let body = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn client(url: &str, prefix: &str) -> AnyResult<LockClient> {
    let pool =
        deadpool_redis::Config::from_url(url).create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    Ok(LockClient::builder(pool, url).key_prefix(prefix).build()?)
}

async fn demo(url: &str, prefix: &str) -> AnyResult<()> {
    let watcher = client(url, prefix)?;
    let mut changes = watcher.election("singleton-job")?.observe().await?;
    let observer = tokio::spawn(async move {
        while let Some(Ok(change)) = changes.next().await {
            match change {
                Some(l) => println!("observer: {} leads, term {}", l.value, l.term),
                None => println!("observer: nobody leads"),
            }
        }
    });
    let mut instances = Vec::new();
    for i in 0..3 {
        let (stop, until) = watch::channel(false);
        let id = format!("instance-{i}");
        let (me, addr, task) =
            start(&client(url, prefix)?, id, ([127, 0, 0, 1], 0).into(), until).await?;
        instances.push((me, addr, stop, task));
    }
    while !instances.is_empty() {
        // Wait for a leader, let it run its job a little, ask every instance, then shut the
        // leader down.
        let leading = loop {
            if let Some(i) = instances
                .iter()
                .position(|(me, ..)| me.leading.borrow().is_some())
            {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (_, addr, ..) in &instances {
            print!(
                "GET /leader on {addr}: {}",
                get_text(*addr, "/leader").await?
            );
        }
        let (me, _, stop, task) = instances.remove(leading);
        println!("shutting {} down", me.id);
        stop.send_replace(true);
        task.await?;
    }
    // Let the observer print the last resignation.
    tokio::time::sleep(Duration::from_millis(100)).await;
    observer.abort();
    Ok(())
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    let args = Args::parse();
    let (server, url) = server::try_named_or_own(std::env::var("REDIS_URL").ok())?;
    let prefix = args.prefix.clone();
    if args.demo {
        let prefix = format!("{}-demo-{}", args.prefix, std::process::id());
        demo(&url, &prefix).await?;
    } else {
        let (stop, until) = watch::channel(false);
        let id = format!("{}-{}", args.addr, std::process::id());
        let (_, addr, task) = start(&client(&url, &prefix)?, id, args.addr, until).await?;
        println!("serving on http://{addr}/leader; Ctrl-C resigns and stops");
        tokio::signal::ctrl_c().await?;
        stop.send_replace(true);
        task.await?;
    }
    drop(server);
    Ok(())
}
