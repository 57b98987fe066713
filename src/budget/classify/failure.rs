//! The classifier's input: a failed attempt as the worker saw it
//! ([`Failure`]), and the words it is described in: how safe the operation
//! is to repeat ([`Safety`]), what failed on the network
//! ([`NetworkFailure`]) and whether the request may have reached the server
//! ([`Reach`]). Apart from the rules because workers, events and the gRPC
//! edge speak these types without caring how a rule is matched; the bit a
//! value has in a rule's mask stays private to the classifier.

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

    pub(super) const fn bit(self) -> u8 {
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

    pub(super) const fn bit(self) -> u16 {
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

    pub(super) const fn bit(self) -> u8 {
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
