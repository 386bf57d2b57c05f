//! The primitives: one file per handle, and the guards in files of their own. Each handle wraps
//! the acquisition [`Engine`](crate::acquire::Engine) of its name and turns what it grants into
//! its guard; the guards wrap a [`Held`](crate::lease::Held).

mod election;
mod fair;
mod guard;
mod mutex;
mod permit;
mod rwlock;
mod semaphore;

pub use election::{Election, Leader, LeaderStream, Leadership, MAX_LEADER_VALUE};
pub use fair::FairMutex;
pub use guard::MutexGuard;
pub use mutex::Mutex;
pub use permit::SemaphorePermit;
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::Semaphore;
