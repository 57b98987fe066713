//! `[server]`, `[tls]` and `[limits]`: what a client meets before the
//! service decides anything: the listener and its bounds, the transport's
//! certificates, and what one request may carry.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::budget::timestamp::TimeBounds;

/// `[server]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// The address the gRPC server listens on.
    pub listen: SocketAddr,
    /// How long health says `NOT_SERVING` before the listener closes, so a
    /// mesh stops sending new calls first.
    #[serde(with = "super::duration")]
    pub drain_delay: Duration,
    /// How long calls in flight may take to finish after the listener
    /// closes.
    #[serde(with = "super::duration")]
    pub grace_period: Duration,
    /// The most connections served at once (those in their TLS handshake
    /// included). Past it, a connection's calls are answered `UNAVAILABLE`
    /// (`too_many_connections`, with a time to come back) and it is closed
    /// (see `server::incoming`). 1 to 1,000,000.
    pub max_connections: usize,
    /// The most calls in flight on one connection (HTTP/2's
    /// SETTINGS_MAX_CONCURRENT_STREAMS): clients queue past it. 1 or more.
    pub max_concurrent_streams: u32,
    /// The largest header list a call may send, in bytes (HTTP/2's
    /// SETTINGS_MAX_HEADER_LIST_SIZE). 1 KiB to 16 MiB.
    pub max_header_list_size: u32,
    /// A call still running this long after it arrived ends with
    /// `DEADLINE_EXCEEDED` (`request_timeout`); a shorter `grpc-timeout`
    /// from the client still applies.
    #[serde(with = "super::duration")]
    pub request_timeout: Duration,
    /// A connection quiet this long is sent an HTTP/2 PING; one that does
    /// not answer within `keepalive_timeout` is closed, freeing its place
    /// (a client gone without a FIN, behind a NAT or a dead host).
    #[serde(with = "super::duration")]
    pub keepalive_interval: Duration,
    /// How long a PING may go unanswered (see `keepalive_interval`).
    #[serde(with = "super::duration")]
    pub keepalive_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 50051)),
            drain_delay: Duration::from_secs(2),
            grace_period: Duration::from_secs(10),
            max_connections: 4096,
            max_concurrent_streams: 1024,
            max_header_list_size: 16 << 10,
            request_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

/// `[tls]`: TLS, and mutual TLS, on the gRPC port; plaintext unless `cert`
/// is set. The files are read again on SIGHUP and when they change.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// The server's certificate chain (PEM), leaf first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// CA certificates (PEM) that sign the clients' certificates: when set,
    /// every client must present a certificate they verify (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// A TLS handshake not done in this long is abandoned and its
    /// connection closed.
    #[serde(with = "super::duration")]
    pub handshake_timeout: Duration,
    /// How often the files are checked for a change (their contents).
    #[serde(with = "super::duration")]
    pub watch_interval: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert: None,
            key: None,
            client_ca: None,
            handshake_timeout: Duration::from_secs(10),
            watch_interval: Duration::from_secs(5),
        }
    }
}

/// `[limits]`: bounds on what a client controls in one request; each
/// refusal has its stable code and changes nothing stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest request message, in bytes; a larger one is refused with
    /// `RESOURCE_EXHAUSTED` (`message_too_large`) before it is buffered.
    /// 64 KiB: the largest legitimate request, a `NextActionRequest` with
    /// two 256-byte ids and a failure's header values, is under 2 KiB, and
    /// a `ResolveActivity` note is a person's sentence; a sixty-fourth of
    /// tonic's 4 MiB default is what one call may make the server hold.
    pub max_message_bytes: usize,
    /// How far before the server's clock an `occurred_at` may be; older is
    /// `INVALID_ARGUMENT` (`timestamp_implausible`). Long enough for a
    /// worker replaying an old history (see `budget::timestamp`).
    #[serde(with = "super::duration")]
    pub max_timestamp_past: Duration,
    /// How far after the server's clock an `occurred_at` may be: clock
    /// skew.
    #[serde(with = "super::duration")]
    pub max_timestamp_future: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let bounds = TimeBounds::default();
        Self {
            max_message_bytes: 64 << 10,
            max_timestamp_past: bounds.max_past,
            max_timestamp_future: bounds.max_future,
        }
    }
}

impl LimitsConfig {
    /// The core's bounds on a client's timestamps.
    pub fn time_bounds(&self) -> TimeBounds {
        TimeBounds {
            max_past: self.max_timestamp_past,
            max_future: self.max_timestamp_future,
        }
    }
}
