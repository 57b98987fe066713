//! The filter of stored keys: a first report (an activity the store has
//! never seen, the commonest load) is answered without a lookup in redb,
//! whose pages are mostly cold for a key that is not there (about 4 us of a
//! request worker a first report in the durable benchmark, where the filter
//! bought 7 to 9% more decisions a second: BENCHMARKS.md).
//!
//! It is a Bloom filter of every key redb holds. It may say "maybe" for a
//! key that is not stored (about 1 in 100 absent keys, and purged keys until
//! the next build): that load looks redb up as it would without a filter.
//! It must never say "no" for a stored key, which would start that
//! activity's attempt count again. These rules keep it so:
//!
//! - A key enters redb only from the overlay: a checkpoint writes the
//!   overlay's records, and recovery runs before any filter exists. The
//!   writer adds each key to the filter, and to the one being built, under
//!   the overlay's lock, as it puts the record in the overlay.
//! - A build publishes its filter as `building` and adds every key the
//!   overlay holds, under that lock; only then does it open the read
//!   transaction it scans. A key that redb holds later was in that
//!   snapshot, or in the overlay then, or was put there since: all three
//!   are in the new filter.
//! - Until the first build after opening completes there is no filter, and
//!   every load that misses the overlay looks redb up.
//! - Purges remove no key: a purged key costs a lookup until the next build.
//!
//! A filter is sized for twice the keys it starts with, and at least
//! [`RedbStoreOptions::key_filter_min`](super::RedbStoreOptions::key_filter_min);
//! once that many new keys are in it, the writer starts another build, which
//! also leaves out the keys purged since.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use fastbloom::AtomicBloomFilter;
use redb::{ReadableTable, ReadableTableMetadata};

use super::{Records, Shared};
use crate::budget::activity::ActivityKey;

/// The share of absent keys a filter lets through to a lookup, at its
/// capacity: 9.6 bits a key, 1.2 MB a million keys.
const FALSE_POSITIVES: f64 = 0.01;

/// How many keys a build scans between two looks at whether the store is
/// closing (and two yields of the core).
const SCAN_STRIDE: usize = 4096;

/// One Bloom filter of stored keys, sized when built.
pub(super) struct KeyFilter {
    bloom: AtomicBloomFilter<foldhash::fast::RandomState>,
    /// Keys it was sized for.
    capacity: usize,
    /// Keys added that it did not hold yet (an activity saved again is not
    /// counted again).
    added: AtomicUsize,
}

impl KeyFilter {
    fn new(capacity: usize) -> Self {
        Self {
            bloom: AtomicBloomFilter::with_false_pos(FALSE_POSITIVES)
                .hasher(foldhash::fast::RandomState::default())
                .expected_items(capacity),
            capacity,
            added: AtomicUsize::new(0),
        }
    }

    pub(super) fn insert(&self, tenant: &str, activity_id: &str) {
        if !self.bloom.insert(&(tenant, activity_id)) {
            self.added.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether redb may hold `key`; `false` only if it certainly does not.
    pub(super) fn may_hold(&self, key: &ActivityKey) -> bool {
        self.bloom
            .contains(&(key.tenant.as_str(), key.activity_id.as_str()))
    }

    /// Whether as many keys are in as it was sized for: time for a new one.
    pub(super) fn full(&self) -> bool {
        self.added.load(Ordering::Relaxed) >= self.capacity
    }

    fn insert_all(&self, records: &Records) {
        for pending in records.iter() {
            self.insert(&pending.record.tenant, &pending.record.activity_id);
        }
    }
}

/// The overlay's filters.
#[derive(Default)]
pub(super) struct Filters {
    /// Answers loads that miss the overlay; `None` until the first build
    /// completes (and when filters are off or a build failed).
    pub current: Option<Arc<KeyFilter>>,
    /// The filter a build is filling: saves go into both.
    pub building: Option<Arc<KeyFilter>>,
}

impl Filters {
    /// Adds a key being put into the overlay (the caller holds its lock).
    pub(super) fn insert(&self, tenant: &str, activity_id: &str) {
        for filter in [&self.current, &self.building].into_iter().flatten() {
            filter.insert(tenant, activity_id);
        }
    }

    /// Whether redb may hold `key`: always, without a filter.
    pub(super) fn may_hold(&self, key: &ActivityKey) -> bool {
        self.current.as_ref().is_none_or(|f| f.may_hold(key))
    }

    /// Whether the current filter is full and no build runs.
    pub(super) fn due(&self) -> bool {
        self.building.is_none() && self.current.as_ref().is_some_and(|f| f.full())
    }
}

impl std::fmt::Debug for Filters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filters")
            .field("current", &self.current.as_ref().map(|c| c.capacity))
            .field("building", &self.building.as_ref().map(|b| b.capacity))
            .finish()
    }
}

/// Builds a filter of every key the store holds and makes it the current
/// one; gives up, leaving the current one, if `closing` is set meanwhile.
/// On error the store runs on without a filter (every load that misses the
/// overlay looks redb up).
pub(super) fn build(shared: &Shared, min: usize, closing: &AtomicBool) {
    let started = Instant::now();
    match fill(shared, min, closing) {
        Ok(Some(filter)) => {
            let mut overlay = shared.overlay();
            overlay.filters.current = overlay.filters.building.take();
            drop(overlay);
            shared
                .stats
                .key_filter_builds
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                keys = filter.added.load(Ordering::Relaxed),
                capacity = filter.capacity,
                ms = started.elapsed().as_millis() as u64,
                "filter of stored keys built"
            );
        }
        Ok(None) => shared.overlay().filters.building = None,
        Err(error) => {
            tracing::error!(%error, "cannot build the filter of stored keys; every first report looks the store up");
            let mut overlay = shared.overlay();
            overlay.filters = Filters::default();
        }
    }
}

/// Publishes a new filter as `building`, seeds it with the overlay's keys,
/// then scans redb into it. `None` when the store closed meanwhile.
fn fill(
    shared: &Shared,
    min: usize,
    closing: &AtomicBool,
) -> Result<Option<Arc<KeyFilter>>, redb::Error> {
    let stored = shared.snapshot().len()? as usize;
    let held = {
        let overlay = shared.overlay();
        overlay.active.len() + overlay.frozen.as_ref().map_or(0, |f| f.records.len())
    };
    // Allocated before the lock is taken again: a few MB for millions.
    let filter = Arc::new(KeyFilter::new(
        stored.saturating_add(held).saturating_mul(2).max(min),
    ));
    {
        let mut overlay = shared.overlay();
        filter.insert_all(&overlay.active);
        if let Some(frozen) = &overlay.frozen {
            filter.insert_all(&frozen.records);
        }
        overlay.filters.building = Some(Arc::clone(&filter));
    }
    // Opened only now, after the seeding (see the module's rules).
    let table = super::snapshot(&shared.db)?;
    for (n, entry) in table.iter()?.enumerate() {
        let (key, _) = entry?;
        let (tenant, activity_id) = key.value();
        filter.insert(tenant, activity_id);
        if n % SCAN_STRIDE == SCAN_STRIDE - 1 {
            if closing.load(Ordering::Relaxed) {
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }
    Ok(Some(filter))
}
