//! The layers in a real axum server on loopback, called over HTTP, against real Redis.
#![cfg(feature = "tower")]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Path, Request};
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use redlatch::layer::{LockLayer, PermitLayer, RequestHold};
use support::{TestRedis, within};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Barrier, Mutex as LocalMutex, Notify};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Serves `app` on a free loopback port.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

async fn get_status(client: &HttpClient, addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let response = client
        .get(format!("http://{addr}{path}").parse().expect("uri"))
        .await
        .expect("response");
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    (status, if retry.is_empty() { text } else { retry })
}

/// Locks `/items/{id}` by its id.
fn by_item(req: &Request) -> Option<String> {
    req.uri()
        .path()
        .strip_prefix("/items/")
        .map(|id| format!("item:{id}"))
}

#[derive(Debug, Clone, Copy)]
struct Interval {
    start: Instant,
    end: Instant,
}

/// What the handlers of the first test share: recorded intervals, a barrier for the distinct
/// resources, the counter key and the Redis URL.
type Shared = (
    Arc<LocalMutex<Vec<(String, Interval)>>>,
    Arc<Barrier>,
    String,
    String,
);

fn overlap(a: &Interval, b: &Interval) -> bool {
    a.start < b.end && b.start < a.end
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_resource_is_served_one_request_at_a_time_and_distinct_ones_in_parallel() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let intervals = Arc::new(LocalMutex::new(Vec::<(String, Interval)>::new()));
        let barrier = Arc::new(Barrier::new(8));
        let counter = format!("{}:counter", redis.prefix);
        let url = redis.url.clone();
        let state = (
            Arc::clone(&intervals),
            Arc::clone(&barrier),
            counter.clone(),
            url,
        );
        let app = Router::new()
            .route(
                "/items/{id}",
                get(
                    |Path(id): Path<String>,
                     Extension(hold): Extension<RequestHold>,
                     Extension((intervals, barrier, counter, url)): Extension<Shared>| async move {
                        let start = Instant::now();
                        if id.starts_with("distinct") {
                            // Only returns once all eight run at the same time.
                            barrier.wait().await;
                        } else {
                            let mut conn = redis::Client::open(url.as_str())
                                .unwrap()
                                .get_multiplexed_async_connection()
                                .await
                                .unwrap();
                            support::racy_increment(&mut conn, &counter).await;
                        }
                        let end = Instant::now();
                        intervals.lock().await.push((id, Interval { start, end }));
                        hold.fencing_token().to_string()
                    },
                ),
            )
            .layer(LockLayer::new(redis.client(), by_item).respond_with_status())
            .layer(Extension(state));
        let addr = serve(app).await;
        let client = http_client();

        let mut calls = Vec::new();
        for _ in 0..32 {
            let client = client.clone();
            calls.push(tokio::spawn(async move {
                get_status(&client, addr, "/items/shared").await
            }));
        }
        let mut tokens = Vec::new();
        for call in calls {
            let (status, body) = call.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{body}");
            tokens.push(body.parse::<u64>().unwrap());
        }
        // Exact: no two handlers read-modified-wrote the counter at once.
        let mut conn = redis.conn().await;
        let count: u64 = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, 32);
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(
            tokens.len(),
            32,
            "every request had a fencing token of its own"
        );
        let shared: Vec<Interval> = intervals.lock().await.drain(..).map(|(_, i)| i).collect();
        for (i, a) in shared.iter().enumerate() {
            for b in &shared[i + 1..] {
                assert!(!overlap(a, b), "{a:?} overlaps {b:?}");
            }
        }

        // Eight distinct resources: their handlers all run at once (the barrier needs it).
        let mut calls = Vec::new();
        for i in 0..8 {
            let client = client.clone();
            calls.push(tokio::spawn(async move {
                get_status(&client, addr, &format!("/items/distinct-{i}")).await
            }));
        }
        for call in calls {
            assert_eq!(call.await.unwrap().0, StatusCode::OK);
        }
        let distinct: Vec<Interval> = intervals.lock().await.drain(..).map(|(_, i)| i).collect();
        assert!(overlap(&distinct[0], &distinct[7]));
        support::until(|| async { redis.leftovers().await == vec![counter.clone()] }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_is_never_exceeded_and_is_reached() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        const PERMITS: usize = 3;
        const REQUESTS: usize = 24;
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        // Each handler leaves only once PERMITS handlers are inside together: the limit is
        // reached, and a limit that let fewer in would hang the test (REQUESTS is a multiple).
        let full = Arc::new(tokio::sync::Barrier::new(PERMITS));
        let app = Router::new()
            .route(
                "/work",
                get(
                    |Extension((inside, most, full)): Extension<(
                        Arc<AtomicUsize>,
                        Arc<AtomicUsize>,
                        Arc<tokio::sync::Barrier>,
                    )>| async move {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        full.wait().await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        "done"
                    },
                ),
            )
            .layer(PermitLayer::new(redis.client(), "work", PERMITS as u32).respond_with_status())
            .layer(Extension((
                Arc::clone(&inside),
                Arc::clone(&most),
                Arc::clone(&full),
            )));
        let addr = serve(app).await;
        let client = http_client();
        let mut calls = Vec::new();
        for _ in 0..REQUESTS {
            let client = client.clone();
            calls.push(tokio::spawn(async move {
                get_status(&client, addr, "/work").await
            }));
        }
        for call in calls {
            assert_eq!(call.await.unwrap().0, StatusCode::OK);
        }
        assert_eq!(most.load(Ordering::SeqCst), PERMITS);
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// The README's recipe: names from the decoded path make every spelling of one resource one
/// lock (the handler's `Path` is decoded too), and `route_layer` leaves the 404 fallback alone,
/// so an unknown URL takes no lock and no permit.
#[tokio::test]
async fn every_spelling_of_a_path_is_one_lock_and_unknown_urls_take_none() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let app = Router::new()
            .route(
                "/items/{id}",
                get(|Path(id): Path<String>| async move { id }),
            )
            .route_layer(PermitLayer::new(client.clone(), "api", 8).respond_with_status())
            .route_layer(
                LockLayer::new(client.clone(), |req: &Request| {
                    redlatch::layer::decoded_path(req)
                })
                .fail_fast()
                .respond_with_status(),
            );
        let addr = serve(app).await;
        let http = http_client();
        let held = client.mutex("/items/42").unwrap().lock().await.unwrap();
        for spelling in ["/items/42", "/items/%34%32", "/items/4%32"] {
            let (status, _) = get_status(&http, addr, spelling).await;
            assert_eq!(status, StatusCode::LOCKED, "{spelling}");
        }
        held.unlock().await.unwrap();
        let (status, body) = get_status(&http, addr, "/items/%34%32").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "42"));
        let (status, _) = get_status(&http, addr, "/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let snapshot = client.inspect("/nope").await.unwrap();
        assert_eq!(
            snapshot.last_fencing_token, None,
            "a lock was taken for a 404"
        );
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn busy_and_timed_out_requests_get_their_statuses() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let app = Router::new()
            .route("/fast/{id}", get(|| async { "ok" }))
            .layer(
                LockLayer::new(client.clone(), |req: &Request| {
                    req.uri()
                        .path()
                        .strip_prefix("/fast/")
                        .map(|id| format!("item:{id}"))
                })
                .fail_fast()
                .respond_with_status(),
            )
            .merge(
                Router::new()
                    .route("/slow/{id}", get(|| async { "ok" }))
                    .layer(
                        LockLayer::new(client.clone(), |req: &Request| {
                            req.uri()
                                .path()
                                .strip_prefix("/slow/")
                                .map(|id| format!("item:{id}"))
                        })
                        .wait_timeout(Duration::from_millis(200))
                        .respond_with_status(),
                    ),
            )
            .merge(
                Router::new()
                    .route("/limited", get(|| async { "ok" }))
                    .layer(
                        PermitLayer::new(client.clone(), "limited", 1)
                            .fail_fast()
                            .respond_with_status(),
                    ),
            );
        let addr = serve(app).await;
        let http = http_client();
        let held = client.mutex("item:7").unwrap().lock().await.unwrap();
        let permit = client
            .semaphore("limited", 1)
            .unwrap()
            .acquire()
            .await
            .unwrap();

        let (status, retry) = get_status(&http, addr, "/fast/7").await;
        assert_eq!(status, StatusCode::LOCKED);
        assert!(
            (20..=30).contains(&retry.parse::<u64>().unwrap()),
            "{retry}"
        );
        let (status, retry) = get_status(&http, addr, "/slow/7").await;
        assert_eq!(status, StatusCode::LOCKED);
        assert!(retry.parse::<u64>().unwrap() >= 1);
        let (status, retry) = get_status(&http, addr, "/limited").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(retry.parse::<u64>().unwrap() >= 1);
        // Other resources are not affected.
        assert_eq!(get_status(&http, addr, "/fast/8").await.0, StatusCode::OK);

        held.unlock().await.unwrap();
        permit.release().await.unwrap();
        assert_eq!(get_status(&http, addr, "/fast/7").await.0, StatusCode::OK);
        assert_eq!(get_status(&http, addr, "/limited").await.0, StatusCode::OK);
    })
    .await;
}

/// A route whose handler signals it started, then never finishes; `dropped` is set when
/// its future is dropped.
fn stuck(started: Arc<Notify>, dropped: Arc<AtomicBool>) -> Router {
    Router::new().route(
        "/items/{id}",
        get(move || {
            let (started, dropped) = (Arc::clone(&started), Arc::clone(&dropped));
            async move {
                struct OnDrop(Arc<AtomicBool>);
                impl Drop for OnDrop {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::SeqCst);
                    }
                }
                let _flag = OnDrop(dropped);
                started.notify_one();
                std::future::pending::<&'static str>().await
            }
        }),
    )
}

#[tokio::test]
async fn a_client_that_hangs_up_releases_the_lock_at_once() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let (started, dropped) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let app = stuck(Arc::clone(&started), Arc::clone(&dropped))
            .layer(LockLayer::new(client.clone(), by_item).respond_with_status());
        let addr = serve(app).await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /items/9 HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        started.notified().await;
        assert_eq!(client.inspect("item:9").await.unwrap().holders.len(), 1);
        drop(stream);
        // The next holder gets in long before the 30 s lease could have run out.
        let next = client
            .mutex("item:9")
            .unwrap()
            .lock_timeout(Duration::from_secs(10))
            .await
            .expect("the lock was not released when the client went away");
        assert!(dropped.load(Ordering::SeqCst), "the handler kept running");
        next.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_lease_lost_mid_handler_cancels_it_and_answers_503() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let (started, dropped) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let app = stuck(Arc::clone(&started), Arc::clone(&dropped))
            .layer(LockLayer::new(client.clone(), by_item).respond_with_status());
        let addr = serve(app).await;
        let http = http_client();
        let call = tokio::spawn(async move { get_status(&http, addr, "/items/lost").await });
        started.notified().await;
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("item:lost"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let (status, body) = call.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("lost"), "{body}");
        assert!(dropped.load(Ordering::SeqCst), "the handler kept running");
    })
    .await;
}
