//! Static checks that every handle, guard and future a user holds is `Send` (and `Sync` where
//! it should be), as tokio's `tests/async_send_sync.rs` does. The test is that this file
//! compiles; nothing here runs.
#![allow(dead_code, clippy::too_many_arguments, clippy::type_complexity)]

use std::time::Duration;

use redlatch::{
    Error, FairMutex, ForceUnlocked, HoldView, LockClient, LockClientBuilder, Lost, Mutex,
    MutexGuard, OwnerToken, RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore, SemaphorePermit,
    Snapshot,
};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>(_: &T) {}
fn is_static<T: 'static>(_: &T) {}

/// Values a user keeps: across tasks, in shared state, for as long as they like.
fn values(
    client: LockClient,
    builder: LockClientBuilder,
    mutex: Mutex,
    fair: FairMutex,
    semaphore: Semaphore,
    rwlock: RwLock,
    guard: MutexGuard,
    permit: SemaphorePermit,
    reader: RwLockReadGuard,
    writer: RwLockWriteGuard,
    view: HoldView,
    lost: Lost,
    owner: OwnerToken,
    error: Error,
    snapshot: Snapshot,
    removed: ForceUnlocked,
) {
    send_sync(&client);
    send(&builder);
    send_sync(&mutex);
    send_sync(&fair);
    send_sync(&semaphore);
    send_sync(&rwlock);
    send_sync(&guard);
    send_sync(&permit);
    send_sync(&reader);
    send_sync(&writer);
    send_sync(&view);
    send(&lost);
    send_sync(&owner);
    send_sync(&error);
    send_sync(&snapshot);
    send_sync(&removed);
    is_static(&guard);
    is_static(&permit);
    is_static(&reader);
    is_static(&writer);
    is_static(&lost);
}

/// Every future of the API can be spawned on a multi-threaded runtime.
fn futures(
    client: &LockClient,
    mutex: &Mutex,
    fair: &FairMutex,
    semaphore: &Semaphore,
    rwlock: &RwLock,
    guard: MutexGuard,
    permit: SemaphorePermit,
    reader: RwLockReadGuard,
    writer: RwLockWriteGuard,
    owner: &OwnerToken,
) {
    let d = Duration::from_secs(1);
    send(&client.inspect("a"));
    send(&client.force_unlock("a"));
    send(&mutex.lock());
    send(&mutex.lock_timeout(d));
    send(&mutex.try_lock());
    send(&mutex.lock_as(owner));
    send(&mutex.lock_as_timeout(owner, d));
    send(&mutex.try_lock_as(owner));
    send(&fair.lock());
    send(&fair.lock_timeout(d));
    send(&fair.try_lock());
    send(&fair.lock_as(owner));
    send(&fair.lock_as_timeout(owner, d));
    send(&fair.try_lock_as(owner));
    send(&semaphore.acquire());
    send(&semaphore.acquire_many(2));
    send(&semaphore.acquire_timeout(d));
    send(&semaphore.acquire_many_timeout(2, d));
    send(&semaphore.try_acquire());
    send(&semaphore.try_acquire_many(2));
    send(&semaphore.available_permits());
    send(&rwlock.read());
    send(&rwlock.read_timeout(d));
    send(&rwlock.try_read());
    send(&rwlock.read_as(owner));
    send(&rwlock.read_as_timeout(owner, d));
    send(&rwlock.try_read_as(owner));
    send(&rwlock.write());
    send(&rwlock.write_timeout(d));
    send(&rwlock.try_write());
    send(&rwlock.write_as(owner));
    send(&rwlock.write_as_timeout(owner, d));
    send(&rwlock.try_write_as(owner));
    send(&guard.extend(d));
    send(&guard.reenter());
    send(&guard.lost());
    send(&permit.extend(d));
    send(&reader.extend(d));
    send(&reader.reenter());
    send(&writer.extend(d));
    send(&writer.reenter());
    send(&writer.read());
    send(&guard.unlock());
    send(&permit.release());
    send(&reader.unlock());
    send(&writer.unlock());
}

#[cfg(feature = "tower")]
mod layer {
    use std::convert::Infallible;

    use http::{Request, Response};
    use redlatch::layer::{
        BoxError, FixedName, HoldBody, HoldService, LayerError, LockLayer, PermitLayer,
        RequestHold, ResponseFuture,
    };
    use tower::Service;

    use super::{send, send_sync};

    type Handler = tower::util::ServiceFn<
        fn(Request<String>) -> std::future::Ready<Result<Response<String>, Infallible>>,
    >;

    fn layers(
        lock: LockLayer<fn(&Request<String>) -> Option<String>>,
        permit: PermitLayer<FixedName>,
        mut service: HoldService<Handler, FixedName>,
        future: ResponseFuture<Result<Response<HoldBody<String>>, BoxError>>,
        body: HoldBody<String>,
        hold: RequestHold,
        error: LayerError,
    ) {
        send_sync(&lock);
        send_sync(&permit);
        send(&service);
        send(&service.call(Request::new(String::new())));
        send(&future);
        send(&body);
        send_sync(&hold);
        send_sync(&error);
    }
}
