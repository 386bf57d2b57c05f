//! Redis Sentinel for tests: sentinels (the same `redis-server` binary, run with `--sentinel`
//! and a configuration file of their own) that monitor a master started by the test, and
//! helpers that wait until they are ready and until they have failed the master over.
//!
//! The sentinels decide quickly: a master is down after 1 s without an answer
//! (`down-after-milliseconds`), and a failover may be retried after 5 s (`failover-timeout`).
//! Each sentinel learns of the others and of the replicas through the master, in a few seconds:
//! [`Sentinels::start`] returns once every sentinel knows them all, so that a failover can
//! start at once.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Value;

/// How long a master may not answer before a sentinel thinks it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// One sentinel process, killed on drop.
#[derive(Debug)]
struct Sentinel {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
}

impl Sentinel {
    fn start(name: &str, master_port: u16, quorum: usize) -> Result<Self, String> {
        let mut last = String::new();
        for _ in 0..10 {
            let port = crate::server::free_port();
            let dir = std::env::temp_dir().join(format!(
                "redlatch-sentinel-{}-{port}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&dir).map_err(|e| format!("sentinel dir: {e}"))?;
            let conf = dir.join("sentinel.conf");
            // Sentinel rewrites its configuration file: it must be its own and writable.
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} 5000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display(),
                down = DOWN_AFTER.as_millis(),
            );
            std::fs::write(&conf, text).map_err(|e| format!("sentinel conf: {e}"))?;
            let child = Command::new(crate::server::binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run redis-server --sentinel: {e}"))?;
            let mut sentinel = Self {
                child: Some(child),
                port,
                dir,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Some(child) = sentinel.child.as_mut()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    sentinel.child = None;
                    last = format!("sentinel exited with {status}");
                    break;
                }
                if crate::server::ping(port) {
                    return Ok(sentinel);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(format!("no sentinel started after 10 ports: {last}"))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        cmd.query(&mut conn).map_err(|e| e.to_string())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sentinels that monitor one master, by one name.
#[derive(Debug)]
pub struct Sentinels {
    name: String,
    sentinels: Vec<Sentinel>,
}

impl Sentinels {
    /// Starts `count` sentinels monitoring the master on `master_port` as `name` (a majority
    /// of them must agree that it is down), and waits until each of them knows the other
    /// sentinels and `replicas` replicas.
    ///
    /// # Errors
    ///
    /// A sentinel that does not start, or sentinels that do not find each other or the
    /// replicas within 20 s.
    pub fn start(
        name: &str,
        master_port: u16,
        count: usize,
        replicas: usize,
    ) -> Result<Self, String> {
        let quorum = count / 2 + 1;
        let sentinels = (0..count)
            .map(|_| Sentinel::start(name, master_port, quorum))
            .collect::<Result<Vec<_>, _>>()?;
        let this = Self {
            name: name.to_owned(),
            sentinels,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = this.sentinels.iter().all(|s| {
                this.master_field(s, "num-other-sentinels") == Some(count as i64 - 1)
                    && this.master_field(s, "num-slaves") == Some(replicas as i64)
            });
            if ready {
                return Ok(this);
            }
            if Instant::now() > deadline {
                return Err("the sentinels did not find each other and the replicas".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The name the sentinels know the master by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sentinels' addresses (`redis://127.0.0.1:<port>`).
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Asks the first sentinel to fail the master over now (`SENTINEL FAILOVER`), without the
    /// others' agreement; [`await_failover`](Self::await_failover) waits for its end.
    ///
    /// # Errors
    ///
    /// The sentinel refused (no replica it can promote, a failover under way) or did not
    /// answer.
    pub fn force_failover(&self) -> Result<(), String> {
        let first = self.sentinels.first().ok_or("no sentinel")?;
        first.query::<()>(redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.name))
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let addr: Option<(String, u16)> = s
                .query(
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(&self.name),
                )
                .ok()?;
            addr.map(|(_, port)| port)
        })
    }

    /// Waits until every sentinel names a master other than the one on `old`, and that
    /// master says it is one: its port, and how long it took from `since`.
    ///
    /// # Errors
    ///
    /// No failover within `timeout`.
    pub fn await_failover(
        &self,
        old: u16,
        since: Instant,
        timeout: Duration,
    ) -> Result<(u16, Duration), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    s.query::<Option<(String, u16)>>(
                        redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(&self.name),
                    )
                    .ok()
                    .flatten()
                    .map(|(_, port)| port)
                })
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
                && role(*new).as_deref() == Some("master")
            {
                return Ok((*new, since.elapsed()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no failover from port {old}: sentinels name {named:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A numeric field of `SENTINEL MASTER <name>` as `sentinel` reports it.
    fn master_field(&self, sentinel: &Sentinel, field: &str) -> Option<i64> {
        let reply: Value = sentinel
            .query(redis::cmd("SENTINEL").arg("MASTER").arg(&self.name))
            .ok()?;
        let Value::Array(items) = reply else {
            return None;
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        items
            .chunks(2)
            .find(|pair| pair.first().and_then(text).as_deref() == Some(field))
            .and_then(|pair| pair.get(1).and_then(text))
            .and_then(|v| v.parse().ok())
    }
}

/// The role (`master`, `slave`) the server on `port` reports, if it answers.
pub fn role(port: u16) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    let reply: Value = redis::cmd("ROLE").query(&mut conn).ok()?;
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}
