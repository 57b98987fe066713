//! The one model of every refusal, whichever layer refuses (the
//! authentication layer, the request deadline, the connection bound, the
//! gRPC edge, the core, the store): each error says its stable code, gRPC
//! code, metadata and retry advice through [`Refusal`], and
//! [`Refusal::status`] renders it, here and nowhere else, as a
//! `tonic::Status` whose message starts with the stable code, with
//! `google.rpc.Status` details. Below every layer that refuses, so that
//! none of them imports another to render one.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The trailer a server sets to tell gRPC clients when to retry (gRFC A6).
pub(crate) const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

/// The `ErrorInfo.domain` of every refusal: the API's package.
pub const ERROR_DOMAIN: &str = "retrybudget.v1";

/// What a refusal says, whichever layer gives it. Its `Display` is the
/// message for people, starting with the stable code.
pub trait Refusal: std::fmt::Display {
    /// The gRPC status code.
    fn grpc_code(&self) -> Code;
    /// The stable code: the message's first word and `ErrorInfo.reason`.
    fn stable_code(&self) -> &'static str;
    /// The values involved, as `ErrorInfo.metadata`.
    fn details(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// When asking again can help: after this long (`RetryInfo`, and
    /// `grpc-retry-pushback-ms`).
    fn retry_after(&self) -> Option<Duration> {
        None
    }
    /// The refusal as every gRPC stack reads it (see `refusal`).
    fn status(&self) -> Status {
        refusal(
            self.grpc_code(),
            self.stable_code(),
            self.to_string(),
            self.details(),
            self.retry_after(),
        )
    }
}

/// A refusal as every gRPC stack reads it: `grpc` with `message` (which
/// starts with the stable code, for people), and `google.rpc.Status`
/// details holding an `ErrorInfo` (reason = the stable `code`, domain
/// [`ERROR_DOMAIN`], `metadata` = the values involved) and, when asking
/// again can help, a `RetryInfo` with the wait, also sent as gRPC's
/// `grpc-retry-pushback-ms` (gRFC A6).
fn refusal(
    grpc: Code,
    code: &'static str,
    message: impl Into<String>,
    metadata: impl IntoIterator<Item = (&'static str, String)>,
    retry_after: Option<Duration>,
) -> Status {
    let metadata: std::collections::HashMap<String, String> = metadata
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
    let mut details = ErrorDetails::with_error_info(code, ERROR_DOMAIN, metadata);
    if let Some(wait) = retry_after {
        details.set_retry_info(Some(wait));
    }
    let mut status = Status::with_error_details(grpc, message, details);
    if let Some(ms) = retry_after.and_then(|wait| wait.as_millis().to_string().parse().ok()) {
        status.metadata_mut().insert(RETRY_PUSHBACK, ms);
    }
    status
}
