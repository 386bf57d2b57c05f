//! The backend: how a request reaches Redis. The lowest layer; it knows scripts, connections and
//! the subscription, and nothing of what a lock is.
//!
//! A request is typed ([`Request`]): the protocol layer above says which script it runs with
//! which keys and arguments and how its reply decodes, and the backend carries it to a server
//! and hands back the decoded reply. Today the backend is one server ([`single::Node`]): every
//! script goes over one multiplexed connection, run by SHA with the source as the fallback
//! ([`Script`], [`By`]). The seam is [`Backend::run`] and [`Backend::batch_group`]: a Redis Cluster can
//! route each call by the hash slot of its first key and group batches by slot, and a quorum of
//! independent servers can run a request on each and vote on the decoded replies, without the
//! layers above changing.
//!
//! Wake-ups come from one subscription connection per server, which tells a [`Listener`] (the
//! client's waiter registry) what it hears, and subscribes to what its [`Subscriber`] asks for.

mod script;
mod single;
mod subscription;

use std::sync::Arc;

use deadpool_redis::Pool;
use redis::Value;
use tokio::sync::watch;

pub(crate) use script::{By, Call, Script};
pub(crate) use subscription::{Listener, Requests, Subscriber, channel as subscription};

use crate::error::Result;
use single::Node;

/// A typed request: one script call and the decoding of its reply.
pub(crate) trait Request {
    /// The decoded reply.
    type Reply;
    /// The script call, naming the script `by` hash or source: keys (the first one routes it)
    /// and arguments.
    fn call(&self, by: By) -> Call;
    /// Decodes the raw reply (typed errors for foreign data and unexpected replies).
    fn decode(&self, raw: Value) -> Result<Self::Reply>;
}

/// Where requests go.
#[derive(Debug)]
pub(crate) struct Backend {
    servers: Servers,
}

#[derive(Debug)]
enum Servers {
    /// One server.
    Single(Node),
}

impl Backend {
    /// One server, reached through `pool` for requests (each new connection loading
    /// `scripts`) and through `server` for the subscription, which serves `listener` the
    /// channels `requests` ask for until `shutdown`'s sender is dropped. Must be called inside a
    /// tokio runtime.
    pub(crate) fn single(
        pool: Pool,
        scripts: Vec<&'static Script>,
        server: redis::Client,
        listener: Arc<dyn Listener>,
        requests: Requests,
        shutdown: watch::Receiver<()>,
    ) -> Self {
        subscription::spawn(server, listener, requests, shutdown);
        Self {
            servers: Servers::Single(Node::new(pool, scripts)),
        }
    }

    /// Runs `request` and decodes its reply.
    pub(crate) async fn run<R: Request>(&self, request: &R) -> Result<R::Reply> {
        let raw = match &self.servers {
            Servers::Single(node) => node.invoke(request).await?,
        };
        request.decode(raw)
    }

    /// Which batch an item keyed by `key` may share one script call with: items of one group
    /// may go together. One server takes any keys in one call (one group); a cluster takes the
    /// keys of one hash slot only.
    pub(crate) fn batch_group(&self, _key: &str) -> u16 {
        match &self.servers {
            Servers::Single(_) => 0,
        }
    }
}
