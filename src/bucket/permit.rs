//! [`PermitSlot`]: what the layer hands the handler in the request's
//! extensions, holding the token taken for the request, if any.
//!
//! # One permit, however many clones
//! `http::Extensions` needs `Clone`, and a clone must never duplicate a
//! token: every clone shares one slot behind an `Arc`. The slot is spent by
//! the first [`PermitSlot::commit`]; a token still held when the last clone
//! drops goes back to the bucket (and to the tenant's share). So a handler
//! that decides not to retry (a terminal decision, a replay, a dry run, an
//! error) does nothing at all, and the token is not lost.

use std::fmt;
use std::mem;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::fair::{Admission, Grant};
use super::handle::FairBucket;
use crate::budget::token::TokenGate;

/// A request's claim on the retry-token bucket. Clones share one claim.
#[derive(Clone)]
pub struct PermitSlot {
    /// The one claim every clone shares.
    inner: Arc<Slot>,
}

/// The claim itself; returns its token on drop.
struct Slot {
    /// The bucket the token came from and goes back to.
    bucket: FairBucket,
    /// The tenant the request belongs to.
    tenant: Arc<str>,
    /// Held token, none, or spent.
    state: Mutex<State>,
}

enum State {
    /// A token taken for this request, not yet used.
    Held(Grant),
    /// No token was free when the request came in.
    Empty,
    /// Committed: nothing more to do.
    Spent,
}

/// A second commit of one permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the retry permit was already committed")]
pub struct SlotSpentError;

impl PermitSlot {
    /// A slot for `tenant`, holding `grant` if a token was taken.
    pub(super) fn new(bucket: FairBucket, tenant: Arc<str>, grant: Option<Grant>) -> Self {
        let state = grant.map_or(State::Empty, State::Held);
        Self {
            inner: Arc::new(Slot {
                bucket,
                tenant,
                state: Mutex::new(state),
            }),
        }
    }

    /// The tenant the layer read from the request.
    pub fn tenant(&self) -> &str {
        &self.inner.tenant
    }

    /// Whether a token is held, not yet committed.
    pub fn holds_token(&self) -> bool {
        matches!(*self.state(), State::Held(_))
    }

    /// The request is a retry: spend the held token ([`Admission::Granted`]),
    /// or, with none held, take one now or book the tenant's next slot
    /// ([`Admission::Deferred`]), or learn when to ask again
    /// ([`Admission::Refused`]).
    ///
    /// # Errors
    /// [`SlotSpentError`] if the permit was committed before.
    pub fn commit(&self) -> Result<Admission, SlotSpentError> {
        self.commit_within(Duration::MAX)
    }

    /// [`PermitSlot::commit`], but a slot later than `max_wait` from now is
    /// not booked: the answer is [`Admission::Refused`] with reason
    /// [`RESERVATION_PAST_MAX_WAIT`](super::RESERVATION_PAST_MAX_WAIT) and
    /// the wait it would have had. Pass the time left before the activity's
    /// deadline, so a retry that could not start in time books nothing.
    ///
    /// # Errors
    /// [`SlotSpentError`] if the permit was committed before.
    pub fn commit_within(&self, max_wait: Duration) -> Result<Admission, SlotSpentError> {
        let previous = mem::replace(&mut *self.state(), State::Spent);
        match previous {
            State::Held(_) => {
                self.inner.bucket.committed();
                Ok(Admission::Granted)
            }
            State::Empty => Ok(self.inner.bucket.admit_within(&self.inner.tenant, max_wait)),
            State::Spent => Err(SlotSpentError),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is one enum written whole: a poisoned lock holds a
        // consistent value.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The request's permit is the core's gate for its decision. Without one
/// (no token layer installed) every retry is granted.
impl TokenGate for Option<&PermitSlot> {
    fn take(self, max_wait: Duration) -> Admission {
        match self.map(|slot| slot.commit_within(max_wait)) {
            None => Admission::Granted,
            Some(Ok(admission)) => admission,
            // A decision takes its token once; a spent slot would mean a
            // second decision in one request, which the ledger never makes.
            Some(Err(SlotSpentError)) => Admission::Granted,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let State::Held(grant) = mem::replace(state, State::Spent) {
            self.bucket.release(grant);
        }
    }
}

impl fmt::Debug for PermitSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match *self.state() {
            State::Held(_) => "held",
            State::Empty => "empty",
            State::Spent => "spent",
        };
        f.debug_struct("PermitSlot")
            .field("tenant", &self.tenant())
            .field("token", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::BucketConfig;

    fn bucket(burst: u32) -> FairBucket {
        FairBucket::new(&BucketConfig {
            rate: 10.0,
            burst,
            ..BucketConfig::default()
        })
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_token_returned_when_the_last_drops() {
        let b = bucket(1);
        let slot = b.acquire("a");
        let clone = slot.clone();
        assert!(clone.holds_token());
        drop(slot);
        assert_eq!(b.stats().returned, 0, "a clone still holds it");
        drop(clone);
        let stats = b.stats();
        assert_eq!((stats.taken, stats.returned, stats.level), (1, 1, 1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn commit_spends_once() {
        let b = bucket(1);
        let slot = b.acquire("a");
        assert_eq!(slot.clone().commit(), Ok(Admission::Granted));
        assert!(!slot.holds_token());
        assert_eq!(slot.commit(), Err(SlotSpentError));
        drop(slot);
        let stats = b.stats();
        assert_eq!((stats.granted, stats.returned), (1, 0));
        assert_eq!(
            format!("{:?}", b.acquire("a")),
            r#"PermitSlot { tenant: "a", token: "empty" }"#
        );
    }
}
