//! What saves changed and redb does not hold yet: the records of the segment
//! being written (the *active* set) and of the one being checkpointed (the
//! *frozen* set), looked up by key on every load and every save.

use std::error::Error;
use std::hash::BuildHasher;
use std::mem;
use std::path::PathBuf;
use std::sync::Arc;

use hashbrown::{HashTable, hash_table};

use crate::budget::activity::{ActivityKey, ActivityRecord};

/// A record saved since the last checkpoint.
#[derive(Debug)]
pub(super) struct Pending {
    /// The newest version, for `load`.
    pub record: Arc<ActivityRecord>,
    /// Its sealed journal entry, whose payload is what redb stores.
    pub entry: Vec<u8>,
    /// When the version redb holds (or will hold after the checkpoint
    /// before this one) becomes purgeable: its place in the purge index.
    pub stored_purge: Option<i64>,
}

/// Records by key, the key read from the record itself: a save sends no
/// separate copy of its tenant and activity id. Keys come from clients, so
/// the hasher is randomly seeded; it is foldhash rather than the standard
/// SipHash because every load and every save looks a key up here.
#[derive(Debug, Default)]
pub(super) struct Records {
    pub table: HashTable<Pending>,
    hasher: foldhash::fast::RandomState,
}

impl Records {
    /// The hash of a key, given as its two strings.
    fn hash(&self, tenant: &str, activity_id: &str) -> u64 {
        key_hash(&self.hasher, tenant, activity_id)
    }

    pub fn get(&self, key: &ActivityKey) -> Option<&Pending> {
        let (tenant, id) = (key.tenant.as_str(), key.activity_id.as_str());
        self.table.find(self.hash(tenant, id), |p| {
            p.record.tenant == tenant && p.record.activity_id == id
        })
    }

    /// Holds `pending` as its record's newest version, and returns the
    /// version it replaced. The newest version keeps the replaced one's
    /// `stored_purge`: redb still holds the version that the first save of
    /// the segment replaced, and that is where its purge time is indexed.
    pub fn upsert(&mut self, mut pending: Pending) -> Option<Pending> {
        let (tenant, id) = (&pending.record.tenant, &pending.record.activity_id);
        let hash = self.hash(tenant, id);
        let hasher = &self.hasher;
        match self.table.entry(
            hash,
            |p| p.record.tenant == *tenant && p.record.activity_id == *id,
            |p| key_hash(hasher, &p.record.tenant, &p.record.activity_id),
        ) {
            hash_table::Entry::Occupied(mut held) => {
                pending.stored_purge = held.get().stored_purge;
                Some(mem::replace(held.get_mut(), pending))
            }
            hash_table::Entry::Vacant(slot) => {
                slot.insert(pending);
                None
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.table.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Pending> {
        self.table.iter_mut()
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }
}

/// The one way a key is hashed, for lookups and when the table grows alike.
fn key_hash(hasher: &foldhash::fast::RandomState, tenant: &str, activity_id: &str) -> u64 {
    hasher.hash_one((tenant, activity_id))
}

/// The records of one journal segment, being checkpointed.
#[derive(Debug)]
pub(super) struct Frozen {
    /// The segment file, retired once its records are in redb.
    pub segment: PathBuf,
    /// Its size: what it adds to the backlog until it is checkpointed.
    pub bytes: u64,
    pub records: Records,
}

/// What saves changed and redb does not hold yet.
#[derive(Debug, Default)]
pub(super) struct Overlay {
    pub active: Records,
    pub frozen: Option<Arc<Frozen>>,
    /// Why the running checkpoint is failing, while it retries.
    pub checkpoint_error: Option<Arc<dyn Error + Send + Sync>>,
    /// The checkpointed segment kept for reuse: set by the checkpoint
    /// thread, taken by the writer when it starts a segment.
    pub spare: Spare,
}

/// Whether the data directory holds a checkpointed segment to recycle
/// ([`journal::SPARE`](crate::store::journal::SPARE)).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spare {
    /// None is kept: the next checkpoint keeps its segment.
    #[default]
    Wanted,
    /// One is kept, for the writer's next segment.
    Ready,
    /// Recycling failed on this file system (one without
    /// `RENAME_NOREPLACE`, say): checkpointed segments are deleted.
    Off,
}

impl Overlay {
    pub fn get(&self, key: &ActivityKey) -> Option<&Pending> {
        self.active
            .get(key)
            .or_else(|| self.frozen.as_ref().and_then(|f| f.records.get(key)))
    }
}
