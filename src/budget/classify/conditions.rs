//! What a rule requires, and the test of a failure against it. Every
//! condition is a bit set (statuses, codes, network failures, safeties,
//! reaches) built once, with the rule set, so a match on the request path is
//! a few bit tests and allocates nothing.

use super::failure::{Failure, NetworkFailure, Reach, Safety};
use super::grpc;

/// HTTP statuses 0-639 as a bit set: a match is one bit test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StatusSet([u64; 10]);

impl StatusSet {
    pub(super) const EMPTY: Self = Self([0; 10]);

    /// Adds `lo..=hi`; callers keep both within 100-599.
    pub(super) const fn with(mut self, lo: u16, hi: u16) -> Self {
        let mut status = lo;
        while status <= hi {
            self.0[(status / 64) as usize] |= 1 << (status % 64);
            status += 1;
        }
        self
    }

    fn contains(&self, status: u16) -> bool {
        self.0
            .get(usize::from(status / 64))
            .is_some_and(|word| word & (1 << (status % 64)) != 0)
    }
}

/// What a rule requires: each condition that is set must hold (a failure
/// without the signal a condition names does not match it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Conditions {
    pub(super) http: Option<StatusSet>,
    /// One bit per `google.rpc.Code` number.
    pub(super) grpc: Option<u32>,
    /// One bit per [`NetworkFailure`].
    pub(super) network: Option<u16>,
    /// One bit per [`Safety`].
    pub(super) safety: Option<u8>,
    /// One bit per [`Reach`], matched against the effective reach.
    pub(super) reach: Option<u8>,
}

impl Conditions {
    pub(super) const ANY: Self = Self {
        http: None,
        grpc: None,
        network: None,
        safety: None,
        reach: None,
    };

    pub(super) const fn grpc(self, codes: &[u8]) -> Self {
        let mut mask = 0u32;
        let mut i = 0;
        while i < codes.len() {
            mask |= 1 << codes[i];
            i += 1;
        }
        Self {
            grpc: Some(mask),
            ..self
        }
    }

    pub(super) const fn http(self, statuses: StatusSet) -> Self {
        Self {
            http: Some(statuses),
            ..self
        }
    }

    pub(super) const fn any_network(self) -> Self {
        let mut mask = 0u16;
        let mut i = 0;
        while i < NetworkFailure::ALL.len() {
            mask |= NetworkFailure::ALL[i].bit();
            i += 1;
        }
        Self {
            network: Some(mask),
            ..self
        }
    }

    pub(super) const fn safety(self, values: &[Safety]) -> Self {
        let mut mask = 0u8;
        let mut i = 0;
        while i < values.len() {
            mask |= values[i].bit();
            i += 1;
        }
        Self {
            safety: Some(mask),
            ..self
        }
    }

    pub(super) const fn reach(self, values: &[Reach]) -> Self {
        let mut mask = 0u8;
        let mut i = 0;
        while i < values.len() {
            mask |= values[i].bit();
            i += 1;
        }
        Self {
            reach: Some(mask),
            ..self
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        *self == Self::ANY
    }

    pub(super) fn matches(&self, signals: &Signals) -> bool {
        self.http
            .as_ref()
            .is_none_or(|set| signals.http.is_some_and(|s| set.contains(s)))
            && self
                .grpc
                .is_none_or(|mask| signals.grpc.is_some_and(|c| mask & (1 << c) != 0))
            && self
                .network
                .is_none_or(|mask| signals.network.is_some_and(|n| mask & n.bit() != 0))
            && self
                .safety
                .is_none_or(|mask| mask & signals.safety.bit() != 0)
            && self
                .reach
                .is_none_or(|mask| mask & signals.reach.bit() != 0)
    }
}

/// A failure's signals as the rules see them: statuses that are not HTTP
/// dropped, gRPC codes normalised, the reach made effective.
pub(super) struct Signals {
    http: Option<u16>,
    /// Within 0..=16.
    grpc: Option<u8>,
    network: Option<NetworkFailure>,
    safety: Safety,
    reach: Reach,
}

impl Signals {
    pub(super) fn of(failure: &Failure<'_>) -> Self {
        Self {
            http: failure.http_status.filter(|s| (100..=599).contains(s)),
            grpc: failure.grpc_code.map(|code| {
                u8::try_from(code)
                    .ok()
                    .filter(|c| *c <= grpc::MAX)
                    .unwrap_or(grpc::UNKNOWN)
            }),
            network: failure.network,
            safety: failure.safety,
            reach: failure.effective_reach(),
        }
    }
}
