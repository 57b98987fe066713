//! What the core refuses, and the checks of identifiers every layer shares:
//! each refusal has a stable code (see [`codes`]) and a kind the gRPC edge
//! maps to a status.

use std::time::Duration;

use super::codes;
use super::tenant::{MAX_TENANT_BYTES, TENANT_HEADER};
use super::timestamp::{MAX_SECONDS, MIN_SECONDS, Side, describe, rfc3339};

/// The longest activity or workflow id, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// A request the core refuses. Each variant has a stable [`code`](Self::code)
/// and a [`kind`](Self::kind) that the gRPC edge maps to a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// Attempt numbers start at 1.
    #[error("{}: attempt must be at least 1", codes::ATTEMPT_MUST_BE_POSITIVE)]
    AttemptMustBePositive,
    /// The class is not transient, permanent or unknown.
    #[error(
        "{}: the error class must be transient, permanent or unknown",
        codes::UNKNOWN_ERROR_CLASS
    )]
    UnknownErrorClass,
    /// An empty activity id.
    #[error("{}: activity_id must not be empty", codes::EMPTY_ACTIVITY_ID)]
    EmptyActivityId,
    /// An activity id over [`MAX_ID_BYTES`].
    #[error(
        "{}: activity_id is {len} bytes, at most {MAX_ID_BYTES} allowed",
        codes::ACTIVITY_ID_TOO_LONG
    )]
    ActivityIdTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// An activity id with a control character.
    #[error(
        "{}: activity_id has a control character at byte {at}",
        codes::ACTIVITY_ID_CONTROL_CHARACTER
    )]
    ActivityIdControlCharacter {
        /// Byte offset of the first one.
        at: usize,
    },
    /// A tenant id that is empty, too long or not printable ASCII.
    #[error(
        "{}: x-tenant-id must be 1 to {MAX_TENANT_BYTES} printable ASCII characters",
        codes::INVALID_TENANT
    )]
    InvalidTenant,
    /// A workflow id that is too long or has a control character.
    #[error(
        "{}: workflow_id must be at most {MAX_ID_BYTES} bytes without control characters",
        codes::INVALID_WORKFLOW_ID
    )]
    InvalidWorkflowId,
    /// A dependency name that is too long or not printable ASCII.
    #[error(
        "{}: dependency must be empty (the default) or 1 to {MAX_DEPENDENCY_BYTES} printable ASCII characters without spaces",
        codes::INVALID_DEPENDENCY
    )]
    InvalidDependency,
    /// A timestamp outside `google.protobuf.Timestamp`'s range.
    #[error(
        "{}: {field} {{seconds: {seconds}, nanos: {nanos}}} is not a valid Timestamp \
         (0001-01-01 to 9999-12-31, nanos 0 to 999999999)",
        codes::INVALID_TIMESTAMP
    )]
    InvalidTimestamp {
        /// The field that holds it.
        field: &'static str,
        /// Its seconds, as sent.
        seconds: i64,
        /// Its nanos, as sent.
        nanos: i32,
    },
    /// A valid timestamp too far from the server's clock.
    #[error(
        "{}: {field} {} is {}",
        codes::TIMESTAMP_IMPLAUSIBLE,
        rfc3339(*at_ms),
        describe(*side, *limit)
    )]
    TimestampImplausible {
        /// The field that holds it.
        field: &'static str,
        /// Its value, unix milliseconds.
        at_ms: i64,
        /// The server's clock, unix milliseconds.
        now_ms: i64,
        /// Which bound it broke.
        side: Side,
        /// That bound.
        limit: Duration,
    },
    /// A failure reported before the activity's first failure.
    #[error(
        "{}: occurred_at {occurred_at_ms} ms is before the activity's started_at {started_at_ms} ms",
        codes::OCCURRED_BEFORE_START
    )]
    OccurredBeforeStart {
        /// The report's logical time.
        occurred_at_ms: i64,
        /// The activity's recorded start.
        started_at_ms: i64,
    },
    /// A resolution that is neither fail nor retry.
    #[error("{}: resolution must be fail or retry", codes::UNKNOWN_RESOLUTION)]
    UnknownResolution,
    /// A report that skips attempts.
    #[error(
        "{}: expected attempt {expected} (or an earlier one to replay), got {got}",
        codes::ATTEMPT_OUT_OF_ORDER
    )]
    AttemptOutOfOrder {
        /// The next attempt the activity expects.
        expected: u32,
        /// The attempt reported.
        got: u32,
    },
    /// A new report for a closed activity.
    #[error(
        "{}: the activity was closed with {code} after attempt {attempts}",
        codes::ACTIVITY_CLOSED
    )]
    ActivityClosed {
        /// The code that closed it.
        code: String,
        /// Its last recorded attempt.
        attempts: u32,
    },
    /// A new report for an activity parked for manual review.
    #[error(
        "{}: attempt {attempts} is waiting for manual review; resolve it first",
        codes::ACTIVITY_PARKED
    )]
    ActivityParked {
        /// The attempt that was parked.
        attempts: u32,
    },
    /// A resolution for an activity that is not parked.
    #[error(
        "{}: only an activity parked for manual review can be resolved; this one is {status}",
        codes::ACTIVITY_NOT_PARKED
    )]
    ActivityNotParked {
        /// Where it stands.
        status: &'static str,
    },
    /// An activity the store does not hold.
    #[error(
        "{}: no activity {activity_id:?} for tenant {tenant:?}",
        codes::ACTIVITY_NOT_FOUND
    )]
    ActivityNotFound {
        /// The tenant asked for.
        tenant: String,
        /// The activity asked for.
        activity_id: String,
    },
}

/// How the gRPC edge should report a [`BudgetError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request itself is malformed.
    InvalidArgument,
    /// The request is well formed but contradicts what is stored.
    FailedPrecondition,
    /// The request names something that does not exist.
    NotFound,
}

impl BudgetError {
    /// The stable code that starts the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::AttemptMustBePositive => codes::ATTEMPT_MUST_BE_POSITIVE,
            Self::UnknownErrorClass => codes::UNKNOWN_ERROR_CLASS,
            Self::EmptyActivityId => codes::EMPTY_ACTIVITY_ID,
            Self::ActivityIdTooLong { .. } => codes::ACTIVITY_ID_TOO_LONG,
            Self::ActivityIdControlCharacter { .. } => codes::ACTIVITY_ID_CONTROL_CHARACTER,
            Self::InvalidTenant => codes::INVALID_TENANT,
            Self::InvalidWorkflowId => codes::INVALID_WORKFLOW_ID,
            Self::InvalidDependency => codes::INVALID_DEPENDENCY,
            Self::InvalidTimestamp { .. } => codes::INVALID_TIMESTAMP,
            Self::TimestampImplausible { .. } => codes::TIMESTAMP_IMPLAUSIBLE,
            Self::OccurredBeforeStart { .. } => codes::OCCURRED_BEFORE_START,
            Self::UnknownResolution => codes::UNKNOWN_RESOLUTION,
            Self::AttemptOutOfOrder { .. } => codes::ATTEMPT_OUT_OF_ORDER,
            Self::ActivityClosed { .. } => codes::ACTIVITY_CLOSED,
            Self::ActivityParked { .. } => codes::ACTIVITY_PARKED,
            Self::ActivityNotParked { .. } => codes::ACTIVITY_NOT_PARKED,
            Self::ActivityNotFound { .. } => codes::ACTIVITY_NOT_FOUND,
        }
    }

    /// Which kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::AttemptOutOfOrder { .. }
            | Self::ActivityClosed { .. }
            | Self::ActivityParked { .. }
            | Self::ActivityNotParked { .. } => ErrorKind::FailedPrecondition,
            Self::ActivityNotFound { .. } => ErrorKind::NotFound,
            _ => ErrorKind::InvalidArgument,
        }
    }

    /// The values involved, as `google.rpc.ErrorInfo.metadata`: a client
    /// reads which field, which limit, what it sent and what is stored
    /// without parsing the message. Keys are snake_case and stable; `field`
    /// names a request field by its path in the request (`occurred_at`,
    /// `activity_id`).
    pub fn metadata(&self) -> Vec<(&'static str, String)> {
        let field = |name: &'static str| ("field", name.to_owned());
        match self {
            Self::AttemptMustBePositive => vec![field("attempt"), ("got", "0".to_owned())],
            Self::UnknownErrorClass => vec![field("error_class")],
            Self::EmptyActivityId => vec![field("activity_id")],
            Self::ActivityIdTooLong { len } => vec![
                field("activity_id"),
                ("size", len.to_string()),
                ("limit", MAX_ID_BYTES.to_string()),
            ],
            Self::ActivityIdControlCharacter { at } => {
                vec![field("activity_id"), ("at", at.to_string())]
            }
            Self::InvalidTenant => vec![
                ("header", TENANT_HEADER.to_owned()),
                ("limit", MAX_TENANT_BYTES.to_string()),
            ],
            Self::InvalidWorkflowId => {
                vec![field("workflow_id"), ("limit", MAX_ID_BYTES.to_string())]
            }
            Self::InvalidDependency => vec![
                field("dependency"),
                ("limit", MAX_DEPENDENCY_BYTES.to_string()),
            ],
            Self::InvalidTimestamp {
                field: name,
                seconds,
                nanos,
            } => vec![
                field(name),
                ("seconds", seconds.to_string()),
                ("nanos", nanos.to_string()),
                ("min", rfc3339(MIN_SECONDS * 1000)),
                ("max", rfc3339(MAX_SECONDS * 1000 + 999)),
            ],
            Self::TimestampImplausible {
                field: name,
                at_ms,
                now_ms,
                side,
                limit,
            } => vec![
                field(name),
                ("value", rfc3339(*at_ms)),
                ("server_time", rfc3339(*now_ms)),
                ("bound", side.bound().to_owned()),
                ("limit", humantime::format_duration(*limit).to_string()),
            ],
            Self::OccurredBeforeStart {
                occurred_at_ms,
                started_at_ms,
            } => vec![
                field("occurred_at"),
                ("occurred_at", rfc3339(*occurred_at_ms)),
                ("started_at", rfc3339(*started_at_ms)),
            ],
            Self::UnknownResolution => vec![field("resolution")],
            Self::AttemptOutOfOrder { expected, got } => vec![
                field("attempt"),
                ("expected", expected.to_string()),
                ("got", got.to_string()),
            ],
            Self::ActivityClosed { code, attempts } => vec![
                ("status", "closed".to_owned()),
                ("closed_code", code.clone()),
                ("attempts", attempts.to_string()),
            ],
            Self::ActivityParked { attempts } => vec![
                ("status", "parked".to_owned()),
                ("attempts", attempts.to_string()),
            ],
            Self::ActivityNotParked { status } => vec![("status", (*status).to_owned())],
            Self::ActivityNotFound {
                tenant,
                activity_id,
            } => vec![
                ("tenant", tenant.clone()),
                ("activity_id", activity_id.clone()),
            ],
        }
    }
}

/// Checks an activity id: 1 to [`MAX_ID_BYTES`] bytes, no control character.
///
/// # Errors
/// The matching [`BudgetError`] variant.
pub fn validate_activity_id(id: &str) -> Result<(), BudgetError> {
    if id.is_empty() {
        return Err(BudgetError::EmptyActivityId);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(BudgetError::ActivityIdTooLong { len: id.len() });
    }
    if let Some((at, _)) = id.char_indices().find(|(_, c)| c.is_control()) {
        return Err(BudgetError::ActivityIdControlCharacter { at });
    }
    Ok(())
}

/// Checks a workflow id: at most [`MAX_ID_BYTES`] bytes, no control
/// character (empty is allowed: the field is optional).
///
/// # Errors
/// [`BudgetError::InvalidWorkflowId`].
pub fn validate_workflow_id(id: &str) -> Result<(), BudgetError> {
    if id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(BudgetError::InvalidWorkflowId);
    }
    Ok(())
}

/// Longest dependency name, bytes.
pub const MAX_DEPENDENCY_BYTES: usize = 64;

/// Checks a dependency name: empty (the default dependency) or 1 to
/// [`MAX_DEPENDENCY_BYTES`] printable ASCII characters without spaces.
///
/// # Errors
/// [`BudgetError::InvalidDependency`].
pub fn validate_dependency(name: &str) -> Result<(), BudgetError> {
    if name.len() > MAX_DEPENDENCY_BYTES || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BudgetError::InvalidDependency);
    }
    Ok(())
}
