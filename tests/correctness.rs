//! Mutual exclusion under contention: 16 tasks over 4 clients (separate pools), each doing a
//! non-atomic read-modify-write of a Redis counter inside the lock.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{TestRedis, within};

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 4;
const SECTIONS: usize = 200;

/// Runs the contended increment with `depth` nested holds per critical section and checks the
/// counter and the holder intervals.
async fn contended_increments(depth: usize) {
    let redis = TestRedis::new();
    let counter = format!("{}:counter", redis.prefix);
    let intervals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let epoch = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = redis.client();
        for _ in 0..TASKS_PER_CLIENT {
            let mutex = client.mutex("counter").unwrap();
            let mut conn = redis.conn().await;
            let counter = counter.clone();
            let intervals = Arc::clone(&intervals);
            tasks.push(tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let outer = mutex.lock().await.unwrap();
                    let mut nested = Vec::new();
                    for _ in 1..depth {
                        let last = nested.last().unwrap_or(&outer);
                        let g = last.reenter().await.unwrap();
                        nested.push(g);
                    }
                    let start = epoch.elapsed();
                    support::racy_increment(&mut conn, &counter).await;
                    let end = epoch.elapsed();
                    intervals.lock().unwrap().push((start, end));
                    // Innermost first, as nested scopes would.
                    while let Some(g) = nested.pop() {
                        g.unlock().await.unwrap();
                    }
                    outer.unlock().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut conn = redis.conn().await;
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, (CLIENTS * TASKS_PER_CLIENT * SECTIONS) as u64);
    let mut intervals = intervals.lock().unwrap().clone();
    assert_eq!(intervals.len(), CLIENTS * TASKS_PER_CLIENT * SECTIONS);
    intervals.sort();
    for pair in intervals.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "holder intervals overlap: {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        redis.leftovers().await.is_empty(),
        "{:?}",
        redis.leftovers().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_four_clients_count_exactly() {
    within(Duration::from_secs(240), contended_increments(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_three_deep_counts_exactly() {
    within(Duration::from_secs(240), contended_increments(3)).await;
}
