//! The tower layers, one option at a time, through `ServiceExt::oneshot` against real Redis.
#![cfg(feature = "tower")]

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use redlatch::layer::{LayerError, LockLayer, OnLost, PermitLayer, RequestHold};
use redlatch::{LockClient, LockKind};

use redlatch_harness::proxy::Mode;
use support::{TestRedis, within};
use tokio::sync::{Notify, oneshot};
use tower::{Layer, ServiceExt, service_fn};

const LIMIT: Duration = Duration::from_secs(60);

type Body = Full<Bytes>;

fn request(path: &str) -> Request<Body> {
    Request::builder()
        .uri(path)
        .body(Body::default())
        .expect("request")
}

/// Names a lock after the path; `/free` is served without one.
fn by_path(req: &Request<Body>) -> Option<String> {
    (req.uri().path() != "/free").then(|| req.uri().path().to_owned())
}

/// A handler that reports what it saw of the hold and answers at once.
async fn report(req: Request<Body>) -> Result<Response<Body>, Infallible> {
    let text = match req.extensions().get::<RequestHold>() {
        Some(hold) => format!("{} {}", hold.name(), hold.fencing_token()),
        None => "none".to_owned(),
    };
    Ok(Response::new(Body::from(text)))
}

async fn text<B>(response: Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

fn layer_error(err: &redlatch::layer::BoxError) -> &LayerError {
    err.downcast_ref::<LayerError>().expect("a LayerError")
}

#[tokio::test]
async fn the_handler_runs_under_the_lock_and_sees_its_name_and_token() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let observer = client.clone();
        let service =
            LockLayer::new(client.clone(), by_path).layer(service_fn(move |req: Request<Body>| {
                let observer = observer.clone();
                async move {
                    // While the handler runs, the lock is held.
                    let snapshot = observer.inspect(req.uri().path()).await.unwrap();
                    let locked = req.uri().path() != "/free";
                    assert_eq!(snapshot.kind.is_some(), locked);
                    assert_eq!(snapshot.holders.len(), usize::from(locked));
                    report(req).await
                }
            }));
        let response = service.clone().oneshot(request("/orders/1")).await.unwrap();
        let body = text(response).await;
        let (name, token) = body.split_once(' ').unwrap();
        assert_eq!(name, "/orders/1");
        assert!(token.parse::<u64>().unwrap() > 0);
        // Released when the response future completed (in the background).
        support::until(|| async { redis.leftovers().await.is_empty() }).await;

        // No name: served without a lock, and without a RequestHold.
        let response = service.oneshot(request("/free")).await.unwrap();
        assert_eq!(text(response).await, "none");
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn fail_fast_and_timeouts_report_busy_with_the_holders_lease() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let holder = client.mutex("/busy").unwrap().lock().await.unwrap();

        let fail_fast = LockLayer::new(client.clone(), by_path)
            .fail_fast()
            .layer(service_fn(report));
        let err = fail_fast.oneshot(request("/busy")).await.unwrap_err();
        match layer_error(&err) {
            LayerError::Busy {
                name,
                permit: false,
                retry_after: Some(left),
            } => {
                assert_eq!(name, "/busy");
                assert!(*left > Duration::from_secs(20), "{left:?}");
            }
            other => panic!("{other:?}"),
        }

        let waiting = LockLayer::new(client.clone(), by_path)
            .wait_timeout(Duration::from_millis(200))
            .layer(service_fn(report));
        let err = waiting.oneshot(request("/busy")).await.unwrap_err();
        assert!(
            matches!(
                layer_error(&err),
                LayerError::TimedOut { waited, retry_after: Some(_), .. }
                    if *waited == Duration::from_millis(200)
            ),
            "{err:?}"
        );

        // As statuses: 423 Locked with Retry-After in whole seconds.
        let statuses = LockLayer::new(client.clone(), by_path)
            .fail_fast()
            .respond_with_status()
            .layer(service_fn(report));
        let response = statuses.oneshot(request("/busy")).await.unwrap();
        assert_eq!(response.status(), StatusCode::LOCKED);
        let retry: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((20..=30).contains(&retry), "{retry}");
        assert!(text(response).await.contains("busy"));
        holder.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_waiting_request_goes_once_the_holder_releases() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let holder = client.fair_mutex("/queue").unwrap().lock().await.unwrap();
        let service = LockLayer::new(client.clone(), by_path)
            .fair()
            .layer(service_fn(report));
        let waiting = tokio::spawn(service.oneshot(request("/queue")));
        // The request is blocked in the lock: queued behind the holder.
        support::until(|| async { redis.queued(&client, "/queue").await == 1 }).await;
        assert!(!waiting.is_finished());
        holder.unlock().await.unwrap();
        let response = waiting.await.unwrap().unwrap();
        assert!(text(response).await.starts_with("/queue "));
    })
    .await;
}

#[tokio::test]
async fn the_fair_option_serves_under_a_fair_mutex() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let observer = client.clone();
        let service = LockLayer::new(client.clone(), by_path)
            .fair()
            .layer(service_fn(move |req: Request<Body>| {
                let observer = observer.clone();
                async move {
                    let snapshot = observer.inspect("/fair").await.unwrap();
                    assert_eq!(snapshot.kind, Some(LockKind::FairMutex));
                    report(req).await
                }
            }));
        let response = service.oneshot(request("/fair")).await.unwrap();
        assert!(text(response).await.starts_with("/fair "));
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// A handler that signals it started, then waits for ever; `dropped` is set when its future
/// is dropped.
fn stuck_handler(
    started: Arc<Notify>,
    dropped: Arc<AtomicBool>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    service_fn(move |_req: Request<Body>| {
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
            std::future::pending::<Result<Response<Body>, Infallible>>().await
        }
    })
}

#[tokio::test]
async fn a_lease_lost_mid_handler_cancels_it_with_an_error() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        // A short lease, so the watchdog notices the deletion within a fraction of a second.
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let (started, dropped) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let service = LockLayer::new(client.clone(), by_path)
            .layer(stuck_handler(Arc::clone(&started), Arc::clone(&dropped)));
        let call = tokio::spawn(service.oneshot(request("/lost")));
        started.notified().await;
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("/lost"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let err = call.await.unwrap().unwrap_err();
        assert!(
            matches!(layer_error(&err), LayerError::LeaseLost { name } if name == "/lost"),
            "{err:?}"
        );
        assert!(dropped.load(Ordering::SeqCst), "the handler kept running");
    })
    .await;
}

#[tokio::test]
async fn flag_mode_lets_the_handler_finish_and_tells_it_the_lease_is_gone() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis
            .builder()
            .default_lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let (entered_tx, entered_rx) = oneshot::channel::<RequestHold>();
        let entered = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
        let service = LockLayer::new(client.clone(), by_path)
            .on_lease_lost(OnLost::Flag)
            .layer(service_fn(move |req: Request<Body>| {
                let entered = Arc::clone(&entered);
                async move {
                    let hold = req.extensions().get::<RequestHold>().unwrap().clone();
                    if let Some(tx) = entered.lock().unwrap().take() {
                        let _ = tx.send(hold.clone());
                    }
                    hold.lost().await;
                    Ok::<_, Infallible>(Response::new(Body::from(format!(
                        "held: {}",
                        hold.is_held()
                    ))))
                }
            }));
        let call = tokio::spawn(service.oneshot(request("/flag")));
        let hold = entered_rx.await.unwrap();
        assert!(hold.is_held());
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("DEL")
            .arg(redis.lock_key("/flag"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let response = call.await.unwrap().unwrap();
        assert_eq!(text(response).await, "held: false");
    })
    .await;
}

#[tokio::test]
async fn holding_until_the_body_ends_keeps_the_lock_while_it_streams() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let service = LockLayer::new(client.clone(), by_path)
            .hold_until_body_end()
            .layer(service_fn(report));
        let response = service.oneshot(request("/stream")).await.unwrap();
        // The head is here, the body unread: still held.
        let snapshot = client.inspect("/stream").await.unwrap();
        assert_eq!(snapshot.holders.len(), 1);
        assert!(text(response).await.starts_with("/stream "));
        support::until(|| async { redis.leftovers().await.is_empty() }).await;

        // Without the option the hold ends with the head, before the body is read.
        let service = LockLayer::new(client.clone(), by_path).layer(service_fn(report));
        let response = service.oneshot(request("/head")).await.unwrap();
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
        assert!(text(response).await.starts_with("/head "));
    })
    .await;
}

#[tokio::test]
async fn the_reentry_header_reenters_the_callers_hold() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let header = HeaderName::from_static("x-lock-owner");
        let caller = client.mutex("/chain").unwrap().lock().await.unwrap();
        let observer = client.clone();
        let owner = *caller.owner();
        let downstream = LockLayer::new(client.clone(), by_path)
            .fail_fast()
            .reentry_header(header.clone())
            .layer(service_fn(move |req: Request<Body>| {
                let observer = observer.clone();
                async move {
                    let hold = req.extensions().get::<RequestHold>().unwrap();
                    // The handler may pass the token on to the next hop.
                    assert_eq!(hold.owner(), Some(&owner));
                    let snapshot = observer.inspect("/chain").await.unwrap();
                    assert_eq!(snapshot.holders[0].exclusive_holds, 2);
                    report(req).await
                }
            }));
        let carried = Request::builder()
            .uri("/chain")
            .header(&header, owner.to_string())
            .body(Body::default())
            .unwrap();
        let response = downstream.clone().oneshot(carried).await.unwrap();
        assert_eq!(
            text(response).await,
            format!("/chain {}", caller.fencing_token())
        );
        // Without the header the same request is busy: the caller holds the lock.
        let err = downstream
            .clone()
            .oneshot(request("/chain"))
            .await
            .unwrap_err();
        assert!(matches!(layer_error(&err), LayerError::Busy { .. }));
        // A header that is not a token is refused, not guessed at.
        let bad = Request::builder()
            .uri("/chain")
            .header(&header, "not-a-token")
            .body(Body::default())
            .unwrap();
        let err = downstream.oneshot(bad).await.unwrap_err();
        assert!(matches!(layer_error(&err), LayerError::BadOwner { .. }));
        // The caller's own hold is intact; the re-entered one was given back.
        support::until(|| async {
            client.inspect("/chain").await.unwrap().holders[0].exclusive_holds == 1
        })
        .await;
        caller.unlock().await.unwrap();
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn the_permit_layer_holds_one_permit_per_request() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let observer = client.clone();
        let fixed = PermitLayer::new(client.clone(), "api", 2).layer(service_fn(
            move |req: Request<Body>| {
                let observer = observer.clone();
                async move {
                    let snapshot = observer.inspect("api").await.unwrap();
                    assert_eq!(snapshot.permits_in_use, Some(1));
                    assert_eq!(snapshot.capacity, Some(2));
                    report(req).await
                }
            },
        ));
        let response = fixed.oneshot(request("/anything")).await.unwrap();
        assert!(text(response).await.starts_with("api "));
        support::until(|| async { redis.leftovers().await.is_empty() }).await;

        // Per tenant: the name comes from the request; no tenant, no limit.
        let per_tenant = PermitLayer::per_request(client.clone(), 1, |req: &Request<Body>| {
            let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
            Some(format!("tenant:{tenant}"))
        })
        .fail_fast()
        .respond_with_status()
        .layer(service_fn(report));
        let taken = client
            .semaphore("tenant:acme", 1)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let acme = Request::builder()
            .uri("/")
            .header("x-tenant", "acme")
            .body(Body::default())
            .unwrap();
        let response = per_tenant.clone().oneshot(acme).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().contains_key("retry-after"));
        let other = Request::builder()
            .uri("/")
            .header("x-tenant", "globex")
            .body(Body::default())
            .unwrap();
        let response = per_tenant.clone().oneshot(other).await.unwrap();
        assert_eq!(
            text(response).await.split(' ').next(),
            Some("tenant:globex")
        );
        let response = per_tenant.oneshot(request("/")).await.unwrap();
        assert_eq!(text(response).await, "none");
        taken.release().await.unwrap();
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_name_that_cannot_be_used_is_a_bad_request() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client: LockClient = redis.client();
        let service = LockLayer::new(client, |_: &Request<Body>| Some("a{b"))
            .respond_with_status()
            .layer(service_fn(report));
        let response = service.oneshot(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    })
    .await;
}

/// Found by review: settings the layer was built with that the client refuses (a semaphore of
/// 0 permits; a fair lock or permits on a Redlock client) answered every request `400 Bad
/// Request` or `503 Service Unavailable`, blaming the caller or inviting retries for what only
/// the server's configuration can change.
#[tokio::test]
async fn settings_the_client_refuses_are_a_server_error() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client: LockClient = redis.client();
        let no_permits = PermitLayer::new(client.clone(), "p", 0)
            .respond_with_status()
            .layer(service_fn(report));
        let response = no_permits.oneshot(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        // A fixed name the client refuses (empty, braces) is the layer's setting too.
        for bad in ["", "a{b}"] {
            let bad_name = PermitLayer::new(client.clone(), bad, 2)
                .respond_with_status()
                .layer(service_fn(report));
            let response = bad_name.oneshot(request("/")).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{bad:?}"
            );
        }
        // A Redlock client serves neither fair locks nor semaphores; it refuses them before
        // reaching any node.
        let redlock = LockClient::redlock((0..3).map(|_| (redis.pool(), redis.url.as_str())))
            .key_prefix(&redis.prefix)
            .build()
            .unwrap();
        let fair = LockLayer::new(redlock.clone(), by_path)
            .fair()
            .respond_with_status()
            .layer(service_fn(report));
        let response = fair.oneshot(request("/fair")).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let permits = PermitLayer::new(redlock, "p", 2)
            .respond_with_status()
            .layer(service_fn(report));
        let response = permits.oneshot(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(redis.leftovers().await.is_empty());
    })
    .await;
}

#[tokio::test]
async fn poll_ready_only_asks_the_inner_service_and_the_lock_comes_with_the_call() {
    // Our own server: the test counts every script call it sees.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let client = redis.client();
        let (mut service, mut handle) = tower_test::mock::spawn_layer::<
            Request<Body>,
            Response<Body>,
            _,
        >(LockLayer::new(client.clone(), by_path));
        handle.allow(0);
        assert!(
            service.poll_ready().is_pending(),
            "ready before the inner service"
        );
        handle.allow(1);
        assert!(matches!(
            service.poll_ready(),
            std::task::Poll::Ready(Ok(()))
        ));
        assert_eq!(redis.calls("evalsha").await, 0, "readiness took a lock");
        let response = tokio::spawn(service.call(request("/mock")));
        // The inner service is called once the lock is held, with the hold in the request.
        let (req, reply) = handle.next_request().await.expect("the request");
        assert_eq!(
            req.extensions()
                .get::<RequestHold>()
                .map(|h| h.name().to_owned()),
            Some("/mock".to_owned())
        );
        assert_eq!(client.inspect("/mock").await.unwrap().holders.len(), 1);
        reply.send_response(Response::new(Body::from("ok")));
        assert_eq!(text(response.await.unwrap().unwrap()).await, "ok");
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn a_request_hold_kept_past_the_request_reports_the_release() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        let (tx, rx) = oneshot::channel::<RequestHold>();
        let tx = Arc::new(std::sync::Mutex::new(Some(tx)));
        let service =
            LockLayer::new(client.clone(), by_path).layer(service_fn(move |req: Request<Body>| {
                let tx = Arc::clone(&tx);
                async move {
                    let hold = req.extensions().get::<RequestHold>().cloned().unwrap();
                    assert!(hold.is_held());
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send(hold);
                    }
                    Ok::<_, Infallible>(Response::new(Body::default()))
                }
            }));
        let response = service.oneshot(request("/kept")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let hold = rx.await.unwrap();
        // The response is ready: the layer released the lock, and the kept handle says so.
        assert!(!hold.is_held());
        hold.lost().await;
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

#[tokio::test]
async fn the_permit_layer_times_out_reports_a_capacity_clash_and_frees_on_body_drop() {
    let redis = TestRedis::new();
    within(LIMIT, async {
        let client = redis.client();
        // The only permit is taken: a request waits its 200 ms and gets 503.
        let taken = client
            .semaphore("pool", 1)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        let waiting = PermitLayer::new(client.clone(), "pool", 1)
            .wait_timeout(Duration::from_millis(200))
            .respond_with_status()
            .layer(service_fn(report));
        let response = waiting.oneshot(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

        // A layer that says another capacity cannot change anything by retrying: 500.
        let clash = PermitLayer::new(client.clone(), "pool", 5)
            .respond_with_status()
            .layer(service_fn(report));
        let response = clash.oneshot(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        taken.release().await.unwrap();

        // Held until the body ends: a body dropped unread gives the permit back.
        let streaming = PermitLayer::new(client.clone(), "pool", 1)
            .hold_until_body_end()
            .layer(service_fn(report));
        let response = streaming.oneshot(request("/")).await.unwrap();
        assert_eq!(
            client.inspect("pool").await.unwrap().permits_in_use,
            Some(1)
        );
        drop(response);
        let patient = PermitLayer::new(client.clone(), "pool", 1)
            .wait_timeout(Duration::from_secs(10))
            .respond_with_status()
            .layer(service_fn(report));
        let again = patient.oneshot(request("/")).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        support::until(|| async { redis.leftovers().await.is_empty() }).await;
    })
    .await;
}

/// Found by review: with `reentry_header` set, every request's hold was marked as in use
/// elsewhere (its owner token read for the request's extension) whether or not the handler
/// read it, so a request cancelled for a lease lost at its deadline sent no release and the
/// name stayed taken for the rest of the lease in Redis.
#[tokio::test]
async fn a_token_the_handler_never_read_does_not_keep_a_lapsed_hold_taken() {
    // Our own server: the proxy holds this client's replies back.
    let redis = TestRedis::own();
    within(LIMIT, async {
        let (proxy, builder) = redis.through_proxy().await;
        // Renewals every 3 s; lost at about 9 s with the first renewal's answer held back,
        // when Redis, which got that renewal, still holds the name for about 3 s.
        let cut = builder
            .default_lease(Duration::from_secs(9))
            .build()
            .unwrap();
        let other = redis.client();
        let (started, dropped) = (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)));
        let service = LockLayer::new(cut.clone(), by_path)
            .reentry_header(HeaderName::from_static("x-lock-owner"))
            .layer(stuck_handler(Arc::clone(&started), Arc::clone(&dropped)));
        let call = tokio::spawn(service.oneshot(request("/lapsed")));
        started.notified().await;
        proxy.set(Mode::HoldReplies);
        let err = call.await.unwrap().unwrap_err();
        assert!(
            matches!(layer_error(&err), LayerError::LeaseLost { .. }),
            "{err:?}"
        );
        proxy.set(Mode::Pass);
        // Freed by the cancelled request's release, well before Redis would let it go.
        let next = other
            .mutex("/lapsed")
            .unwrap()
            .lock_timeout(Duration::from_millis(1500))
            .await
            .unwrap();
        next.unlock().await.unwrap();
        assert!(dropped.load(Ordering::SeqCst));
    })
    .await;
}
