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

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};

use super::action::ErrorClass;

/// How safe the failed operation is to repeat. Only matters when the
/// request may have reached the server.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Safety {
    /// The worker did not say. Treated like [`NonIdempotent`](Self::NonIdempotent)
    /// by the default policy: when in doubt, a person decides rather than
    /// the service risking a second payment.
    #[default]
    Unspecified,
    /// Reads only: repeating it changes nothing.
    ReadOnly,
    /// Repeating it has the effect of doing it once (a PUT, a DELETE, or any
    /// request carrying an idempotency key the server honours).
    Idempotent,
    /// Repeating it may do it twice (creating a payment, sending a mail).
    NonIdempotent,
}

impl Safety {
    /// Every value, in declaration order.
    pub const ALL: [Self; 4] = [
        Self::Unspecified,
        Self::ReadOnly,
        Self::Idempotent,
        Self::NonIdempotent,
    ];

    /// The snake_case name used in rules and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::ReadOnly => "read_only",
            Self::Idempotent => "idempotent",
            Self::NonIdempotent => "non_idempotent",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// What went wrong on the network, when no complete response arrived. Each
/// kind implies whether the request may have reached the server
/// ([`implied_reach`](Self::implied_reach)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkFailure {
    /// Name resolution failed: there was no address to send to.
    Dns,
    /// The connection was refused (nothing listens, or a firewall rejects):
    /// no connection, so nothing was sent.
    ConnectionRefused,
    /// Establishing the connection timed out: nothing was sent.
    ConnectTimeout,
    /// The TLS handshake failed, certificate checks included. A request is
    /// written only after the handshake, so nothing was sent.
    Tls,
    /// An established connection was reset: the request may have been
    /// written, and processed.
    ConnectionReset,
    /// The connection closed before a complete response (EOF, broken pipe,
    /// an HTTP/2 stream reset or GOAWAY): the request may have been
    /// processed.
    ConnectionClosed,
    /// No response in time after the request was sent (a read or response
    /// timeout): the server may still be processing it.
    Timeout,
    /// Another network failure; nothing is known about the request.
    Other,
}

impl NetworkFailure {
    /// Every value, in declaration order.
    pub const ALL: [Self; 8] = [
        Self::Dns,
        Self::ConnectionRefused,
        Self::ConnectTimeout,
        Self::Tls,
        Self::ConnectionReset,
        Self::ConnectionClosed,
        Self::Timeout,
        Self::Other,
    ];

    /// The snake_case name used in rules and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dns => "dns",
            Self::ConnectionRefused => "connection_refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::Tls => "tls",
            Self::ConnectionReset => "connection_reset",
            Self::ConnectionClosed => "connection_closed",
            Self::Timeout => "timeout",
            Self::Other => "other",
        }
    }

    /// Whether a request that failed this way may have reached the server,
    /// when the worker does not say.
    pub fn implied_reach(self) -> Reach {
        match self {
            Self::Dns | Self::ConnectionRefused | Self::ConnectTimeout | Self::Tls => {
                Reach::NotSent
            }
            Self::ConnectionReset | Self::ConnectionClosed | Self::Timeout => Reach::MayHaveReached,
            Self::Other => Reach::Unknown,
        }
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// Whether the request may have reached the server: the question that
/// decides whether repeating an unsafe operation can do it twice.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Not known; derived from the network failure when there is one.
    #[default]
    Unknown,
    /// Certainly not sent: repeating it cannot do anything twice.
    NotSent,
    /// It may have reached the server and been processed.
    MayHaveReached,
}

impl Reach {
    /// Every value, in declaration order.
    pub const ALL: [Self; 3] = [Self::Unknown, Self::NotSent, Self::MayHaveReached];

    /// The snake_case name used in rules and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::NotSent => "not_sent",
            Self::MayHaveReached => "may_have_reached",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A failed attempt as the worker saw it: the classifier's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Failure<'a> {
    /// The HTTP status of the response, if there was one. Values outside
    /// 100-599 are not HTTP statuses and are ignored.
    pub http_status: Option<u16>,
    /// The numeric `google.rpc.Code`, if the call was gRPC. Codes outside
    /// 0-16 are read as `UNKNOWN`, as the gRPC specification requires.
    pub grpc_code: Option<i32>,
    /// The network failure, when no complete response arrived.
    pub network: Option<NetworkFailure>,
    /// How safe the operation is to repeat.
    pub safety: Safety,
    /// Whether the request may have reached the server, as the worker
    /// knows it. [`Reach::Unknown`] lets the network failure decide.
    pub reached: Reach,
    /// The tenant, for tenant-scoped override rules.
    pub tenant: &'a str,
}

impl Failure<'_> {
    /// The reach the rules see: the worker's answer when it gave one (it
    /// knows its client), else what the network failure implies.
    pub fn effective_reach(&self) -> Reach {
        match (self.reached, self.network) {
            (Reach::Unknown, Some(network)) => network.implied_reach(),
            (reached, _) => reached,
        }
    }
}

/// The class a [`RuleSet`] gave a failure, and the rule that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Classification<'r> {
    /// The class that decides the next action.
    pub class: ErrorClass,
    /// The stable name of the rule that matched (a default rule's constant,
    /// or an override's configured name).
    pub rule: &'r str,
}

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

/// The `google.rpc.Code` names, indexed by number.
const GRPC_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// `google.rpc.Code` numbers the default policy names.
mod grpc {
    pub const CANCELLED: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const INVALID_ARGUMENT: u8 = 3;
    pub const DEADLINE_EXCEEDED: u8 = 4;
    pub const NOT_FOUND: u8 = 5;
    pub const ALREADY_EXISTS: u8 = 6;
    pub const PERMISSION_DENIED: u8 = 7;
    pub const RESOURCE_EXHAUSTED: u8 = 8;
    pub const FAILED_PRECONDITION: u8 = 9;
    pub const ABORTED: u8 = 10;
    pub const OUT_OF_RANGE: u8 = 11;
    pub const UNIMPLEMENTED: u8 = 12;
    pub const INTERNAL: u8 = 13;
    pub const UNAVAILABLE: u8 = 14;
    pub const DATA_LOSS: u8 = 15;
    pub const UNAUTHENTICATED: u8 = 16;
    /// The largest code `google.rpc.Code` defines.
    pub const MAX: u8 = 16;
}

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
const DEFAULT_RULES: [DefaultRule; 30] = {
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
struct DefaultRule {
    name: &'static str,
    class: ErrorClass,
    when: Conditions,
}

impl DefaultRule {
    fn to_rule(&self) -> Rule {
        Rule {
            name: Cow::Borrowed(self.name),
            class: self.class,
            when: self.when,
            tenants: Vec::new(),
        }
    }
}

/// HTTP statuses 0-639 as a bit set: a match is one bit test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatusSet([u64; 10]);

impl StatusSet {
    const EMPTY: Self = Self([0; 10]);

    /// Adds `lo..=hi`; callers keep both within 100-599.
    const fn with(mut self, lo: u16, hi: u16) -> Self {
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
struct Conditions {
    http: Option<StatusSet>,
    /// One bit per `google.rpc.Code` number.
    grpc: Option<u32>,
    /// One bit per [`NetworkFailure`].
    network: Option<u16>,
    /// One bit per [`Safety`].
    safety: Option<u8>,
    /// One bit per [`Reach`], matched against the effective reach.
    reach: Option<u8>,
}

impl Conditions {
    const ANY: Self = Self {
        http: None,
        grpc: None,
        network: None,
        safety: None,
        reach: None,
    };

    const fn grpc(self, codes: &[u8]) -> Self {
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

    const fn http(self, statuses: StatusSet) -> Self {
        Self {
            http: Some(statuses),
            ..self
        }
    }

    const fn any_network(self) -> Self {
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

    const fn safety(self, values: &[Safety]) -> Self {
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

    const fn reach(self, values: &[Reach]) -> Self {
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

    fn is_empty(&self) -> bool {
        *self == Self::ANY
    }

    fn matches(&self, signals: &Signals) -> bool {
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
struct Signals {
    http: Option<u16>,
    /// Within 0..=16.
    grpc: Option<u8>,
    network: Option<NetworkFailure>,
    safety: Safety,
    reach: Reach,
}

impl Signals {
    fn of(failure: &Failure<'_>) -> Self {
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

/// One operator rule from the configuration file
/// (`[[classification.rules]]`). Every condition that is given must hold;
/// a list matches any of its items. See `docs/classification.md`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The stable snake_case name returned with every decision the rule
    /// makes; unique, and not a default rule's name.
    pub name: String,
    /// The class given: `transient`, `permanent` or `unknown`.
    pub class: String,
    /// HTTP statuses: `503`, `"500-599"`, `"5xx"`, or a list of them.
    pub http_status: Option<Selector>,
    /// gRPC codes by name (`"UNAVAILABLE"`) or number (`14`), or a list.
    pub grpc_code: Option<Selector>,
    /// Network failures by name (`"connection_reset"`), or a list.
    pub network: Option<Selector>,
    /// Safeties by name (`"non_idempotent"`), or a list.
    pub safety: Option<Selector>,
    /// Effective reaches by name (`"not_sent"`), or a list.
    pub reached: Option<Selector>,
    /// Tenants the rule is limited to, or a list.
    pub tenant: Option<Selector>,
}

/// A rule's condition values as written: one value or a list. Checked by
/// [`RuleSet::new`], so a mistake is reported with the rule's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(pub Vec<SelectorItem>);

/// One value of a [`Selector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectorItem {
    /// A number: a status or a gRPC code.
    Number(i64),
    /// A string: a range, a name or a tenant.
    Text(String),
}

impl fmt::Display for SelectorItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

/// A configured rule that cannot be used. The service refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A rule without a name.
    #[error("classification rule #{index}: the name is empty")]
    EmptyName {
        /// The rule's 1-based position among the overrides.
        index: usize,
    },
    /// A name that is not snake_case or is too long.
    #[error(
        "classification rule {name:?}: the name must be 1 to {MAX_NAME_BYTES} bytes of a-z, 0-9 and _, starting with a letter"
    )]
    InvalidName {
        /// The name as configured.
        name: String,
    },
    /// Two overrides with one name.
    #[error("classification rule {name:?}: the name is used by an earlier rule")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// An override named like a default rule.
    #[error("classification rule {name:?}: the name belongs to a default rule")]
    ReservedName {
        /// The name.
        name: String,
    },
    /// A rule without conditions, which would classify every failure.
    #[error(
        "classification rule {name:?}: no condition; set at least one of http_status, grpc_code, network, safety, reached, tenant"
    )]
    EmptyMatch {
        /// The rule.
        name: String,
    },
    /// A condition given as an empty list, which matches nothing.
    #[error("classification rule {name:?}: {field} is an empty list, which matches nothing")]
    EmptyList {
        /// The rule.
        name: String,
        /// The condition.
        field: &'static str,
    },
    /// A value the condition does not know.
    #[error("classification rule {name:?}: {field} {value} is not {expected}")]
    BadValue {
        /// The rule.
        name: String,
        /// The condition (or `class`).
        field: &'static str,
        /// The value as configured.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
}

/// The longest rule name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

impl RuleSpec {
    /// Checks the spec and turns it into a rule; `index` is 1-based.
    fn compile(self, index: usize) -> Result<Rule, RuleError> {
        let Self {
            name,
            class,
            http_status,
            grpc_code,
            network,
            safety,
            reached,
            tenant,
        } = self;
        if name.is_empty() {
            return Err(RuleError::EmptyName { index });
        }
        let snake = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !snake || name.len() > MAX_NAME_BYTES {
            return Err(RuleError::InvalidName { name });
        }
        let check = Checker { name: &name };
        let class = class.parse::<ErrorClass>().map_err(|_| {
            check.bad(
                "class",
                &SelectorItem::Text(class.clone()),
                "transient, permanent or unknown",
            )
        })?;
        let mut when = Conditions::ANY;
        if let Some(selector) = http_status {
            let mut set = StatusSet::EMPTY;
            for item in check.items("http_status", &selector)? {
                let (lo, hi) = parse_statuses(item).ok_or_else(|| {
                    check.bad(
                        "http_status",
                        item,
                        "a status 100-599, a range like \"500-599\" or a class like \"5xx\"",
                    )
                })?;
                set = set.with(lo, hi);
            }
            when.http = Some(set);
        }
        if let Some(selector) = grpc_code {
            let mut mask = 0u32;
            for item in check.items("grpc_code", &selector)? {
                let code = parse_grpc_code(item).ok_or_else(|| {
                    check.bad(
                        "grpc_code",
                        item,
                        "a google.rpc.Code name like \"UNAVAILABLE\" or a number 0-16",
                    )
                })?;
                mask |= 1 << code;
            }
            when.grpc = Some(mask);
        }
        if let Some(selector) = network {
            let mut mask = 0u16;
            for item in check.items("network", &selector)? {
                let kind = by_name(item, &NetworkFailure::ALL, |n| n.as_str()).ok_or_else(|| {
                    check.bad(
                        "network",
                        item,
                        "dns, connection_refused, connect_timeout, tls, connection_reset, connection_closed, timeout or other",
                    )
                })?;
                mask |= kind.bit();
            }
            when.network = Some(mask);
        }
        if let Some(selector) = safety {
            let mut mask = 0u8;
            for item in check.items("safety", &selector)? {
                let value = by_name(item, &Safety::ALL, |s| s.as_str()).ok_or_else(|| {
                    check.bad(
                        "safety",
                        item,
                        "unspecified, read_only, idempotent or non_idempotent",
                    )
                })?;
                mask |= value.bit();
            }
            when.safety = Some(mask);
        }
        if let Some(selector) = reached {
            let mut mask = 0u8;
            for item in check.items("reached", &selector)? {
                let value = by_name(item, &Reach::ALL, |r| r.as_str()).ok_or_else(|| {
                    check.bad("reached", item, "unknown, not_sent or may_have_reached")
                })?;
                mask |= value.bit();
            }
            when.reach = Some(mask);
        }
        let mut tenants = Vec::new();
        if let Some(selector) = tenant {
            for item in check.items("tenant", &selector)? {
                match item {
                    SelectorItem::Text(t) if !t.is_empty() => tenants.push(t.clone()),
                    _ => return Err(check.bad("tenant", item, "a non-empty tenant name")),
                }
            }
        }
        if when.is_empty() && tenants.is_empty() {
            return Err(RuleError::EmptyMatch { name });
        }
        Ok(Rule {
            name: Cow::Owned(name),
            class,
            when,
            tenants,
        })
    }
}

/// Builds errors that name the rule.
struct Checker<'a> {
    name: &'a str,
}

impl Checker<'_> {
    fn items<'s>(
        &self,
        field: &'static str,
        selector: &'s Selector,
    ) -> Result<&'s [SelectorItem], RuleError> {
        if selector.0.is_empty() {
            return Err(RuleError::EmptyList {
                name: self.name.to_owned(),
                field,
            });
        }
        Ok(&selector.0)
    }

    fn bad(&self, field: &'static str, item: &SelectorItem, expected: &'static str) -> RuleError {
        RuleError::BadValue {
            name: self.name.to_owned(),
            field,
            value: item.to_string(),
            expected,
        }
    }
}

/// `503`, `"503"`, `"500-599"` or `"5xx"` as an inclusive range within
/// 100-599.
fn parse_statuses(item: &SelectorItem) -> Option<(u16, u16)> {
    let valid = |s: u16| (100..=599).contains(&s).then_some(s);
    let status = |text: &str| text.trim().parse::<u16>().ok().and_then(valid);
    match item {
        SelectorItem::Number(n) => u16::try_from(*n).ok().and_then(valid).map(|s| (s, s)),
        SelectorItem::Text(text) => {
            let text = text.trim();
            if let [digit @ b'1'..=b'5', x, y] = text.as_bytes()
                && x.eq_ignore_ascii_case(&b'x')
                && y.eq_ignore_ascii_case(&b'x')
            {
                let lo = u16::from(digit - b'0') * 100;
                return Some((lo, lo + 99));
            }
            match text.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (status(lo)?, status(hi)?);
                    (lo <= hi).then_some((lo, hi))
                }
                None => status(text).map(|s| (s, s)),
            }
        }
    }
}

/// A `google.rpc.Code` by number or name (any case).
fn parse_grpc_code(item: &SelectorItem) -> Option<u8> {
    let number = match item {
        SelectorItem::Number(n) => *n,
        SelectorItem::Text(text) => {
            let text = text.trim();
            match GRPC_CODE_NAMES
                .iter()
                .position(|name| name.eq_ignore_ascii_case(text))
            {
                Some(index) => return u8::try_from(index).ok(),
                None => text.parse().ok()?,
            }
        }
    };
    u8::try_from(number).ok().filter(|c| *c <= grpc::MAX)
}

/// The value whose name is the item's text (any case).
fn by_name<T: Copy>(item: &SelectorItem, all: &[T], name: impl Fn(T) -> &'static str) -> Option<T> {
    match item {
        SelectorItem::Text(text) => all
            .iter()
            .copied()
            .find(|value| name(*value).eq_ignore_ascii_case(text.trim())),
        SelectorItem::Number(_) => None,
    }
}

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SelectorVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for SelectorItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ItemVisitor)
    }
}

/// Reads one number or string.
struct ItemVisitor;

impl Visitor<'_> for ItemVisitor {
    type Value = SelectorItem;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or a string")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(SelectorItem::Number(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i64::try_from(v)
            .map(SelectorItem::Number)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(SelectorItem::Text(v.to_owned()))
    }
}

/// Reads one value or a list of them.
struct SelectorVisitor;

impl<'de> Visitor<'de> for SelectorVisitor {
    type Value = Selector;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, a string, or a list of them")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        ItemVisitor.visit_i64(v).map(|item| Selector(vec![item]))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        ItemVisitor.visit_u64(v).map(|item| Selector(vec![item]))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        ItemVisitor.visit_str(v).map(|item| Selector(vec![item]))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element::<SelectorItem>()? {
            items.push(item);
        }
        Ok(Selector(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorClass::{Permanent, Transient, Unknown};
    use NetworkFailure as N;
    use Safety as S;
    use proptest::prelude::*;

    fn h(status: u16) -> Failure<'static> {
        Failure {
            http_status: Some(status),
            ..Failure::default()
        }
    }

    fn g(code: i32) -> Failure<'static> {
        Failure {
            grpc_code: Some(code),
            ..Failure::default()
        }
    }

    fn n(kind: NetworkFailure) -> Failure<'static> {
        Failure {
            network: Some(kind),
            ..Failure::default()
        }
    }

    /// Short builders, so the table below reads one row a line.
    trait Build {
        fn s(self, safety: Safety) -> Self;
        fn r(self, reached: Reach) -> Self;
        fn n(self, kind: NetworkFailure) -> Self;
        fn g(self, code: i32) -> Self;
    }

    impl Build for Failure<'static> {
        fn s(self, safety: Safety) -> Self {
            Failure { safety, ..self }
        }
        fn r(self, reached: Reach) -> Self {
            Failure { reached, ..self }
        }
        fn n(self, kind: NetworkFailure) -> Self {
            Failure {
                network: Some(kind),
                ..self
            }
        }
        fn g(self, code: i32) -> Self {
            Failure {
                grpc_code: Some(code),
                ..self
            }
        }
    }

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

    /// The overrides example of `docs/classification.md`, so it cannot rot.
    fn documented_example() -> &'static str {
        let doc = include_str!("../../docs/classification.md");
        let start = doc.find("```toml\n").expect("the doc has a toml example") + 8;
        let len = doc[start..].find("```").expect("the example is closed");
        &doc[start..start + len]
    }

    #[derive(serde::Deserialize)]
    struct Config {
        classification: Section,
    }

    #[derive(serde::Deserialize)]
    struct Section {
        rules: Vec<RuleSpec>,
    }

    fn configured() -> RuleSet {
        let config: Config = toml::from_str(documented_example()).expect("the example parses");
        RuleSet::new(config.classification.rules).expect("the example is valid")
    }

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

    #[test]
    fn rules_may_be_written_inline() {
        let config: Config = toml::from_str(
            "[classification]\nrules = [{ name = \"x\", http_status = \"4xx\", class = \"unknown\" }]",
        )
        .expect("inline form");
        let rules = RuleSet::new(config.classification.rules).expect("valid");
        assert_eq!(rules.classify(&h(404)).rule, "x");
    }

    fn spec(name: &str) -> RuleSpec {
        RuleSpec {
            name: name.to_owned(),
            class: "transient".to_owned(),
            http_status: None,
            grpc_code: None,
            network: None,
            safety: None,
            reached: None,
            tenant: None,
        }
    }

    fn text(values: &[&str]) -> Option<Selector> {
        Some(Selector(
            values
                .iter()
                .map(|v| SelectorItem::Text((*v).to_owned()))
                .collect(),
        ))
    }

    #[test]
    fn status_forms_are_read_as_ranges() {
        let cases: [(SelectorItem, Option<(u16, u16)>); 12] = [
            (SelectorItem::Number(503), Some((503, 503))),
            (SelectorItem::Text("503".into()), Some((503, 503))),
            (SelectorItem::Text(" 500 - 599 ".into()), Some((500, 599))),
            (SelectorItem::Text("4xx".into()), Some((400, 499))),
            (SelectorItem::Text("5XX".into()), Some((500, 599))),
            (SelectorItem::Text("6xx".into()), None),
            (SelectorItem::Text("599-500".into()), None),
            (SelectorItem::Text("500-600".into()), None),
            (SelectorItem::Text("50-99".into()), None),
            (SelectorItem::Text("5-".into()), None),
            (SelectorItem::Number(70_000), None),
            (SelectorItem::Number(-1), None),
        ];
        for (item, want) in cases {
            assert_eq!(parse_statuses(&item), want, "{item}");
        }
    }

    #[test]
    fn invalid_overrides_are_refused_naming_the_rule() {
        let cases: Vec<(Vec<RuleSpec>, &str)> = vec![
            (vec![spec("")], "classification rule #1: the name is empty"),
            (
                vec![RuleSpec {
                    http_status: text(&["500"]),
                    ..spec("Bad-Name")
                }],
                "classification rule \"Bad-Name\": the name must be",
            ),
            (
                vec![
                    RuleSpec {
                        http_status: text(&["500"]),
                        ..spec("twice")
                    },
                    RuleSpec {
                        http_status: text(&["502"]),
                        ..spec("twice")
                    },
                ],
                "classification rule \"twice\": the name is used by an earlier rule",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["429"]),
                    ..spec(HTTP_429_TRANSIENT)
                }],
                "classification rule \"http_429_transient\": the name belongs to a default rule",
            ),
            (
                vec![spec("catch_all")],
                "classification rule \"catch_all\": no condition",
            ),
            (
                vec![RuleSpec {
                    http_status: Some(Selector::default()),
                    ..spec("none")
                }],
                "classification rule \"none\": http_status is an empty list",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["600-699"]),
                    ..spec("range")
                }],
                "classification rule \"range\": http_status \"600-699\" is not a status 100-599",
            ),
            (
                vec![RuleSpec {
                    grpc_code: text(&["UNAVAIL"]),
                    ..spec("code")
                }],
                "classification rule \"code\": grpc_code \"UNAVAIL\" is not a google.rpc.Code",
            ),
            (
                vec![RuleSpec {
                    grpc_code: Some(Selector(vec![SelectorItem::Number(17)])),
                    ..spec("code")
                }],
                "classification rule \"code\": grpc_code 17 is not",
            ),
            (
                vec![RuleSpec {
                    network: text(&["refused"]),
                    ..spec("kind")
                }],
                "classification rule \"kind\": network \"refused\" is not dns,",
            ),
            (
                vec![RuleSpec {
                    safety: text(&["safe"]),
                    ..spec("safety")
                }],
                "classification rule \"safety\": safety \"safe\" is not",
            ),
            (
                vec![RuleSpec {
                    reached: text(&["sent"]),
                    ..spec("reach")
                }],
                "classification rule \"reach\": reached \"sent\" is not",
            ),
            (
                vec![RuleSpec {
                    tenant: text(&[""]),
                    ..spec("tenant")
                }],
                "classification rule \"tenant\": tenant \"\" is not a non-empty tenant name",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["500"]),
                    class: "retry".into(),
                    ..spec("class")
                }],
                "classification rule \"class\": class \"retry\" is not transient, permanent or unknown",
            ),
        ];
        for (specs, message) in cases {
            let err = RuleSet::new(specs).expect_err(message);
            assert!(err.to_string().starts_with(message), "{err}");
        }
    }

    #[test]
    fn names_of_codes_and_kinds_are_case_insensitive() {
        let rules = RuleSet::new(vec![RuleSpec {
            grpc_code: text(&["unavailable", "14", "Internal"]),
            network: text(&["Connection_Reset"]),
            ..spec("mixed_case")
        }])
        .expect("valid");
        let failure = g(13).n(N::ConnectionReset);
        assert_eq!(rules.classify(&failure).rule, "mixed_case");
    }

    #[test]
    fn selectors_read_one_value_or_a_list() {
        let read = |toml: &str| toml::from_str::<RuleSpec>(toml);
        let one = read("name = \"a\"\nclass = \"unknown\"\nhttp_status = 502").expect("number");
        assert_eq!(
            one.http_status,
            Some(Selector(vec![SelectorItem::Number(502)]))
        );
        let many =
            read("name = \"a\"\nclass = \"unknown\"\ngrpc_code = [\"ABORTED\", 4]").expect("list");
        assert_eq!(
            many.grpc_code,
            Some(Selector(vec![
                SelectorItem::Text("ABORTED".into()),
                SelectorItem::Number(4)
            ]))
        );
        assert!(read("name = \"a\"\nclass = \"unknown\"\nhttp_status = true").is_err());
        let typo =
            read("name = \"a\"\nclass = \"unknown\"\nhttp = 502").expect_err("unknown field");
        assert!(typo.to_string().contains("unknown field `http`"), "{typo}");
    }

    fn any_failure() -> impl Strategy<
        Value = (
            Option<u16>,
            Option<i32>,
            Option<NetworkFailure>,
            Safety,
            Reach,
            String,
        ),
    > {
        (
            any::<Option<u16>>(),
            any::<Option<i32>>(),
            proptest::option::of(proptest::sample::select(NetworkFailure::ALL.to_vec())),
            proptest::sample::select(Safety::ALL.to_vec()),
            proptest::sample::select(Reach::ALL.to_vec()),
            prop_oneof![
                Just("acme".to_owned()),
                Just("payments".to_owned()),
                any::<String>()
            ],
        )
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
