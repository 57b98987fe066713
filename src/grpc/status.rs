//! Errors to `tonic::Status`, in exactly one place.
//!
//! Bad input is `INVALID_ARGUMENT` (bytes that are not the request message
//! included), a report that contradicts what is stored is
//! `FAILED_PRECONDITION`, an unknown activity is `NOT_FOUND`, a request
//! message over the size limit is `RESOURCE_EXHAUSTED`: each with the stable
//! code first in the message and as `ErrorInfo.reason`, and the values
//! involved in `ErrorInfo.metadata`. A store that is down is `UNAVAILABLE`
//! (nothing was acknowledged: safe to ask again, `RetryInfo` says when).
//! Anything unexpected is `INTERNAL`, logged here and not echoed to the
//! caller.

use std::time::Duration;

use tonic::{Code, Status};

pub use crate::refusal::{ERROR_DOMAIN, Refusal};

use crate::budget::activity::{BudgetError, ErrorKind};
use crate::budget::codes;
use crate::budget::traffic::TrafficError;
use crate::ledger::LedgerError;
use crate::store::StoreError;

/// The core's refusals: bad input, a report that contradicts the record,
/// an unknown activity.
impl Refusal for BudgetError {
    fn grpc_code(&self) -> Code {
        match self.kind() {
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::FailedPrecondition => Code::FailedPrecondition,
            ErrorKind::NotFound => Code::NotFound,
        }
    }
    fn stable_code(&self) -> &'static str {
        self.code()
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        self.metadata()
    }
}

impl From<BudgetError> for Status {
    fn from(err: BudgetError) -> Self {
        err.status()
    }
}

/// A traffic report refused: bad counts, or too many reports a second
/// (`RESOURCE_EXHAUSTED`, with when to send the next).
impl Refusal for TrafficError {
    fn grpc_code(&self) -> Code {
        match self {
            TrafficError::TooFrequent { .. } => Code::ResourceExhausted,
            _ => Code::InvalidArgument,
        }
    }
    fn stable_code(&self) -> &'static str {
        self.code()
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        self.metadata()
    }
    fn retry_after(&self) -> Option<Duration> {
        match self {
            TrafficError::TooFrequent { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl From<TrafficError> for Status {
    fn from(err: TrafficError) -> Self {
        err.status()
    }
}

/// The store's refusals: nothing was acknowledged, so asking again is safe
/// where the store says when.
impl Refusal for StoreError {
    fn grpc_code(&self) -> Code {
        match self {
            StoreError::Backend { .. } | StoreError::Closed | StoreError::Backlogged { .. } => {
                Code::Unavailable
            }
            // Other replicas kept winning the race for this activity: the
            // ledger gave up deciding again; the client may ask again.
            StoreError::Conflict { .. } => Code::Aborted,
            StoreError::Corrupt { .. } => Code::Internal,
        }
    }
    fn stable_code(&self) -> &'static str {
        self.code()
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        match self {
            StoreError::Backend { op, .. } => vec![("operation", (*op).to_owned())],
            StoreError::Conflict { key } => vec![("activity", key.clone())],
            StoreError::Backlogged { retry_after } => {
                vec![("retry_after_ms", retry_after.as_millis().to_string())]
            }
            StoreError::Closed | StoreError::Corrupt { .. } => Vec::new(),
        }
    }
    fn retry_after(&self) -> Option<Duration> {
        StoreError::retry_after(self)
    }
}

/// A stored record that cannot be read: logged here, and not echoed.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: a stored record cannot be read; see the server log",
    codes::INTERNAL
)]
struct Internal;

impl Refusal for Internal {
    fn grpc_code(&self) -> Code {
        Code::Internal
    }
    fn stable_code(&self) -> &'static str {
        codes::INTERNAL
    }
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Backend { .. } | StoreError::Closed => {
                tracing::warn!(error = %err, "store unavailable");
            }
            StoreError::Corrupt { .. } => {
                tracing::error!(error = %err, "stored record cannot be read");
                return Internal.status();
            }
            // The store logs once when it starts and stops refusing; a
            // conflict is the caller's to ask again.
            StoreError::Backlogged { .. } | StoreError::Conflict { .. } => {}
        }
        err.status()
    }
}

impl From<LedgerError> for Status {
    fn from(err: LedgerError) -> Self {
        match err {
            LedgerError::Budget(e) => e.into(),
            LedgerError::Store(e) => e.into(),
        }
    }
}

/// A call that arrives while the server drains.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: the server is draining; ask another replica",
    codes::SHUTTING_DOWN
)]
struct ShuttingDown;

impl Refusal for ShuttingDown {
    fn grpc_code(&self) -> Code {
        Code::Unavailable
    }
    fn stable_code(&self) -> &'static str {
        codes::SHUTTING_DOWN
    }
}

/// The status of a call that arrives while the server drains.
pub(super) fn draining() -> Status {
    ShuttingDown.status()
}

/// A request refused at the wire: its bytes, or its size. The message is
/// built where the refusal is found.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Wire {
    grpc: Code,
    code: &'static str,
    message: String,
    details: Vec<(&'static str, String)>,
}

impl Refusal for Wire {
    fn grpc_code(&self) -> Code {
        self.grpc
    }
    fn stable_code(&self) -> &'static str {
        self.code
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        self.details.clone()
    }
}

/// What prost says of a string field that is not UTF-8.
const INVALID_STRING: &str = "invalid string value: data is not UTF-8 encoded";

/// The refusal of a request whose bytes do not decode as `message` (its
/// type's name): `invalid_utf8` naming the string field when that is why,
/// `malformed_request` otherwise, both `INVALID_ARGUMENT`.
///
/// prost keeps what it found private and says it only in its `Display`:
/// `failed to decode Protobuf message: <Message>.<field>: ...: <why>`, one
/// `Message.field` for each level of nesting, innermost first. The field's
/// path is read from there, so that a client learns which field to fix;
/// a test below pins the text of the prost this is built with.
pub(super) fn undecodable(message: &'static str, error: &prost::DecodeError) -> Status {
    let text = error.to_string();
    let (stack, why) = decode_error_parts(&text);
    // Innermost first: the path from the request down is the reverse.
    let path = stack
        .iter()
        .rev()
        .map(|(_, field)| *field)
        .collect::<Vec<_>>()
        .join(".");
    if why == INVALID_STRING && !path.is_empty() {
        return Wire {
            grpc: Code::InvalidArgument,
            code: codes::INVALID_UTF8,
            message: format!(
                "{}: {path} of {message} is not valid UTF-8",
                codes::INVALID_UTF8
            ),
            details: vec![("field", path), ("message", message.to_owned())],
        }
        .status();
    }
    let mut details = vec![("message", message.to_owned()), ("reason", why.to_owned())];
    if !path.is_empty() {
        details.push(("field", path));
    }
    Wire {
        grpc: Code::InvalidArgument,
        code: codes::MALFORMED_REQUEST,
        message: format!(
            "{}: the request is not a valid {message}: {}",
            codes::MALFORMED_REQUEST,
            text.strip_prefix(DECODE_PREFIX).unwrap_or(&text)
        ),
        details,
    }
    .status()
}

/// How prost's `DecodeError` starts its `Display`.
const DECODE_PREFIX: &str = "failed to decode Protobuf message: ";

/// The `(message, field)` pairs of a prost decode error's text, innermost
/// first, and its description.
fn decode_error_parts(text: &str) -> (Vec<(&str, &str)>, &str) {
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let mut rest = text.strip_prefix(DECODE_PREFIX).unwrap_or(text);
    let mut stack = Vec::new();
    while let Some((head, tail)) = rest.split_once(": ") {
        match head.split_once('.') {
            Some((message, field)) if ident(message) && ident(field) => {
                stack.push((message, field));
                rest = tail;
            }
            _ => break,
        }
    }
    (stack, rest)
}

/// The refusal of a request message of `size` bytes, over `limit`: the
/// limit is the server's (`[limits] max_message_bytes`), so asking again
/// with the same message cannot help: no `RetryInfo`.
pub(super) fn message_too_large(size: usize, limit: usize) -> Status {
    Wire {
        grpc: Code::ResourceExhausted,
        code: codes::MESSAGE_TOO_LARGE,
        message: format!(
            "{}: the request message is {size} bytes, more than the {limit} this server takes \
             ([limits] max_message_bytes)",
            codes::MESSAGE_TOO_LARGE
        ),
        details: vec![("size", size.to_string()), ("limit", limit.to_string())],
    }
    .status()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic_types::StatusExt;

    use super::*;
    use crate::refusal::RETRY_PUSHBACK;

    #[test]
    fn a_backlogged_store_is_unavailable_with_its_code_and_a_pushback() {
        let status = Status::from(StoreError::Backlogged {
            retry_after: Duration::from_millis(250),
        });
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().starts_with("store_backlogged: "),
            "{}",
            status.message()
        );
        assert_eq!(
            status
                .metadata()
                .get(RETRY_PUSHBACK)
                .map(|v| v.to_str().unwrap()),
            Some("250")
        );
        let details = status.get_error_details();
        let info = details.error_info().expect("an ErrorInfo");
        assert_eq!(info.reason, "store_backlogged");
        assert_eq!(info.domain, ERROR_DOMAIN);
        assert_eq!(
            details.retry_info().and_then(|r| r.retry_delay),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn a_budget_refusal_names_its_code_in_error_info_and_has_no_retry_info() {
        let status = Status::from(BudgetError::AttemptMustBePositive);
        assert_eq!(status.code(), Code::InvalidArgument);
        let details = status.get_error_details();
        assert_eq!(
            details.error_info().map(|i| i.reason.as_str()),
            Some(codes::ATTEMPT_MUST_BE_POSITIVE)
        );
        assert!(details.retry_info().is_none());
    }

    /// The text `undecodable` reads is prost's: if a prost release changes
    /// it, this fails rather than every bad string becoming
    /// `malformed_request`.
    #[test]
    fn prost_names_the_field_that_is_not_utf8_as_undecodable_reads_it() {
        use prost::Message;

        use crate::grpc::pb;
        // activity_id (2) holds 0xff; error (4).retry_after (6) holds 0xc3.
        let top = [0x12, 0x01, 0xff];
        let nested = [0x22, 0x03, 0x32, 0x01, 0xc3];
        for (bytes, field) in [
            (&top[..], "activity_id"),
            (&nested[..], "error.retry_after"),
        ] {
            let error = pb::NextActionRequest::decode(bytes).unwrap_err();
            let status = undecodable("NextActionRequest", &error);
            assert_eq!(status.code(), Code::InvalidArgument);
            let info = status.get_error_details().error_info().cloned().unwrap();
            assert_eq!(info.reason, codes::INVALID_UTF8, "{error}");
            assert_eq!(info.metadata.get("field").map(String::as_str), Some(field));
            assert!(status.message().starts_with("invalid_utf8: "));
        }
        let error = pb::NextActionRequest::decode(&[0x12, 0x05, b'c'][..]).unwrap_err();
        let status = undecodable("NextActionRequest", &error);
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, codes::MALFORMED_REQUEST);
        assert_eq!(
            info.metadata.get("message").map(String::as_str),
            Some("NextActionRequest")
        );
    }

    #[test]
    fn a_budget_refusal_carries_the_values_involved() {
        let status = Status::from(BudgetError::AttemptOutOfOrder {
            expected: 3,
            got: 5,
        });
        let info = status.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.metadata.get("expected").map(String::as_str), Some("3"));
        assert_eq!(info.metadata.get("got").map(String::as_str), Some("5"));
        assert!(status.message().starts_with("attempt_out_of_order: "));
    }
}
