//! Micro-benchmark: one uncontended lock+unlock cycle against a local redis-server, beside the
//! two raw script calls it is made of. `cargo bench --bench cycle`.

use criterion::{Criterion, criterion_main};
use deadpool_redis::{Config, Runtime};
use redlatch_harness::server;

fn cycle(c: &mut Criterion) {
    let server = server::RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (client, conn) = rt.block_on(async {
        let pool = Config::from_url(&url)
            .create_pool(Some(Runtime::Tokio1))
            .expect("pool");
        let conn = deadpool_redis::Connection::take(pool.get().await.expect("connection"));
        let client = redlatch::LockClient::new(pool, url.as_str()).expect("client");
        (client, conn)
    });
    let mutex = client.mutex("bench").expect("name");
    c.bench_function("redlatch lock+unlock", |b| {
        b.to_async(&rt).iter(|| async {
            mutex
                .lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock")
        })
    });
    let acquire = redis::Script::new(concat!(
        "local PUBLISH = 'PUBLISH'\n",
        include_str!("../lua/v1/mutex_lib.lua"),
        include_str!("../lua/v1/mutex_acquire.lua")
    ));
    let release = redis::Script::new(concat!(
        "local PUBLISH = 'PUBLISH'\n",
        include_str!("../lua/v1/mutex_lib.lua"),
        include_str!("../lua/v1/mutex_release.lua")
    ));
    c.bench_function("raw EVALSHA acquire+release", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            let (acquire, release) = (&acquire, &release);
            async move {
                let _: redis::Value = acquire
                    .key("raw:{bench}")
                    .key("raw:{bench}:fence")
                    .arg("owner")
                    .arg(30_000)
                    .arg(60_000)
                    .arg("new")
                    .arg("-")
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await
                    .expect("acquire");
                let _: redis::Value = release
                    .key("raw:{bench}")
                    .arg("owner")
                    .arg("raw:{bench}:wake")
                    .invoke_async(&mut conn)
                    .await
                    .expect("release");
            }
        })
    });
}

mod group {
    #![allow(missing_docs)]
    use super::cycle;
    use criterion::criterion_group;
    criterion_group!(benches, cycle);
}

criterion_main!(group::benches);
