//! The default policy: the stable names of its rules and the table itself,
//! one row a line, in the order the rules are tried. Kept apart from the
//! matcher so the policy reads like the table in `docs/classification.md`,
//! which gives the reasoning row by row; the tests below pin every row.

use std::borrow::Cow;

use super::Rule;
use super::conditions::{Conditions, StatusSet};
use super::failure::{Reach, Safety};
use super::grpc;
use crate::budget::action::ErrorClass;

// Rule names of the default policy, in table order. Stable: they are
// returned to clients and recorded in events.

/// gRPC `INVALID_ARGUMENT`: permanent.
pub const GRPC_INVALID_ARGUMENT_PERMANENT: &str = "grpc_invalid_argument_permanent";
/// gRPC `NOT_FOUND`: permanent.
pub const GRPC_NOT_FOUND_PERMANENT: &str = "grpc_not_found_permanent";
/// gRPC `ALREADY_EXISTS`: permanent.
pub const GRPC_ALREADY_EXISTS_PERMANENT: &str = "grpc_already_exists_permanent";
/// gRPC `PERMISSION_DENIED`: permanent.
pub const GRPC_PERMISSION_DENIED_PERMANENT: &str = "grpc_permission_denied_permanent";
/// gRPC `UNAUTHENTICATED`: permanent.
pub const GRPC_UNAUTHENTICATED_PERMANENT: &str = "grpc_unauthenticated_permanent";
/// gRPC `FAILED_PRECONDITION`: permanent.
pub const GRPC_FAILED_PRECONDITION_PERMANENT: &str = "grpc_failed_precondition_permanent";
/// gRPC `OUT_OF_RANGE`: permanent.
pub const GRPC_OUT_OF_RANGE_PERMANENT: &str = "grpc_out_of_range_permanent";
/// gRPC `UNIMPLEMENTED`: permanent.
pub const GRPC_UNIMPLEMENTED_PERMANENT: &str = "grpc_unimplemented_permanent";
/// gRPC `DATA_LOSS`: unknown, whatever the safety.
pub const GRPC_DATA_LOSS_UNKNOWN: &str = "grpc_data_loss_unknown";
/// gRPC `UNAVAILABLE` after the request may have reached the server, for
/// work that is not idempotent: unknown.
pub const GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN: &str = "grpc_unavailable_non_idempotent_unknown";
/// gRPC `UNAVAILABLE` otherwise: transient.
pub const GRPC_UNAVAILABLE_TRANSIENT: &str = "grpc_unavailable_transient";
/// gRPC `RESOURCE_EXHAUSTED`: transient.
pub const GRPC_RESOURCE_EXHAUSTED_TRANSIENT: &str = "grpc_resource_exhausted_transient";
/// gRPC `ABORTED`: transient.
pub const GRPC_ABORTED_TRANSIENT: &str = "grpc_aborted_transient";
/// gRPC `CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `INTERNAL` for
/// read-only or idempotent work: transient.
pub const GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT: &str =
    "grpc_maybe_executed_idempotent_transient";
/// The same codes when the request was not sent: transient.
pub const GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT: &str = "grpc_maybe_executed_not_sent_transient";
/// The same codes for non-idempotent or unspecified work: unknown.
pub const GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN: &str =
    "grpc_maybe_executed_non_idempotent_unknown";
/// HTTP 408 Request Timeout: transient.
pub const HTTP_408_TRANSIENT: &str = "http_408_transient";
/// HTTP 425 Too Early: transient.
pub const HTTP_425_TRANSIENT: &str = "http_425_transient";
/// HTTP 429 Too Many Requests: transient.
pub const HTTP_429_TRANSIENT: &str = "http_429_transient";
/// Any other 4xx (validation, auth, not found...): permanent.
pub const HTTP_4XX_PERMANENT: &str = "http_4xx_permanent";
/// HTTP 503 after the request may have reached the server, for work that
/// is not idempotent: unknown.
pub const HTTP_503_NON_IDEMPOTENT_UNKNOWN: &str = "http_503_non_idempotent_unknown";
/// HTTP 503 Service Unavailable otherwise: transient.
pub const HTTP_503_TRANSIENT: &str = "http_503_transient";
/// HTTP 501 Not Implemented and 505 HTTP Version Not Supported: permanent.
pub const HTTP_501_505_PERMANENT: &str = "http_501_505_permanent";
/// Any other 5xx (500, 502, 504...) for read-only or idempotent work:
/// transient.
pub const HTTP_5XX_IDEMPOTENT_TRANSIENT: &str = "http_5xx_idempotent_transient";
/// Any other 5xx when the request was not sent: transient.
pub const HTTP_5XX_NOT_SENT_TRANSIENT: &str = "http_5xx_not_sent_transient";
/// Any other 5xx for non-idempotent or unspecified work: unknown.
pub const HTTP_5XX_NON_IDEMPOTENT_UNKNOWN: &str = "http_5xx_non_idempotent_unknown";
/// A network failure before the request left: transient.
pub const NETWORK_NOT_SENT_TRANSIENT: &str = "network_not_sent_transient";
/// A network failure after it may have left, for read-only or idempotent
/// work: transient.
pub const NETWORK_IDEMPOTENT_TRANSIENT: &str = "network_idempotent_transient";
/// A network failure after it may have left, for non-idempotent or
/// unspecified work: unknown.
pub const NETWORK_NON_IDEMPOTENT_UNKNOWN: &str = "network_non_idempotent_unknown";
/// No failure signal at all: unknown (the catch-all, last rule).
pub const NO_SIGNAL_UNKNOWN: &str = "no_signal_unknown";

const IDEMPOTENT: &[Safety] = &[Safety::ReadOnly, Safety::Idempotent];
const NOT_IDEMPOTENT: &[Safety] = &[Safety::Unspecified, Safety::NonIdempotent];
const MAYBE_EXECUTED: &[u8] = &[
    grpc::CANCELLED,
    grpc::UNKNOWN,
    grpc::DEADLINE_EXCEEDED,
    grpc::INTERNAL,
];

/// The default policy, in order; the last rule matches everything. One
/// row a line, like the table in `docs/classification.md`.
#[rustfmt::skip]
pub(super) const DEFAULT_RULES: [DefaultRule; 30] = {
    use ErrorClass::{Permanent, Transient, Unknown};
    const fn row(name: &'static str, class: ErrorClass, when: Conditions) -> DefaultRule {
        DefaultRule { name, class, when }
    }
    const fn grpc(codes: &[u8]) -> Conditions {
        Conditions::ANY.grpc(codes)
    }
    const fn http(lo: u16, hi: u16) -> Conditions {
        Conditions::ANY.http(StatusSet::EMPTY.with(lo, hi))
    }
    let network = Conditions::ANY.any_network();
    let sent = &[Reach::MayHaveReached];
    let not_sent = &[Reach::NotSent];
    [
        row(GRPC_INVALID_ARGUMENT_PERMANENT, Permanent, grpc(&[grpc::INVALID_ARGUMENT])),
        row(GRPC_NOT_FOUND_PERMANENT, Permanent, grpc(&[grpc::NOT_FOUND])),
        row(GRPC_ALREADY_EXISTS_PERMANENT, Permanent, grpc(&[grpc::ALREADY_EXISTS])),
        row(GRPC_PERMISSION_DENIED_PERMANENT, Permanent, grpc(&[grpc::PERMISSION_DENIED])),
        row(GRPC_UNAUTHENTICATED_PERMANENT, Permanent, grpc(&[grpc::UNAUTHENTICATED])),
        row(GRPC_FAILED_PRECONDITION_PERMANENT, Permanent, grpc(&[grpc::FAILED_PRECONDITION])),
        row(GRPC_OUT_OF_RANGE_PERMANENT, Permanent, grpc(&[grpc::OUT_OF_RANGE])),
        row(GRPC_UNIMPLEMENTED_PERMANENT, Permanent, grpc(&[grpc::UNIMPLEMENTED])),
        row(GRPC_DATA_LOSS_UNKNOWN, Unknown, grpc(&[grpc::DATA_LOSS])),
        row(GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN, Unknown, grpc(&[grpc::UNAVAILABLE]).reach(sent).safety(NOT_IDEMPOTENT)),
        row(GRPC_UNAVAILABLE_TRANSIENT, Transient, grpc(&[grpc::UNAVAILABLE])),
        row(GRPC_RESOURCE_EXHAUSTED_TRANSIENT, Transient, grpc(&[grpc::RESOURCE_EXHAUSTED])),
        row(GRPC_ABORTED_TRANSIENT, Transient, grpc(&[grpc::ABORTED])),
        row(GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT, Transient, grpc(MAYBE_EXECUTED).safety(IDEMPOTENT)),
        row(GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT, Transient, grpc(MAYBE_EXECUTED).reach(not_sent)),
        row(GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN, Unknown, grpc(MAYBE_EXECUTED).safety(NOT_IDEMPOTENT)),
        row(HTTP_408_TRANSIENT, Transient, http(408, 408)),
        row(HTTP_425_TRANSIENT, Transient, http(425, 425)),
        row(HTTP_429_TRANSIENT, Transient, http(429, 429)),
        row(HTTP_4XX_PERMANENT, Permanent, http(400, 499)),
        row(HTTP_503_NON_IDEMPOTENT_UNKNOWN, Unknown, http(503, 503).reach(sent).safety(NOT_IDEMPOTENT)),
        row(HTTP_503_TRANSIENT, Transient, http(503, 503)),
        row(HTTP_501_505_PERMANENT, Permanent, Conditions::ANY.http(StatusSet::EMPTY.with(501, 501).with(505, 505))),
        row(HTTP_5XX_IDEMPOTENT_TRANSIENT, Transient, http(500, 599).safety(IDEMPOTENT)),
        row(HTTP_5XX_NOT_SENT_TRANSIENT, Transient, http(500, 599).reach(not_sent)),
        row(HTTP_5XX_NON_IDEMPOTENT_UNKNOWN, Unknown, http(500, 599).safety(NOT_IDEMPOTENT)),
        row(NETWORK_NOT_SENT_TRANSIENT, Transient, network.reach(not_sent)),
        row(NETWORK_IDEMPOTENT_TRANSIENT, Transient, network.safety(IDEMPOTENT)),
        row(NETWORK_NON_IDEMPOTENT_UNKNOWN, Unknown, network.safety(NOT_IDEMPOTENT)),
        row(NO_SIGNAL_UNKNOWN, Unknown, Conditions::ANY),
    ]
};

/// One row of the default policy.
pub(super) struct DefaultRule {
    pub(super) name: &'static str,
    pub(super) class: ErrorClass,
    when: Conditions,
}

impl DefaultRule {
    pub(super) fn to_rule(&self) -> Rule {
        Rule {
            name: Cow::Borrowed(self.name),
            class: self.class,
            when: self.when,
            tenants: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::RuleSet;
    use super::super::failure::{Failure, NetworkFailure};
    use super::super::fixtures::{Build, any_failure, g, h, n};
    use super::*;
    use ErrorClass::{Permanent, Transient, Unknown};
    use NetworkFailure as N;
    use Safety as S;
    use proptest::prelude::*;

    const NONE: Failure<'static> = Failure {
        http_status: None,
        grpc_code: None,
        network: None,
        safety: Safety::Unspecified,
        reached: Reach::Unknown,
        tenant: "",
    };

    /// Every row of the default policy, with failures that reach it.
    #[rustfmt::skip]
    fn default_table() -> Vec<(Failure<'static>, ErrorClass, &'static str)> {
        let mut rows = vec![
            (g(3).s(S::ReadOnly), Permanent, GRPC_INVALID_ARGUMENT_PERMANENT),
            (g(5), Permanent, GRPC_NOT_FOUND_PERMANENT),
            (g(6).s(S::Idempotent), Permanent, GRPC_ALREADY_EXISTS_PERMANENT),
            (g(7), Permanent, GRPC_PERMISSION_DENIED_PERMANENT),
            (g(16), Permanent, GRPC_UNAUTHENTICATED_PERMANENT),
            (g(9), Permanent, GRPC_FAILED_PRECONDITION_PERMANENT),
            (g(11), Permanent, GRPC_OUT_OF_RANGE_PERMANENT),
            (g(12).r(Reach::NotSent), Permanent, GRPC_UNIMPLEMENTED_PERMANENT),
            (g(15).s(S::ReadOnly), Unknown, GRPC_DATA_LOSS_UNKNOWN),
            (g(15).r(Reach::NotSent), Unknown, GRPC_DATA_LOSS_UNKNOWN),
            (g(14).s(S::NonIdempotent).n(N::ConnectionReset), Unknown, GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN),
            (g(14).r(Reach::MayHaveReached), Unknown, GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN),
            (g(14).s(S::NonIdempotent), Transient, GRPC_UNAVAILABLE_TRANSIENT),
            (g(14).s(S::Idempotent).n(N::Timeout), Transient, GRPC_UNAVAILABLE_TRANSIENT),
            (g(14).s(S::NonIdempotent).n(N::ConnectionRefused), Transient, GRPC_UNAVAILABLE_TRANSIENT),
            (g(8).s(S::NonIdempotent).n(N::Timeout), Transient, GRPC_RESOURCE_EXHAUSTED_TRANSIENT),
            (g(10).s(S::NonIdempotent).n(N::Timeout), Transient, GRPC_ABORTED_TRANSIENT),
            (h(408).s(S::NonIdempotent), Transient, HTTP_408_TRANSIENT),
            (h(425).s(S::NonIdempotent), Transient, HTTP_425_TRANSIENT),
            (h(429).s(S::NonIdempotent).n(N::ConnectionReset), Transient, HTTP_429_TRANSIENT),
            (h(503).s(S::NonIdempotent).n(N::Timeout), Unknown, HTTP_503_NON_IDEMPOTENT_UNKNOWN),
            (h(503).r(Reach::MayHaveReached), Unknown, HTTP_503_NON_IDEMPOTENT_UNKNOWN),
            (h(503).s(S::NonIdempotent), Transient, HTTP_503_TRANSIENT),
            (h(503).s(S::ReadOnly).n(N::ConnectionReset), Transient, HTTP_503_TRANSIENT),
            (h(501).s(S::ReadOnly), Permanent, HTTP_501_505_PERMANENT),
            (h(505).s(S::Idempotent), Permanent, HTTP_501_505_PERMANENT),
            (n(N::Other), Unknown, NETWORK_NON_IDEMPOTENT_UNKNOWN),
            (n(N::Other).r(Reach::NotSent), Transient, NETWORK_NOT_SENT_TRANSIENT),
            // The worker's answer beats what the kind implies.
            (n(N::ConnectionRefused).s(S::NonIdempotent).r(Reach::MayHaveReached), Unknown, NETWORK_NON_IDEMPOTENT_UNKNOWN),
            (n(N::Timeout).s(S::NonIdempotent).r(Reach::NotSent), Transient, NETWORK_NOT_SENT_TRANSIENT),
            (NONE, Unknown, NO_SIGNAL_UNKNOWN),
            (NONE.s(S::ReadOnly), Unknown, NO_SIGNAL_UNKNOWN),
            (NONE.r(Reach::NotSent), Unknown, NO_SIGNAL_UNKNOWN),
            // Not failures, or not HTTP: the next signal decides.
            (h(200).s(S::ReadOnly), Unknown, NO_SIGNAL_UNKNOWN),
            (h(302), Unknown, NO_SIGNAL_UNKNOWN),
            (h(99), Unknown, NO_SIGNAL_UNKNOWN),
            (h(600), Unknown, NO_SIGNAL_UNKNOWN),
            (h(0), Unknown, NO_SIGNAL_UNKNOWN),
            (g(0), Unknown, NO_SIGNAL_UNKNOWN),
            (h(200).n(N::Timeout), Unknown, NETWORK_NON_IDEMPOTENT_UNKNOWN),
            (h(503).g(0).s(S::ReadOnly), Transient, HTTP_503_TRANSIENT),
            // gRPC beats HTTP (a gateway maps ABORTED and ALREADY_EXISTS
            // both to 409), HTTP beats the network.
            (h(400).g(13).s(S::Idempotent), Transient, GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT),
            (h(409).g(6), Permanent, GRPC_ALREADY_EXISTS_PERMANENT),
            (h(409).g(10), Transient, GRPC_ABORTED_TRANSIENT),
            (h(404).s(S::Idempotent).n(N::Timeout), Permanent, HTTP_4XX_PERMANENT),
            // Codes outside google.rpc.Code are UNKNOWN.
            (g(99).s(S::ReadOnly), Transient, GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT),
            (g(-1).s(S::NonIdempotent), Unknown, GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN),
        ];
        for code in [1, 2, 4, 13] {
            rows.extend([
                (g(code).s(S::ReadOnly), Transient, GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT),
                (g(code).s(S::Idempotent), Transient, GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT),
                (g(code).s(S::NonIdempotent).r(Reach::NotSent), Transient, GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT),
                (g(code).n(N::Dns), Transient, GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT),
                (g(code).s(S::NonIdempotent), Unknown, GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN),
                (g(code), Unknown, GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN),
            ]);
        }
        for status in [400, 401, 403, 404, 405, 409, 410, 413, 422, 451, 499] {
            rows.push((h(status).s(S::ReadOnly).r(Reach::NotSent), Permanent, HTTP_4XX_PERMANENT));
        }
        for status in [500, 502, 504, 507, 599] {
            rows.extend([
                (h(status).s(S::ReadOnly), Transient, HTTP_5XX_IDEMPOTENT_TRANSIENT),
                (h(status).s(S::Idempotent).n(N::Timeout), Transient, HTTP_5XX_IDEMPOTENT_TRANSIENT),
                (h(status).s(S::NonIdempotent).r(Reach::NotSent), Transient, HTTP_5XX_NOT_SENT_TRANSIENT),
                (h(status).s(S::NonIdempotent), Unknown, HTTP_5XX_NON_IDEMPOTENT_UNKNOWN),
                (h(status), Unknown, HTTP_5XX_NON_IDEMPOTENT_UNKNOWN),
            ]);
        }
        for kind in [N::Dns, N::ConnectionRefused, N::ConnectTimeout, N::Tls] {
            for safety in Safety::ALL {
                rows.push((n(kind).s(safety), Transient, NETWORK_NOT_SENT_TRANSIENT));
            }
        }
        for kind in [N::ConnectionReset, N::ConnectionClosed, N::Timeout, N::Other] {
            rows.extend([
                (n(kind).s(S::ReadOnly), Transient, NETWORK_IDEMPOTENT_TRANSIENT),
                (n(kind).s(S::Idempotent), Transient, NETWORK_IDEMPOTENT_TRANSIENT),
                (n(kind).s(S::NonIdempotent), Unknown, NETWORK_NON_IDEMPOTENT_UNKNOWN),
                (n(kind), Unknown, NETWORK_NON_IDEMPOTENT_UNKNOWN),
            ]);
        }
        rows
    }

    #[test]
    fn every_row_of_the_default_policy_classifies_as_documented() {
        let rules = RuleSet::default();
        let mut hit = HashSet::new();
        for (failure, class, rule) in default_table() {
            let got = rules.classify(&failure);
            assert_eq!((got.class, got.rule), (class, rule), "{failure:?}");
            hit.insert(rule);
        }
        let names: Vec<_> = rules.rule_names().collect();
        assert_eq!(names.len(), DEFAULT_RULES.len());
        for name in names {
            assert!(hit.contains(name), "no test row reaches {name}");
        }
    }

    #[test]
    fn every_grpc_failure_code_is_decided_by_a_grpc_rule() {
        let rules = RuleSet::default();
        for code in 1..=16 {
            for safety in Safety::ALL {
                for reached in Reach::ALL {
                    let failure = Failure {
                        grpc_code: Some(code),
                        http_status: Some(500),
                        safety,
                        reached,
                        ..Failure::default()
                    };
                    let rule = rules.classify(&failure).rule;
                    assert!(
                        rule.starts_with("grpc_"),
                        "{code} {safety:?} {reached:?}: {rule}"
                    );
                }
            }
        }
    }

    #[test]
    fn default_rule_names_are_unique_snake_case_and_end_with_their_class() {
        let mut seen = HashSet::new();
        for rule in &DEFAULT_RULES {
            assert!(seen.insert(rule.name), "{} twice", rule.name);
            assert!(rule.name.ends_with(rule.class.as_str()), "{}", rule.name);
            assert!(
                rule.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            );
        }
    }

    proptest! {
        #[test]
        fn a_network_failure_alone_is_never_permanent_and_not_sent_is_transient(
            (_, _, network, safety, reached, tenant) in any_failure()
        ) {
            let failure = Failure { network, safety, reached, tenant: &tenant, ..Failure::default() };
            let rules = RuleSet::default();
            let got = rules.classify(&failure);
            prop_assert_ne!(got.class, Permanent);
            if network.is_some() && failure.effective_reach() == Reach::NotSent {
                prop_assert_eq!(got.class, Transient);
            }
        }

        #[test]
        fn unsafe_work_that_may_have_run_is_never_retried_blindly(
            (http_status, grpc_code, network, _, _, tenant) in any_failure(),
            safety in proptest::sample::select(NOT_IDEMPOTENT.to_vec()),
        ) {
            // Statuses that promise the request was not processed are the
            // only transient answers for unsafe work that may have run.
            let failure = Failure {
                http_status, grpc_code, network, safety,
                reached: Reach::MayHaveReached, tenant: &tenant,
            };
            let rules = RuleSet::default();
            let got = rules.classify(&failure);
            if got.class == Transient {
                prop_assert!(
                    [GRPC_RESOURCE_EXHAUSTED_TRANSIENT, GRPC_ABORTED_TRANSIENT, HTTP_408_TRANSIENT,
                     HTTP_425_TRANSIENT, HTTP_429_TRANSIENT].contains(&got.rule),
                    "{}", got.rule
                );
            }
        }
    }
}
