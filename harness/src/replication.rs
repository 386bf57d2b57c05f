//! A master and a replica on loopback whose replication stream goes through a [`Proxy`], so a
//! test can cut it (the replica stays up, and reachable, but receives nothing).

use std::time::Duration;

use crate::RedisServer;
use crate::proxy::Proxy;

/// A master, and a replica that replicates it through `link`.
#[derive(Debug)]
pub struct ReplicaPair {
    /// The master.
    pub master: RedisServer,
    /// The replica (`--replicaof` the proxy).
    pub replica: RedisServer,
    /// The proxy the replication stream goes through.
    pub link: Proxy,
}

impl ReplicaPair {
    /// Starts both, the replica behind a proxy, and returns once the replica is in sync (it
    /// acknowledges writes only then). Must be called inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// A server that does not start, a proxy without a port, or a replica not in sync within
    /// 20 s.
    pub async fn start() -> Result<Self, String> {
        let master = RedisServer::try_start_with(&["--repl-diskless-sync-delay", "0"])?;
        let upstream = format!("127.0.0.1:{}", master.port())
            .parse()
            .map_err(|e| format!("{e}"))?;
        let link = Proxy::start(upstream).await.map_err(|e| e.to_string())?;
        let via = link.addr().port().to_string();
        let replica = RedisServer::try_start_with(&[
            "--replicaof",
            "127.0.0.1",
            &via,
            "--repl-diskless-sync-delay",
            "0",
        ])?;
        in_sync(&master).await?;
        Ok(Self {
            master,
            replica,
            link,
        })
    }
}

/// Waits until every replica of `master` is in sync and acknowledges writes: listed `online`,
/// and counted by `WAIT` (for about a second after the initial sync, an online replica may not
/// acknowledge yet).
///
/// # Errors
///
/// The master does not answer, or a replica is not in sync within 20 s.
pub async fn in_sync(master: &RedisServer) -> Result<(), String> {
    let mut conn = redis::Client::open(master.url())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let online = info.matches("state=online").count();
        if online > 0 {
            // A write of this connection's own (gone in a millisecond), for WAIT to count
            // acknowledgements of; the timeout well under redis-rs's answer timeout.
            let () = redis::cmd("SET")
                .arg("redlatch-harness:in-sync")
                .arg(1)
                .arg("PX")
                .arg(1)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let acked: usize = redis::cmd("WAIT")
                .arg(online)
                .arg(100)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if acked >= online {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the replica is not in sync: {info}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
