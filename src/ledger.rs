//! The ledger: durable activity budgets, decided one activity at a time and
//! made durable before anyone is told.
//!
//! It joins the pure state machine ([`crate::budget::activity`]), a
//! [`Store`], and the global retry tokens (through the core's [`TokenGate`],
//! so it does not depend on how tokens are handed out). Every operation on an activity
//! runs under that activity's lock: load, decide, settle the token, save
//! (durable), and only then return. A client that received a decision can
//! rely on it surviving a crash.

mod locks;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::budget::activity::{
    self, ActivityKey, ActivityRecord, BudgetError, Defaults, DraftOrReplay, Event, Policy, Report,
    Resolution, Status,
};
use crate::store::{Replaced, Store, StoreError};
use locks::KeyLocks;

/// A ledger operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The request was refused; nothing was written.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The store failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

use crate::budget::token::{Answer, Ask, Observed};
pub use crate::budget::token::{TokenGate, Unlimited};

/// A decision as the caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The recorded event of the decision.
    pub event: Arc<Event>,
    /// The policy that decided (the recorded snapshot).
    pub policy: Policy,
    /// True when the attempt had been decided before and nothing was written.
    pub replayed: bool,
    /// True when the request's policy differs from the recorded one.
    pub policy_conflict: bool,
    /// True when a replayed attempt was reported with another error class
    /// than the one recorded: the recorded decision stands.
    pub class_conflict: bool,
}

/// What `record_success` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuccessOutcome {
    /// The ledger holds no such activity (it never failed): nothing to close.
    Unknown,
    /// The activity was already closed; nothing changed.
    AlreadyClosed,
    /// The activity is now closed as succeeded.
    Closed {
        /// The place in line its deferred attempt held, and the dependency
        /// of that line (`None`: the default one), now given up.
        left_line: Option<(Option<String>, i64)>,
    },
}

/// How many times in a row an operation is decided again after another
/// replica changed its activity first. Each time, the other replica has
/// recorded something, so a long run of losses means a flood of reports of
/// one activity; the caller then gets `store_conflict` and may ask again.
pub const MAX_CONFLICTS: u32 = 8;

/// Whether an operation failed only because another replica changed its
/// activity first: deciding again on what is stored now is then right.
fn lost_race(error: &LedgerError) -> bool {
    matches!(error, LedgerError::Store(StoreError::Conflict { .. }))
}

/// A gate asked at most once however many times a decision is taken again
/// after a lost race: the answer it gave the first time stands, and the
/// failure is counted once. A token taken for a decision that then turns
/// out to be the winner's replay stays spent: a lost race costs its tenant
/// at most one token, erring towards fewer retries, never more.
struct Remembered<G> {
    gate: G,
    answer: Option<Answer>,
    observed: bool,
}

impl<G> Remembered<G> {
    fn new(gate: G) -> Self {
        Self {
            gate,
            answer: None,
            observed: false,
        }
    }
}

impl<G: TokenGate> TokenGate for Remembered<G> {
    fn take(&mut self, ask: &Ask<'_>) -> Answer {
        *self.answer.get_or_insert_with(|| self.gate.take(ask))
    }

    fn observe(&mut self, observed: Observed) {
        if !std::mem::replace(&mut self.observed, true) {
            self.gate.observe(observed);
        }
    }

    fn leave(&mut self, activity_id: &str, waiting_since_ms: i64) {
        self.gate.leave(activity_id, waiting_since_ms);
    }
}

/// A new version of a record, and what it replaces in the store.
type ToSave = (ActivityRecord, Option<Replaced>);

/// Durable activity budgets over a store.
pub struct Ledger<S> {
    store: S,
    locks: KeyLocks,
    /// Replaced whole by a reload (`set_defaults`); each decision reads
    /// one version of it.
    defaults: ArcSwap<Defaults>,
    /// Cancels [`Ledger::released`]'s token when the ledger, hence its
    /// store, is dropped: after the fields above (declaration order).
    released: tokio_util::sync::DropGuard,
}

impl<S: Store> Ledger<S> {
    /// A ledger over `store`, giving new activities without a policy the
    /// defaults' policy.
    pub fn new(store: S, defaults: Defaults) -> Self {
        Self {
            store,
            locks: KeyLocks::new(),
            defaults: ArcSwap::from_pointee(defaults),
            released: tokio_util::sync::CancellationToken::new().drop_guard(),
        }
    }

    /// A token cancelled once this ledger and its store are dropped: whoever
    /// must reopen the same store (a server's caller) waits on it rather
    /// than polling for the last holder.
    pub fn released(&self) -> tokio_util::sync::CancellationToken {
        self.released.token().clone()
    }

    /// The settings that shape decisions.
    pub fn defaults(&self) -> Defaults {
        **self.defaults.load()
    }

    /// New settings for the decisions from now on (a reload); activities
    /// keep the policy recorded on their first report.
    pub fn set_defaults(&self, defaults: Defaults) {
        self.defaults.store(std::sync::Arc::new(defaults));
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides a failure report and makes the decision durable before
    /// returning it: the one route of a durable `NextAction`. Under the
    /// activity's lock: load, decide (the core's draft or replay, the token
    /// asked at most once through `gate`), save, and only then return. A replay
    /// returns the recorded decision and writes nothing; a `dry_run` decides
    /// the same way but takes no token and writes nothing. When another
    /// replica changed the activity first, it decides again on what is
    /// stored now ([`MAX_CONFLICTS`] times at most), with the token's first
    /// answer.
    ///
    /// # Errors
    /// [`LedgerError::Budget`] when the report is refused,
    /// [`LedgerError::Store`] when the store fails (nothing acknowledged).
    pub async fn report(
        &self,
        key: &ActivityKey,
        report: &Report<'_>,
        gate: impl TokenGate,
        now_ms: i64,
        dry_run: bool,
    ) -> Result<Decided, LedgerError> {
        let mut gate = Remembered::new(gate);
        let mut conflicts = 0;
        loop {
            let _guard = self.locks.lock(key).await;
            let previous = self.store.load(key).await?;
            let (decided, save) =
                self.decided_and_to_save(previous, key, report, &mut gate, now_ms, dry_run)?;
            let Some((record, replaces)) = save else {
                return Ok(decided);
            };
            match self.store.save(record, replaces).await {
                Ok(()) => return Ok(decided),
                Err(e) => {
                    let e = LedgerError::from(e);
                    if !(lost_race(&e) && conflicts < MAX_CONFLICTS) {
                        return Err(e);
                    }
                    conflicts += 1;
                }
            }
        }
    }

    /// The decision on a report against the stored record, and the record
    /// to save for it: none for a replay or a dry run.
    fn decided_and_to_save(
        &self,
        previous: Option<ActivityRecord>,
        key: &ActivityKey,
        report: &Report<'_>,
        gate: impl TokenGate,
        now_ms: i64,
        dry_run: bool,
    ) -> Result<(Decided, Option<ToSave>), LedgerError> {
        let replaces = previous.as_ref().map(Replaced::of);
        let defaults = self.defaults();
        let requested = report.policy.map(|p| p.or_defaults(defaults.policy));
        let conflict = |recorded: &Policy| requested.is_some_and(|p| p != *recorded);
        match activity::draft_or_replay(previous, key, report, &defaults, now_ms)? {
            DraftOrReplay::Replay(replay) => Ok((
                Decided {
                    policy_conflict: conflict(&replay.policy),
                    class_conflict: replay.event.class.is_some_and(|c| c != report.class),
                    event: replay.event,
                    policy: replay.policy,
                    replayed: true,
                },
                None,
            )),
            DraftOrReplay::Fresh(mut draft) => {
                if !dry_run {
                    draft.take_token(gate, now_ms);
                }
                let write = !dry_run && draft.needs_write();
                let (record, event) = draft.finish();
                let decided = Decided {
                    policy_conflict: conflict(&record.policy),
                    class_conflict: false,
                    event,
                    policy: record.policy,
                    replayed: false,
                };
                Ok((decided, write.then_some((record, replaces))))
            }
        }
    }

    /// Closes an activity because an attempt succeeded; idempotent.
    ///
    /// # Errors
    /// [`LedgerError::Store`] when the store fails.
    pub async fn record_success(
        &self,
        key: &ActivityKey,
        occurred_at_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<SuccessOutcome, LedgerError> {
        let mut conflicts = 0;
        loop {
            match self.record_success_once(key, occurred_at_ms, now_ms).await {
                Err(e) if lost_race(&e) && conflicts < MAX_CONFLICTS => conflicts += 1,
                done => return done,
            }
        }
    }

    async fn record_success_once(
        &self,
        key: &ActivityKey,
        occurred_at_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<SuccessOutcome, LedgerError> {
        let _guard = self.locks.lock(key).await;
        let Some(previous) = self.store.load(key).await? else {
            return Ok(SuccessOutcome::Unknown);
        };
        let replaces = Replaced::of(&previous);
        let left_line = previous.deferral.and_then(|d| {
            let since = d.waiting_since_ms?;
            let dependency = previous
                .events
                .iter()
                .rev()
                .find(|e| e.kind == crate::budget::activity::EventKind::Decision)
                .and_then(|e| e.dependency.clone());
            Some((dependency, since))
        });
        match activity::record_success(previous, occurred_at_ms, now_ms) {
            None => Ok(SuccessOutcome::AlreadyClosed),
            Some(record) => {
                self.store.save(record, Some(replaces)).await?;
                Ok(SuccessOutcome::Closed { left_line })
            }
        }
    }

    /// Applies a reviewer's resolution to a parked activity.
    ///
    /// # Errors
    /// `activity_not_found`, `activity_not_parked`, or a store failure.
    pub async fn resolve(
        &self,
        key: &ActivityKey,
        resolution: Resolution,
        note: &str,
        now_ms: i64,
    ) -> Result<Status, LedgerError> {
        let mut conflicts = 0;
        loop {
            match self.resolve_once(key, resolution, note, now_ms).await {
                Err(e) if lost_race(&e) && conflicts < MAX_CONFLICTS => conflicts += 1,
                done => return done,
            }
        }
    }

    async fn resolve_once(
        &self,
        key: &ActivityKey,
        resolution: Resolution,
        note: &str,
        now_ms: i64,
    ) -> Result<Status, LedgerError> {
        let _guard = self.locks.lock(key).await;
        let previous = self.load_existing(key).await?;
        let replaces = Replaced::of(&previous);
        let record = activity::resolve(previous, resolution, note, now_ms)?;
        let status = record.status;
        self.store.save(record, Some(replaces)).await?;
        Ok(status)
    }

    /// The activity's record with its whole history.
    ///
    /// # Errors
    /// `activity_not_found`, or a store failure.
    pub async fn get(&self, key: &ActivityKey) -> Result<ActivityRecord, LedgerError> {
        self.load_existing(key).await
    }

    /// Deletes activities purgeable for longer than `retention_ms`, in
    /// batches, and returns how many went.
    ///
    /// # Errors
    /// A store failure.
    pub async fn sweep(&self, now_ms: i64, retention_ms: i64) -> Result<usize, LedgerError> {
        const BATCH: usize = 1000;
        let cutoff = now_ms.saturating_sub(retention_ms);
        let mut total = 0;
        loop {
            let purged = self.store.purge(cutoff, BATCH).await?;
            total += purged;
            if purged < BATCH {
                return Ok(total);
            }
        }
    }

    async fn load_existing(&self, key: &ActivityKey) -> Result<ActivityRecord, LedgerError> {
        self.store.load(key).await?.ok_or_else(|| {
            BudgetError::ActivityNotFound {
                tenant: key.tenant.clone(),
                activity_id: key.activity_id.clone(),
            }
            .into()
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::budget::ErrorClass;
    use crate::store::{EmbeddedStore, EmbeddedStoreOptions};

    const NOW: i64 = 1_700_000_000_000;

    /// A ledger over a redb store in a new temporary directory (kept alive
    /// by the first half), with a policy of 5 attempts in an hour.
    pub(crate) fn ledger() -> (tempfile::TempDir, Arc<Ledger<EmbeddedStore>>) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).unwrap();
        let defaults = Defaults {
            policy: Policy {
                max_attempts: 5,
                deadline_seconds: 3600,
                base: None,
                cap: None,
            },
            max_hint_ms: 600_000,
        };
        (dir, Arc::new(Ledger::new(store, defaults)))
    }

    fn key(id: &str) -> ActivityKey {
        ActivityKey {
            tenant: "t".into(),
            activity_id: id.into(),
        }
    }

    fn failure(attempt: u32) -> Report<'static> {
        Report {
            attempt,
            class: ErrorClass::Transient,
            rule: None,
            hints: None,
            policy: None,
            occurred_at_ms: Some(NOW),
            workflow_id: "wf",
            dependency: "",
        }
    }

    /// The activity's lock is held until the decision is durable: a second
    /// report of the activity waits, and then sees the first one's record.
    #[tokio::test]
    async fn a_second_report_of_an_activity_decides_on_the_firsts_record() {
        let (_dir, ledger) = ledger();
        let a = key("a");
        let (one, two) = (failure(1), failure(2));
        let (first, second) = tokio::join!(
            ledger.report(&a, &one, Unlimited, NOW, false),
            ledger.report(&a, &two, Unlimited, NOW, false),
        );
        assert_eq!(first.unwrap().event.attempt, 1);
        assert_eq!(second.unwrap().event.attempt, 2);
        let record = ledger.get(&a).await.unwrap();
        assert_eq!((record.attempts, record.events.len()), (2, 2));
    }

    /// A replay and a dry run save nothing, and a refused report changes
    /// nothing.
    #[tokio::test]
    async fn a_replay_a_dry_run_and_a_refusal_write_nothing() {
        let (_dir, ledger) = ledger();
        let a = key("a");
        let fresh = ledger
            .report(&a, &failure(1), Unlimited, NOW, false)
            .await
            .unwrap();
        let replay = ledger
            .report(&a, &failure(1), Unlimited, NOW, false)
            .await
            .unwrap();
        assert!(replay.replayed);
        let dry = ledger
            .report(&a, &failure(2), Unlimited, NOW, true)
            .await
            .unwrap();
        assert!(!dry.replayed);
        let refused = ledger.report(&a, &failure(3), Unlimited, NOW, false).await;
        assert!(
            matches!(refused, Err(LedgerError::Budget(_))),
            "attempt 3 after 1"
        );
        let record = ledger.get(&a).await.unwrap();
        assert_eq!(record.attempts, 1);
        assert_eq!(record.events.len(), 1);
        assert_eq!(record.events[0], fresh.event);
    }
}
