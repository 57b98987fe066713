//! One async lock per activity key, created on demand and dropped when no
//! one holds or waits for it.
//!
//! A decision reads, decides and writes an activity while holding its lock,
//! so two reports of one activity never decide from the same stale record.
//! Requests for different activities never wait on each other: the map of
//! locks is sharded and each shard is held only to find or drop an entry,
//! never across an `await`.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::budget::activity::ActivityKey;

const SHARDS: usize = 64;

/// One key's lock, with the key's hash so that the table never hashes a
/// key again (not when it grows, not when the lock is released).
struct Slot {
    hash: u64,
    key: ActivityKey,
    lock: Arc<AsyncMutex<()>>,
}

type Shard = Mutex<HashTable<Slot>>;

/// The table of per-activity locks.
///
/// A key is hashed once per lock, with a randomly seeded hasher (activity
/// ids come from clients): the hash picks the shard and finds the slot, and
/// the guard keeps it to release the lock.
pub(crate) struct KeyLocks {
    shards: Box<[Shard]>,
    hasher: RandomState,
}

impl KeyLocks {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, HashTable<Slot>> {
        // Bits 40 and up pick the shard: the table inside uses the low bits
        // to place a slot and the top seven as its tag.
        let index = (hash >> 40) as usize % SHARDS;
        // A poisoned shard only means another thread panicked while holding
        // it; the table itself is always consistent between statements.
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the lock of `key`; it is held until the guard drops.
    pub(crate) async fn lock(&self, key: &ActivityKey) -> KeyGuard<'_> {
        let (hash, lock) = self.slot(key);
        let guard = lock.lock_owned().await;
        KeyGuard {
            locks: self,
            hash,
            guard: Some(guard),
        }
    }

    /// The hash of `key` and its lock, created if the table has none.
    fn slot(&self, key: &ActivityKey) -> (u64, Arc<AsyncMutex<()>>) {
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shard(hash);
        let lock = match shard.entry(hash, |slot| slot.key == *key, |slot| slot.hash) {
            Entry::Occupied(slot) => Arc::clone(&slot.get().lock),
            Entry::Vacant(vacant) => {
                let lock = Arc::default();
                vacant.insert(Slot {
                    hash,
                    key: key.clone(),
                    lock: Arc::clone(&lock),
                });
                lock
            }
        };
        (hash, lock)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |t| t.len()))
            .sum()
    }
}

/// Holds one activity's lock; removes the lock from the table when it was
/// the last user. It finds its slot by the key's hash and the lock's
/// address, so it does not keep the key: a decision waiting to be durable
/// holds its guard and not the request it came from.
pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    hash: u64,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut shard = self.locks.shard(self.hash);
        let Some(guard) = self.guard.take() else {
            return;
        };
        // The slot is there: it is removed only by the last of its users,
        // under this shard's lock, and this guard was one of them.
        let lock = Arc::as_ptr(OwnedMutexGuard::mutex(&guard));
        drop(guard);
        // With the guard gone, the table holds the only reference unless
        // someone waits for this lock (each waiter holds a clone): then the
        // slot stays for them.
        if let Ok(slot) = shard.find_entry(self.hash, |slot| Arc::as_ptr(&slot.lock) == lock)
            && Arc::strong_count(&slot.get().lock) == 1
        {
            slot.remove();
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

    #[tokio::test]
    async fn the_table_grows_and_empties() {
        let locks = KeyLocks::new();
        let keys: Vec<_> = (0..5000).map(|i| key(&format!("activity-{i}"))).collect();
        let mut guards = Vec::new();
        for k in &keys {
            guards.push(locks.lock(k).await);
        }
        assert_eq!(locks.len(), keys.len());
        // Every key is still found after the shards grew: a second lock of
        // any of them waits.
        for k in keys.iter().step_by(97) {
            let again = tokio::time::timeout(std::time::Duration::from_millis(20), locks.lock(k));
            assert!(again.await.is_err(), "{k:?} was locked twice");
        }
        drop(guards);
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn contended_key_is_held_by_one_task_at_a_time() {
        let locks = Arc::new(KeyLocks::new());
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (locks, inside) = (Arc::clone(&locks), Arc::clone(&inside));
                tokio::spawn(async move {
                    let k = key("hot");
                    for _ in 0..20 {
                        let _g = locks.lock(&k).await;
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
