//! The resource that critical sections of fault tests write to: a Redis server of its own that
//! is never faulted. It holds two things under a name:
//!
//! * a **register** that sections update without atomicity (read, pause, write back plus one),
//!   each write recorded with the section's id in the same transaction: if two holders ever
//!   overlap, an update is lost and the register falls behind the count of ids (checker C2);
//! * a **fenced store**: a script that accepts a write only if its fencing token is above the
//!   highest it has accepted, and logs every attempt in order (checker C3).

use std::sync::LazyLock;

use redis::aio::MultiplexedConnection;
use redis::{RedisResult, Script};

/// Accepts a write iff its token is above the highest accepted; logs `token:1` or `token:0`.
static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local top = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > top then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[1] .. ':1')
  return 1
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ':0')
return 0
",
    )
});

/// The keys of one resource, under `prefix` (the test's own).
#[derive(Debug, Clone)]
pub struct Resource {
    register: String,
    done: String,
    fence_top: String,
    fence_log: String,
}

impl Resource {
    /// The resource `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}:resource:{name}");
        Self {
            register: format!("{base}:register"),
            done: format!("{base}:done"),
            fence_top: format!("{base}:fence-top"),
            fence_log: format!("{base}:fence-log"),
        }
    }

    /// Reads the register (the first half of a section's non-atomic update).
    pub async fn read(&self, conn: &mut MultiplexedConnection) -> RedisResult<u64> {
        let value: Option<u64> = redis::cmd("GET")
            .arg(&self.register)
            .query_async(conn)
            .await?;
        Ok(value.unwrap_or(0))
    }

    /// Writes `read + 1` back and records the section `id` with it, atomically: the second half
    /// of the update.
    pub async fn write(
        &self,
        conn: &mut MultiplexedConnection,
        read: u64,
        id: &str,
    ) -> RedisResult<()> {
        redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(&self.register)
            .arg(read + 1)
            .ignore()
            .cmd("SADD")
            .arg(&self.done)
            .arg(id)
            .ignore()
            .query_async(conn)
            .await
    }

    /// A fenced write with `token`: true if accepted.
    pub async fn fenced_write(
        &self,
        conn: &mut MultiplexedConnection,
        token: u64,
    ) -> RedisResult<bool> {
        let accepted: i64 = FENCED_WRITE
            .key(&self.fence_top)
            .key(&self.fence_log)
            .arg(token)
            .invoke_async(conn)
            .await?;
        Ok(accepted == 1)
    }

    /// The register and the number of recorded updates (equal unless an update was lost).
    pub async fn register(&self, conn: &mut MultiplexedConnection) -> RedisResult<(u64, u64)> {
        let value = self.read(conn).await?;
        let done: u64 = redis::cmd("SCARD")
            .arg(&self.done)
            .query_async(conn)
            .await?;
        Ok((value, done))
    }

    /// Every fenced write attempt, in the order the store saw them: (token, accepted).
    pub async fn fence_log(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> RedisResult<Vec<(u64, bool)>> {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.fence_log)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        Ok(entries
            .iter()
            .filter_map(|e| {
                let (token, accepted) = e.split_once(':')?;
                Some((token.parse().ok()?, accepted == "1"))
            })
            .collect())
    }
}
