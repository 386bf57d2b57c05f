//! A Redis Cluster of redis-server processes on loopback: masters and their replicas started,
//! slots assigned, nodes introduced and replicas attached by plain commands (no `redis-cli`),
//! in a few seconds. A test can move a slot to another master and fail a master over to its
//! replica.

use std::time::{Duration, Instant};

use redis::Commands;

use crate::server::RedisServer;

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`, as Redis Cluster computes it (the part between the first `{` and the
/// next `}`, when not empty, else the whole key).
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % SLOTS
}

/// One node of the cluster.
#[derive(Debug)]
pub struct Node {
    /// Its process.
    pub server: RedisServer,
    /// Its cluster node id.
    pub id: String,
}

impl Node {
    fn conn(&self) -> Result<redis::Connection, String> {
        let client = redis::Client::open(self.server.url()).map_err(|e| e.to_string())?;
        client
            .get_connection_with_timeout(Duration::from_secs(2))
            .map_err(|e| format!("node {}: {e}", self.server.port()))
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        cmd.query(&mut self.conn()?)
            .map_err(|e| format!("node {}: {e}", self.server.port()))
    }
}

/// A cluster of masters, each with its replicas, killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node; the first `masters` were started as masters, then the replicas of master 0,
    /// of master 1, ...
    pub nodes: Vec<Node>,
    masters: usize,
}

fn cluster_args() -> Vec<&'static str> {
    vec![
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
        "--cluster-allow-replica-migration",
        "no",
    ]
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each. Panics, with an install hint, if
    /// redis-server cannot be run or the cluster does not form.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::try_start(masters, replicas).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`start`](Self::start) that returns the failure instead of panicking.
    pub fn try_start(masters: usize, replicas: usize) -> Result<Self, String> {
        if masters == 0 || masters > usize::from(SLOTS) {
            return Err(format!("a cluster of {masters} masters"));
        }
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let server = RedisServer::try_start_with(&cluster_args())?;
            nodes.push(Node {
                server,
                id: String::new(),
            });
        }
        for node in &mut nodes {
            node.id = node.query(redis::cmd("CLUSTER").arg("MYID"))?;
        }
        let per = usize::from(SLOTS) / masters;
        for (i, node) in nodes.iter().take(masters).enumerate() {
            let first = i * per;
            let last = if i + 1 == masters {
                usize::from(SLOTS) - 1
            } else {
                first + per - 1
            };
            node.query::<()>(
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            )?;
        }
        let port = nodes[0].server.port();
        for node in nodes.iter().skip(1) {
            node.query::<()>(redis::cmd("CLUSTER").arg("MEET").arg("127.0.0.1").arg(port))?;
        }
        let cluster = Self { nodes, masters };
        cluster.wait(Duration::from_secs(20), |c| c.every_node_knows_all())?;
        for r in 0..masters * replicas {
            let replica = &cluster.nodes[masters + r];
            let master = &cluster.nodes[r / replicas];
            replica.query::<()>(redis::cmd("CLUSTER").arg("REPLICATE").arg(&master.id))?;
        }
        cluster.wait(Duration::from_secs(20), |c| c.settled())?;
        Ok(cluster)
    }

    /// Seed addresses: every node's `redis://127.0.0.1:<port>`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.server.url()).collect()
    }

    /// How many masters the cluster was started with.
    pub fn masters(&self) -> usize {
        self.masters
    }

    fn every_node_knows_all(&self) -> Result<bool, String> {
        for node in &self.nodes {
            let known: String = node.query(redis::cmd("CLUSTER").arg("NODES"))?;
            if known.lines().count() < self.nodes.len() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Every live node says the cluster is ok and agrees on who serves each master's slots,
    /// and every live replica is in sync with its master.
    fn settled(&self) -> Result<bool, String> {
        let mut views = Vec::new();
        for node in self.nodes.iter().filter(|n| n.server.is_running()) {
            let info: String = node.query(redis::cmd("CLUSTER").arg("INFO"))?;
            if !info.contains("cluster_state:ok") {
                return Ok(false);
            }
            let replication: String = node.query(redis::cmd("INFO").arg("replication"))?;
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
                return Ok(false);
            }
            views.push(self.owners_seen_by(node)?);
        }
        Ok(views.windows(2).all(|w| w[0] == w[1]))
    }

    /// (first slot, owner port) of every slot range, as `node` sees them.
    fn owners_seen_by(&self, node: &Node) -> Result<Vec<(i64, i64)>, String> {
        let slots: Vec<redis::Value> = node.query(redis::cmd("CLUSTER").arg("SLOTS"))?;
        let mut owners = Vec::new();
        for range in slots {
            if let redis::Value::Array(items) = range
                && let (Some(redis::Value::Int(first)), Some(redis::Value::Array(master))) =
                    (items.first(), items.get(2))
                && let Some(redis::Value::Int(port)) = master.get(1)
            {
                owners.push((*first, *port));
            }
        }
        owners.sort_unstable();
        Ok(owners)
    }

    fn wait(
        &self,
        limit: Duration,
        mut done: impl FnMut(&Self) -> Result<bool, String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            match done(self) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("the cluster did not settle in {limit:?} {last}"))
    }

    /// The index of the node serving `slot` now, as a live master sees it.
    pub fn owner(&self, slot: u16) -> Result<usize, String> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.server.is_running())
            .ok_or("no live node")?;
        self.owner_seen_by(node, slot)
    }

    /// The index of the node serving `slot`, as `node` sees it.
    fn owner_seen_by(&self, node: &Node, slot: u16) -> Result<usize, String> {
        let mut conn = node.conn()?;
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            for range in &fields[8..] {
                let (first, last) = match range.split_once('-') {
                    Some((a, b)) => (a.parse::<u16>(), b.parse::<u16>()),
                    None => (range.parse::<u16>(), range.parse::<u16>()),
                };
                if let (Ok(first), Ok(last)) = (first, last)
                    && (first..=last).contains(&slot)
                {
                    return self
                        .nodes
                        .iter()
                        .position(|n| n.id == fields[0])
                        .ok_or_else(|| format!("unknown node {}", fields[0]));
                }
            }
        }
        Err(format!("no master serves slot {slot}"))
    }

    /// Moves `slot` with its keys to node `to` (a master), as `redis-cli --cluster reshard`
    /// does: importing and migrating marks, `MIGRATE` of its keys in batches, then the new
    /// owner announced to every master. `between` runs once the slot is marked migrating and
    /// before its keys move, for a test to act while the slot is in motion.
    pub fn migrate(&self, slot: u16, to: usize, between: impl FnOnce()) -> Result<(), String> {
        let from = self.owner(slot)?;
        if from == to {
            return Err(format!("slot {slot} is on node {to} already"));
        }
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        target.query::<()>(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&source.id),
        )?;
        source.query::<()>(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&target.id),
        )?;
        between();
        loop {
            let keys: Vec<String> = source.query(
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            )?;
            if keys.is_empty() {
                break;
            }
            source.query::<()>(
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(target.server.port())
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            )?;
        }
        let announce = |node: &Node| {
            node.query::<()>(
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&target.id),
            )
        };
        announce(target)?;
        announce(source)?;
        for node in self.nodes.iter().take(self.masters) {
            if node.server.is_running() {
                announce(node)?;
            }
        }
        self.wait(Duration::from_secs(20), |c| {
            Ok(c.owner(slot)? == to && c.settled()?)
        })
    }

    /// The first slot master `master` serves, as it sees it.
    fn first_slot_of(&self, master: usize) -> Result<u16, String> {
        let slot = self
            .owners_seen_by(&self.nodes[master])?
            .into_iter()
            .find(|(_, port)| *port == i64::from(self.nodes[master].server.port()))
            .map(|(first, _)| first)
            .ok_or("the master serves no slot")?;
        u16::try_from(slot).map_err(|e| e.to_string())
    }

    /// Kills master `master` (SIGKILL) and waits until one of its replicas has taken over its
    /// slots and the cluster is ok again; returns the new master's index and how long the
    /// failover took from the kill.
    pub fn fail_over(&mut self, master: usize) -> Result<(usize, Duration), String> {
        let slot = self.first_slot_of(master)?;
        let started = Instant::now();
        self.nodes[master].server.kill();
        self.wait(Duration::from_secs(30), |c| {
            Ok(c.owner(slot).is_ok_and(|o| o != master) && c.settled()?)
        })?;
        Ok((self.owner(slot)?, started.elapsed()))
    }

    /// Freezes master `master` (SIGSTOP: its connections stay open and say nothing, as a host
    /// that hangs) and waits until one of its replicas has taken over its slots, as the other
    /// nodes see it; returns the new master's index. [`thaw`](Self::thaw) resumes it (it then
    /// learns it was failed over and becomes a replica).
    pub fn fail_over_frozen(&mut self, master: usize) -> Result<usize, String> {
        let slot = self.first_slot_of(master)?;
        self.nodes[master].server.pause();
        let witness = (0..self.nodes.len())
            .find(|i| *i != master)
            .ok_or("no other node")?;
        self.wait(Duration::from_secs(30), |c| {
            Ok(c.owner_seen_by(&c.nodes[witness], slot)
                .is_ok_and(|o| o != master))
        })?;
        self.owner_seen_by(&self.nodes[witness], slot)
    }

    /// Resumes a node frozen by [`fail_over_frozen`](Self::fail_over_frozen).
    pub fn thaw(&self, node: usize) {
        self.nodes[node].server.resume();
    }

    /// Every key matching the glob `pattern` on every live master (`KEYS`: our own small test
    /// clusters only), sorted.
    pub fn keys_matching(&self, pattern: &str) -> Result<Vec<String>, String> {
        let mut all = Vec::new();
        for node in self.nodes.iter().filter(|n| n.server.is_running()) {
            let replication: String = node.query(redis::cmd("INFO").arg("replication"))?;
            if replication.contains("role:master") {
                let keys: Vec<String> = node.query(redis::cmd("KEYS").arg(pattern))?;
                all.extend(keys);
            }
        }
        all.sort();
        Ok(all)
    }

    /// Has node `node` announce `port` (a proxy in front of it) to clients instead of its own,
    /// and waits until every node tells clients so: clients then reach it through the proxy.
    pub fn announce(&self, node: usize, port: u16) -> Result<(), String> {
        let target = &self.nodes[node];
        let bus = u32::from(target.server.port()) + 10000;
        target.query::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-bus-port")
                .arg(bus),
        )?;
        target.query::<()>(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(port),
        )?;
        self.wait(Duration::from_secs(20), |c| {
            for n in c.nodes.iter().filter(|n| n.server.is_running()) {
                let nodes: String = n.query(redis::cmd("CLUSTER").arg("NODES"))?;
                let announced = nodes
                    .lines()
                    .any(|l| l.starts_with(&target.id) && l.contains(&format!(":{port}@")));
                if !announced {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The URL of the master serving `key` now.
    pub fn owner_url(&self, key: &str) -> Result<String, String> {
        Ok(self.nodes[self.owner(slot(key))?].server.url())
    }

    /// Runs `f` with a connection to the master serving `key`.
    pub fn on_owner<T>(
        &self,
        key: &str,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, String> {
        let node = &self.nodes[self.owner(slot(key))?];
        f(&mut node.conn()?).map_err(|e| e.to_string())
    }

    /// `GET key` on the master serving it (a check for tests).
    pub fn get(&self, key: &str) -> Result<Option<String>, String> {
        self.on_owner(key, |c| c.get(key))
    }
}
