//! Failure classification: from the raw failure a worker saw (an HTTP
//! status, a gRPC code, a network failure, how safe the operation is to
//! repeat) to the [`ErrorClass`] that decides whether a retry may spend the
//! budget.
//!
//! # Why the service classifies
//! `except Exception` is not a classification: a 429, a connection reset and
//! a bad parameter need different policies, and even among 5xx, creating a
//! payment and a read-only query differ in safety. If every SDK guessed,
//! workers in different languages would disagree; so workers send the raw
//! failure and the service answers with the class and the stable name of
//! the rule that decided it.
//!
//! # Rules
//! An ordered table; the first rule whose conditions all hold wins.
//! Operator overrides ([`RuleSpec`], from the configuration file) come
//! first, then the default policy, which ends with a catch-all
//! ([`NO_SIGNAL_UNKNOWN`]): every failure gets a class and a rule.
//!
//! # Several signals
//! The default table lists every gRPC rule before every HTTP rule, and
//! every HTTP rule before the network rules, so the most specific signal
//! decides: a gRPC code is the application's own status (a gateway maps
//! several codes onto one HTTP status, and a gRPC response travels as HTTP
//! 200), and a status is the server's account of what happened, where a
//! network failure is only the client's view. A signal that is not a
//! failure (gRPC `OK`, HTTP 1xx to 3xx) or not valid (a status outside
//! 100-599) matches no default rule, so the next signal decides.
//!
//! # Cost
//! Classification is on the request path: it allocates nothing and uses no
//! regex. Every condition is a bit test, and a tenant rule one string
//! comparison. Parsing, validation and allocation happen once, in
//! [`RuleSet::new`].
//!
//! The policy and the reasoning behind each row are in
//! `docs/classification.md`.
//!
//! # Layout
//! - `failure`: [`Failure`], the classifier's input, and the vocabulary it
//!   is written in ([`Safety`], [`NetworkFailure`], [`Reach`]).
//! - `defaults`: the default policy, its table and its rules' stable names.
//! - `spec`: [`RuleSpec`], an operator's rule as configured, read from TOML,
//!   and [`RuleError`].
//! - `compile`: a [`RuleSpec`] checked and turned into a rule.
//! - `conditions`: what a rule requires, as bit sets, and the match.
//! - `grpc`: `google.rpc.Code` numbers and names.
//! - this file: [`RuleSet`], the ordered rules, and [`Classification`].

mod compile;
mod conditions;
mod defaults;
mod failure;
#[cfg(test)]
mod fixtures;
pub mod grpc;
mod spec;

use std::borrow::Cow;
use std::collections::HashSet;

use super::action::ErrorClass;
use conditions::{Conditions, Signals};
use defaults::{DEFAULT_RULES, DefaultRule};

pub use defaults::{
    GRPC_ABORTED_TRANSIENT, GRPC_ALREADY_EXISTS_PERMANENT, GRPC_DATA_LOSS_UNKNOWN,
    GRPC_FAILED_PRECONDITION_PERMANENT, GRPC_INVALID_ARGUMENT_PERMANENT,
    GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT, GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN,
    GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT, GRPC_NOT_FOUND_PERMANENT, GRPC_OUT_OF_RANGE_PERMANENT,
    GRPC_PERMISSION_DENIED_PERMANENT, GRPC_RESOURCE_EXHAUSTED_TRANSIENT,
    GRPC_UNAUTHENTICATED_PERMANENT, GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN,
    GRPC_UNAVAILABLE_TRANSIENT, GRPC_UNIMPLEMENTED_PERMANENT, HTTP_4XX_PERMANENT,
    HTTP_5XX_IDEMPOTENT_TRANSIENT, HTTP_5XX_NON_IDEMPOTENT_UNKNOWN, HTTP_5XX_NOT_SENT_TRANSIENT,
    HTTP_408_TRANSIENT, HTTP_425_TRANSIENT, HTTP_429_TRANSIENT, HTTP_501_505_PERMANENT,
    HTTP_503_NON_IDEMPOTENT_UNKNOWN, HTTP_503_TRANSIENT, NETWORK_IDEMPOTENT_TRANSIENT,
    NETWORK_NON_IDEMPOTENT_UNKNOWN, NETWORK_NOT_SENT_TRANSIENT, NO_SIGNAL_UNKNOWN,
};
pub use failure::{Failure, NetworkFailure, Reach, Safety};
pub use spec::{MAX_NAME_BYTES, RuleError, RuleSpec, Selector, SelectorItem};

/// The class a [`RuleSet`] gave a failure, and the rule that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Classification<'r> {
    /// The class that decides the next action.
    pub class: ErrorClass,
    /// The stable name of the rule that matched (a default rule's constant,
    /// or an override's configured name).
    pub rule: &'r str,
}

/// A rule of a [`RuleSet`]: a default row or a validated override.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    name: Cow<'static, str>,
    class: ErrorClass,
    when: Conditions,
    /// Tenants the rule is limited to; empty means every tenant.
    tenants: Vec<String>,
}

impl Rule {
    fn matches(&self, signals: &Signals, tenant: &str) -> bool {
        self.when.matches(signals)
            && (self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant))
    }
}

/// The classifier: operator overrides, then the default policy; the first
/// rule that matches decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    rules: Vec<Rule>,
}

impl Default for RuleSet {
    /// The default policy alone.
    fn default() -> Self {
        Self {
            rules: DEFAULT_RULES.iter().map(DefaultRule::to_rule).collect(),
        }
    }
}

impl RuleSet {
    /// Validates the operator's overrides and places them, in their order,
    /// before the default policy.
    ///
    /// # Errors
    /// The first [`RuleError`] found, naming the rule: an empty, malformed
    /// or repeated name (a default rule's name included), a rule without
    /// conditions, an empty list, a status or range outside 100-599, an
    /// unknown gRPC code, network failure, safety, reach or class.
    pub fn new(overrides: Vec<RuleSpec>) -> Result<Self, RuleError> {
        let mut names: HashSet<String> = HashSet::new();
        let mut rules = Vec::with_capacity(overrides.len() + DEFAULT_RULES.len());
        for (index, spec) in overrides.into_iter().enumerate() {
            let rule = spec.compile(index + 1)?;
            if DEFAULT_RULES.iter().any(|d| d.name == rule.name) {
                return Err(RuleError::ReservedName {
                    name: rule.name.into_owned(),
                });
            }
            if !names.insert(rule.name.to_string()) {
                return Err(RuleError::DuplicateName {
                    name: rule.name.into_owned(),
                });
            }
            rules.push(rule);
        }
        rules.extend(DEFAULT_RULES.iter().map(DefaultRule::to_rule));
        Ok(Self { rules })
    }

    /// Classifies a failure: the class and the stable name of the first
    /// rule that matches. Total: the default policy ends with a catch-all.
    pub fn classify(&self, failure: &Failure<'_>) -> Classification<'_> {
        let signals = Signals::of(failure);
        self.rules
            .iter()
            .find(|rule| rule.matches(&signals, failure.tenant))
            .map_or(
                // Unreachable while the defaults end with their catch-all;
                // the same answer keeps this total without a panic.
                Classification {
                    class: ErrorClass::Unknown,
                    rule: NO_SIGNAL_UNKNOWN,
                },
                |rule| Classification {
                    class: rule.class,
                    rule: &rule.name,
                },
            )
    }

    /// The rules' names in the order they are tried: overrides, then the
    /// default policy.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|rule| &*rule.name)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{Build, any_failure, configured, g, h, n};
    use super::*;
    use ErrorClass::{Permanent, Transient, Unknown};
    use NetworkFailure as N;
    use Safety as S;
    use proptest::prelude::*;

    #[test]
    #[rustfmt::skip]
    fn the_documented_overrides_come_first_are_scoped_and_need_every_condition() {
        let rules = configured();
        let names: Vec<_> = rules.rule_names().take(6).collect();
        assert_eq!(names, [
            "acme_partner_409_transient", "reports_quota_permanent", "search_5xx_transient",
            "tls_permanent", "payments_after_send_manual_review", GRPC_INVALID_ARGUMENT_PERMANENT,
        ]);
        let cases = [
            (Failure { tenant: "acme", ..h(409) }, Transient, "acme_partner_409_transient"),
            (Failure { tenant: "other", ..h(409) }, Permanent, HTTP_4XX_PERMANENT),
            (Failure { tenant: "reports-eu", ..g(8) }, Permanent, "reports_quota_permanent"),
            (Failure { tenant: "reports-eu", ..h(429) }, Transient, HTTP_429_TRANSIENT),
            (Failure { tenant: "search", ..h(503) }, Transient, "search_5xx_transient"),
            (Failure { tenant: "search", ..h(501) }, Permanent, HTTP_501_505_PERMANENT),
            (Failure { tenant: "search", ..h(502).s(S::NonIdempotent) }, Unknown, HTTP_5XX_NON_IDEMPOTENT_UNKNOWN),
            (n(N::Tls).s(S::ReadOnly), Permanent, "tls_permanent"),
            (Failure { tenant: "payments", ..g(4).s(S::Idempotent).n(N::Timeout) }, Unknown, "payments_after_send_manual_review"),
            (Failure { tenant: "payments", ..g(14).s(S::Idempotent).r(Reach::MayHaveReached) }, Unknown, "payments_after_send_manual_review"),
            (Failure { tenant: "payments", ..g(14).s(S::Idempotent) }, Transient, GRPC_UNAVAILABLE_TRANSIENT),
            (Failure { tenant: "payments", ..g(13).s(S::Idempotent).n(N::Timeout) }, Transient, GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT),
        ];
        for (failure, class, rule) in cases {
            let got = rules.classify(&failure);
            assert_eq!((got.class, got.rule), (class, rule), "{failure:?}");
        }
    }

    proptest! {
        #[test]
        fn every_failure_gets_a_class_and_a_known_rule(
            (http_status, grpc_code, network, safety, reached, tenant) in any_failure()
        ) {
            let failure = Failure { http_status, grpc_code, network, safety, reached, tenant: &tenant };
            for rules in [RuleSet::default(), configured()] {
                let got = rules.classify(&failure);
                prop_assert!(rules.rule_names().any(|name| name == got.rule));
                prop_assert_eq!(got, rules.classify(&failure));
            }
        }
    }
}
