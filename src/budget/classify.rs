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

/// The default policy, in order; the last rule matches everything.
const DEFAULT_RULES: [DefaultRule; 30] = {
    use ErrorClass::{Permanent, Transient, Unknown};
    let when = Conditions::ANY;
    let after_send = &[Reach::MayHaveReached];
    [
        DefaultRule::new(
            GRPC_INVALID_ARGUMENT_PERMANENT,
            Permanent,
            when.grpc(&[grpc::INVALID_ARGUMENT]),
        ),
        DefaultRule::new(
            GRPC_NOT_FOUND_PERMANENT,
            Permanent,
            when.grpc(&[grpc::NOT_FOUND]),
        ),
        DefaultRule::new(
            GRPC_ALREADY_EXISTS_PERMANENT,
            Permanent,
            when.grpc(&[grpc::ALREADY_EXISTS]),
        ),
        DefaultRule::new(
            GRPC_PERMISSION_DENIED_PERMANENT,
            Permanent,
            when.grpc(&[grpc::PERMISSION_DENIED]),
        ),
        DefaultRule::new(
            GRPC_UNAUTHENTICATED_PERMANENT,
            Permanent,
            when.grpc(&[grpc::UNAUTHENTICATED]),
        ),
        DefaultRule::new(
            GRPC_FAILED_PRECONDITION_PERMANENT,
            Permanent,
            when.grpc(&[grpc::FAILED_PRECONDITION]),
        ),
        DefaultRule::new(
            GRPC_OUT_OF_RANGE_PERMANENT,
            Permanent,
            when.grpc(&[grpc::OUT_OF_RANGE]),
        ),
        DefaultRule::new(
            GRPC_UNIMPLEMENTED_PERMANENT,
            Permanent,
            when.grpc(&[grpc::UNIMPLEMENTED]),
        ),
        DefaultRule::new(
            GRPC_DATA_LOSS_UNKNOWN,
            Unknown,
            when.grpc(&[grpc::DATA_LOSS]),
        ),
        DefaultRule::new(
            GRPC_UNAVAILABLE_NON_IDEMPOTENT_UNKNOWN,
            Unknown,
            when.grpc(&[grpc::UNAVAILABLE])
                .reach(after_send)
                .safety(NOT_IDEMPOTENT),
        ),
        DefaultRule::new(
            GRPC_UNAVAILABLE_TRANSIENT,
            Transient,
            when.grpc(&[grpc::UNAVAILABLE]),
        ),
        DefaultRule::new(
            GRPC_RESOURCE_EXHAUSTED_TRANSIENT,
            Transient,
            when.grpc(&[grpc::RESOURCE_EXHAUSTED]),
        ),
        DefaultRule::new(
            GRPC_ABORTED_TRANSIENT,
            Transient,
            when.grpc(&[grpc::ABORTED]),
        ),
        DefaultRule::new(
            GRPC_MAYBE_EXECUTED_IDEMPOTENT_TRANSIENT,
            Transient,
            when.grpc(MAYBE_EXECUTED).safety(IDEMPOTENT),
        ),
        DefaultRule::new(
            GRPC_MAYBE_EXECUTED_NOT_SENT_TRANSIENT,
            Transient,
            when.grpc(MAYBE_EXECUTED).reach(&[Reach::NotSent]),
        ),
        DefaultRule::new(
            GRPC_MAYBE_EXECUTED_NON_IDEMPOTENT_UNKNOWN,
            Unknown,
            when.grpc(MAYBE_EXECUTED).safety(NOT_IDEMPOTENT),
        ),
        DefaultRule::new(
            HTTP_408_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(408, 408)),
        ),
        DefaultRule::new(
            HTTP_425_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(425, 425)),
        ),
        DefaultRule::new(
            HTTP_429_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(429, 429)),
        ),
        DefaultRule::new(
            HTTP_4XX_PERMANENT,
            Permanent,
            when.http(StatusSet::EMPTY.with(400, 499)),
        ),
        DefaultRule::new(
            HTTP_503_NON_IDEMPOTENT_UNKNOWN,
            Unknown,
            when.http(StatusSet::EMPTY.with(503, 503))
                .reach(after_send)
                .safety(NOT_IDEMPOTENT),
        ),
        DefaultRule::new(
            HTTP_503_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(503, 503)),
        ),
        DefaultRule::new(
            HTTP_501_505_PERMANENT,
            Permanent,
            when.http(StatusSet::EMPTY.with(501, 501).with(505, 505)),
        ),
        DefaultRule::new(
            HTTP_5XX_IDEMPOTENT_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(500, 599))
                .safety(IDEMPOTENT),
        ),
        DefaultRule::new(
            HTTP_5XX_NOT_SENT_TRANSIENT,
            Transient,
            when.http(StatusSet::EMPTY.with(500, 599))
                .reach(&[Reach::NotSent]),
        ),
        DefaultRule::new(
            HTTP_5XX_NON_IDEMPOTENT_UNKNOWN,
            Unknown,
            when.http(StatusSet::EMPTY.with(500, 599))
                .safety(NOT_IDEMPOTENT),
        ),
        DefaultRule::new(
            NETWORK_NOT_SENT_TRANSIENT,
            Transient,
            when.any_network().reach(&[Reach::NotSent]),
        ),
        DefaultRule::new(
            NETWORK_IDEMPOTENT_TRANSIENT,
            Transient,
            when.any_network().safety(IDEMPOTENT),
        ),
        DefaultRule::new(
            NETWORK_NON_IDEMPOTENT_UNKNOWN,
            Unknown,
            when.any_network().safety(NOT_IDEMPOTENT),
        ),
        DefaultRule::new(NO_SIGNAL_UNKNOWN, Unknown, when),
    ]
};

/// One row of the default policy.
struct DefaultRule {
    name: &'static str,
    class: ErrorClass,
    when: Conditions,
}

impl DefaultRule {
    const fn new(name: &'static str, class: ErrorClass, when: Conditions) -> Self {
        Self { name, class, when }
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
