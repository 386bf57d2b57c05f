//! [`Core`]: what the handles and guards of one client share, instead of the client facade:
//! its settings, its id, the backend, the waiter registry and the background tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use deadpool_redis::Pool;
use tokio::sync::{OwnedMutexGuard, watch};

use crate::backend::{self, Backend};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lease::Tasks;
use crate::lease::cohort::Cohorts;
use crate::notify::Notifier;
use crate::protocol;
use crate::token::OwnerToken;

/// The shared state of one client.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) config: Config,
    /// Names this client in Redis queues: a waiter's place starts with it, so the places of a
    /// client that is gone can be found and removed together.
    pub(crate) id: String,
    pub(crate) backend: Arc<Backend>,
    pub(crate) notifier: Notifier,
    pub(crate) tasks: Tasks,
    /// Waits for carried owner tokens at queued primitives take turns here.
    pub(crate) turns: Turns,
    /// The plain mutexes whose holds pass between this client's tasks (local hand-off).
    pub(crate) cohorts: Cohorts,
    /// Dropping this stops the subscription task.
    _shutdown: watch::Sender<()>,
}

impl Core {
    /// Starts a client's machinery for one server (or the master Sentinel names) on the
    /// current tokio runtime: the subscription, the watchdog and the release queue.
    pub(crate) fn single(config: Config, source: backend::Source) -> Arc<Self> {
        Self::start_infallible(config, |listener, requests, stopped| {
            Backend::single(source, protocol::scripts(), listener, requests, stopped)
        })
    }

    /// Starts a client's machinery for a Redis Cluster on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] if no cluster client can be made from `source`.
    #[cfg(feature = "cluster")]
    pub(crate) fn cluster(config: Config, source: backend::ClusterSource) -> Result<Arc<Self>> {
        Self::start(config, |listener, requests, stopped| {
            Backend::cluster(source, protocol::scripts(), listener, requests, stopped)
        })
    }

    /// Starts a Redlock client's machinery over independent servers (each a pool for requests
    /// and a client for its subscription) on the current tokio runtime, with the Redlock
    /// settings of `config`.
    pub(crate) fn quorum(config: Config, servers: Vec<(Pool, redis::Client)>) -> Arc<Self> {
        let settings = config.redlock.unwrap_or_default();
        Self::start_infallible(config, |listener, requests, stopped| {
            Backend::quorum(
                settings,
                servers,
                protocol::scripts(),
                listener,
                requests,
                stopped,
            )
        })
    }

    /// [`start`](Self::start) with a backend that is made without fail.
    fn start_infallible(
        config: Config,
        backend: impl FnOnce(
            Arc<dyn backend::Listener>,
            backend::Requests,
            watch::Receiver<()>,
        ) -> Backend,
    ) -> Arc<Self> {
        let started = Self::start(config, |listener, requests, stopped| {
            Ok::<_, std::convert::Infallible>(backend(listener, requests, stopped))
        });
        match started {
            Ok(core) => core,
            Err(never) => match never {},
        }
    }

    fn start<E>(
        config: Config,
        backend: impl FnOnce(
            Arc<dyn backend::Listener>,
            backend::Requests,
            watch::Receiver<()>,
        ) -> std::result::Result<Backend, E>,
    ) -> std::result::Result<Arc<Self>, E> {
        let (subscriber, requests) = backend::subscription();
        let notifier = Notifier::new(subscriber);
        let (shutdown, stopped) = watch::channel(());
        let backend = Arc::new(backend(notifier.listener(), requests, stopped)?);
        let tasks = Tasks::spawn(Arc::clone(&backend));
        Ok(Arc::new(Self {
            config,
            id: client_id(),
            backend,
            notifier,
            tasks,
            turns: Turns::default(),
            cohorts: Cohorts::default(),
            _shutdown: shutdown,
        }))
    }
}

/// A new client's id: 16 hex digits (64 random bits) of a new owner token. Two live clients
/// with one id would share their wake-up channels and lose their waiters' places together
/// when either is found gone; at 8 digits that was one chance in ten thousand among a
/// thousand clients, at 16 it is one in some 37 million million.
fn client_id() -> String {
    let mut id = OwnerToken::new().as_field();
    id.truncate(CLIENT_ID_LEN);
    id
}

/// How many hex digits a client's id has.
const CLIENT_ID_LEN: usize = 16;

/// One turn per carried owner and name in a client, while in use: a hand-over names the client
/// and the owner, so two waits of one carried owner in one client could not tell whose it is.
/// They take turns, and the later one re-enters the earlier one's hold.
#[derive(Debug, Default)]
pub(crate) struct Turns(StdMutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl Turns {
    /// Waits, up to `timeout`, for the turn of `key` (a channel and an owner).
    pub(crate) async fn take(
        &self,
        key: String,
        timeout: Option<Duration>,
    ) -> Result<OwnedMutexGuard<()>> {
        let turn = {
            let mut turns = self.0.lock().unwrap_or_else(|p| p.into_inner());
            turns.retain(|_, t| t.strong_count() > 0);
            match turns.get(&key).and_then(Weak::upgrade) {
                Some(turn) => turn,
                None => {
                    let turn = Arc::new(tokio::sync::Mutex::new(()));
                    turns.insert(key, Arc::downgrade(&turn));
                    turn
                }
            }
        };
        match timeout {
            None => Ok(turn.lock_owned().await),
            Some(t) => tokio::time::timeout(t, turn.lock_owned())
                .await
                .map_err(|_| Error::Timeout {
                    waited: t,
                    lease_left: None,
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_client_id_is_sixteen_hex_digits() {
        let (a, b) = (super::client_id(), super::client_id());
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
