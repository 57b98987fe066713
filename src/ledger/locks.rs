//! One async lock per activity key, created on demand and dropped when no
//! one holds or waits for it.
//!
//! A decision reads, decides and writes an activity while holding its lock,
//! so two reports of one activity never decide from the same stale record.
//! Requests for different activities never wait on each other: the map of
//! locks is sharded and each shard is held only to find or drop an entry,
//! never across an `await`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::budget::activity::ActivityKey;

const SHARDS: usize = 64;

type Shard = Mutex<HashMap<ActivityKey, Arc<AsyncMutex<()>>>>;

/// The table of per-activity locks.
pub(crate) struct KeyLocks {
    shards: Box<[Shard]>,
    hasher: RandomState,
}

impl KeyLocks {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(
        &self,
        key: &ActivityKey,
    ) -> MutexGuard<'_, HashMap<ActivityKey, Arc<AsyncMutex<()>>>> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        // A poisoned shard only means another thread panicked while holding
        // it; the map itself is always consistent between statements.
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the lock of `key`; it is held until the guard drops.
    pub(crate) async fn lock<'a>(&'a self, key: &'a ActivityKey) -> KeyGuard<'a> {
        let lock = Arc::clone(self.shard(key).entry(key.clone()).or_default());
        let guard = lock.lock_owned().await;
        KeyGuard {
            locks: self,
            key,
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |m| m.len()))
            .sum()
    }
}

/// Holds one activity's lock; removes the lock from the table when it was
/// the last user.
pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: &'a ActivityKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut shard = self.locks.shard(self.key);
        drop(self.guard.take());
        // Two references left: the map's and the guard's mutex (just
        // released). Anyone else waiting holds a clone, so it stays.
        if shard
            .get(self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            shard.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> ActivityKey {
        ActivityKey {
            tenant: "t".into(),
            activity_id: id.into(),
        }
    }

    #[tokio::test]
    async fn locks_are_dropped_when_released() {
        let locks = KeyLocks::new();
        let (a, b) = (key("a"), key("b"));
        {
            let _ga = locks.lock(&a).await;
            let _gb = locks.lock(&b).await;
            assert_eq!(locks.len(), 2);
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn one_key_serialises_and_another_does_not_wait() {
        let locks = Arc::new(KeyLocks::new());
        let a = key("a");
        let held = locks.lock(&a).await;
        let other = key("b");
        // A different key is free while `a` is held.
        tokio::time::timeout(std::time::Duration::from_secs(1), locks.lock(&other))
            .await
            .expect("another key never waits");
        let waiter = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move {
                let a = key("a");
                let _g = locks.lock(&a).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        waiter.await.unwrap();
        assert_eq!(locks.len(), 0);
    }
}
