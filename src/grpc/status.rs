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

use tonic::{Code, Status};

pub use crate::refusal::{ERROR_DOMAIN, refusal};

use crate::budget::activity::{BudgetError, ErrorKind};
use crate::budget::codes;
use crate::ledger::LedgerError;
use crate::store::StoreError;

impl From<BudgetError> for Status {
    fn from(err: BudgetError) -> Self {
        let grpc = match err.kind() {
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::FailedPrecondition => Code::FailedPrecondition,
            ErrorKind::NotFound => Code::NotFound,
        };
        refusal(grpc, err.code(), err.to_string(), err.metadata(), None)
    }
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        let grpc = match err {
            StoreError::Backend { .. } | StoreError::Closed => {
                tracing::warn!(error = %err, "store unavailable");
                Code::Unavailable
            }
            // The store logs once when it starts and stops refusing.
            StoreError::Backlogged { .. } => Code::Unavailable,
            // Other replicas kept winning the race for this activity: the
            // ledger gave up deciding again; the client may ask again.
            StoreError::Conflict { .. } => Code::Aborted,
            StoreError::Corrupt { .. } => {
                tracing::error!(error = %err, "stored record cannot be read");
                return refusal(
                    Code::Internal,
                    codes::INTERNAL,
                    format!(
                        "{}: a stored record cannot be read; see the server log",
                        codes::INTERNAL
                    ),
                    [],
                    None,
                );
            }
        };
        let metadata = match &err {
            StoreError::Backend { op, .. } => vec![("operation", (*op).to_owned())],
            StoreError::Conflict { key } => vec![("activity", key.clone())],
            StoreError::Backlogged { retry_after } => {
                vec![("retry_after_ms", retry_after.as_millis().to_string())]
            }
            StoreError::Closed | StoreError::Corrupt { .. } => Vec::new(),
        };
        refusal(
            grpc,
            err.code(),
            err.to_string(),
            metadata,
            err.retry_after(),
        )
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

/// The status of a call that arrives while the server drains.
pub(super) fn draining() -> Status {
    refusal(
        Code::Unavailable,
        codes::SHUTTING_DOWN,
        format!(
            "{}: the server is draining; ask another replica",
            codes::SHUTTING_DOWN
        ),
        [],
        None,
    )
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
        return refusal(
            Code::InvalidArgument,
            codes::INVALID_UTF8,
            format!(
                "{}: {path} of {message} is not valid UTF-8",
                codes::INVALID_UTF8
            ),
            [("field", path), ("message", message.to_owned())],
            None,
        );
    }
    let mut metadata = vec![("message", message.to_owned()), ("reason", why.to_owned())];
    if !path.is_empty() {
        metadata.push(("field", path));
    }
    refusal(
        Code::InvalidArgument,
        codes::MALFORMED_REQUEST,
        format!(
            "{}: the request is not a valid {message}: {}",
            codes::MALFORMED_REQUEST,
            text.strip_prefix(DECODE_PREFIX).unwrap_or(&text)
        ),
        metadata,
        None,
    )
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
    refusal(
        Code::ResourceExhausted,
        codes::MESSAGE_TOO_LARGE,
        format!(
            "{}: the request message is {size} bytes, more than the {limit} this server takes \
             ([limits] max_message_bytes)",
            codes::MESSAGE_TOO_LARGE
        ),
        [("size", size.to_string()), ("limit", limit.to_string())],
        None,
    )
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
