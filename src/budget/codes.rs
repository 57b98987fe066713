//! Stable codes: the strings clients match on. Defined once, here; every
//! layer (gRPC status messages, CLI output, stored events) uses these
//! constants, so a code can never drift between two places.
//!
//! Action codes are the reference `next_action` results; error codes start
//! the message of every refusal (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`,
//! `NOT_FOUND`, `UNAVAILABLE`), and of the errors the server stops on.

/// A retry is scheduled.
pub const SCHEDULE_RETRY: &str = "schedule_retry";
/// The attempt budget is spent.
pub const ATTEMPTS_EXHAUSTED: &str = "attempts_exhausted";
/// The deadline has passed or would pass before the next retry.
pub const DEADLINE_EXCEEDED: &str = "deadline_exceeded";
/// A permanent failure: never retried.
pub const FAIL_PERMANENT: &str = "fail_permanent";
/// Nobody can tell whether a retry is safe.
pub const MANUAL_REVIEW: &str = "manual_review";
/// The global retry capacity is exhausted for now.
pub const DEFERRED: &str = "deferred";

/// Closing code of an activity whose attempt succeeded.
pub const SUCCEEDED: &str = "succeeded";
/// Closing code of a parked activity a reviewer failed.
pub const RESOLVED_FAILED: &str = "resolved_failed";
/// Event code of a parked activity a reviewer reopened.
pub const RESOLVED_RETRY: &str = "resolved_retry";

/// Deferral reason: the tenant has taken its share while other tenants want
/// theirs; its next slot is booked.
pub const TENANT_SHARE_EXHAUSTED: &str = "tenant_share_exhausted";
/// Deferral reason: the global bucket is empty, or this replica holds no
/// grant yet.
pub const GLOBAL_CAPACITY_EXHAUSTED: &str = "global_capacity_exhausted";
/// Deferral reason: the dependency the failed call went to has used the
/// retries its pace allows, or the tenant's retries deferred earlier wait
/// ahead in line.
pub const DEPENDENCY_BUDGET_EXHAUSTED: &str = "dependency_budget_exhausted";
/// A dependency name that is too long or has characters outside printable
/// ASCII.
pub const INVALID_DEPENDENCY: &str = "invalid_dependency";
/// A traffic report's counts that cannot be: above the per-report maximum,
/// or successes plus failures above calls.
pub const INVALID_TRAFFIC: &str = "invalid_traffic";
/// A traffic report naming more dependencies than one report may.
pub const TOO_MANY_DEPENDENCIES: &str = "too_many_dependencies";
/// A tenant sending traffic reports faster than it may.
pub const TRAFFIC_REPORTS_TOO_FREQUENT: &str = "traffic_reports_too_frequent";
/// Deferral reason: the tenant's line of the dependency is full; no place
/// was taken, ask again later.
pub const TENANT_BACKLOG_FULL: &str = "tenant_backlog_full";
/// A deferral reason of earlier releases (a booked slot past the caller's
/// wait), no longer sent; kept so that recorded events and clients that
/// match on it still read.
pub const RESERVATION_PAST_MAX_WAIT: &str = "reservation_past_max_wait";

/// The reference's error for an attempt number below 1.
pub const ATTEMPT_MUST_BE_POSITIVE: &str = "attempt_must_be_positive";
/// The reference's error for a class that is not transient, permanent or
/// unknown.
pub const UNKNOWN_ERROR_CLASS: &str = "unknown_error_class";
/// An activity id of zero bytes.
pub const EMPTY_ACTIVITY_ID: &str = "empty_activity_id";
/// An activity id over [`MAX_ID_BYTES`](crate::budget::activity::MAX_ID_BYTES).
pub const ACTIVITY_ID_TOO_LONG: &str = "activity_id_too_long";
/// An activity id with a control character (which would corrupt logs and
/// the CLI's output).
pub const ACTIVITY_ID_CONTROL_CHARACTER: &str = "activity_id_control_character";
/// A tenant id that is empty, too long, or has characters outside printable
/// ASCII.
pub const INVALID_TENANT: &str = "invalid_tenant";
/// A workflow id that is too long or has control characters.
pub const INVALID_WORKFLOW_ID: &str = "invalid_workflow_id";
/// A timestamp outside `google.protobuf.Timestamp`'s range (0001-01-01 to
/// 9999-12-31, nanos 0 to 999,999,999).
pub const INVALID_TIMESTAMP: &str = "invalid_timestamp";
/// A valid timestamp further from the server's clock than
/// `[limits] max_timestamp_past` or `max_timestamp_future` allow.
pub const TIMESTAMP_IMPLAUSIBLE: &str = "timestamp_implausible";
/// A request whose string field is not valid UTF-8 (`INVALID_ARGUMENT`).
pub const INVALID_UTF8: &str = "invalid_utf8";
/// A request whose bytes are not a protobuf message of its type
/// (`INVALID_ARGUMENT`).
pub const MALFORMED_REQUEST: &str = "malformed_request";
/// A request message larger than `[limits] max_message_bytes`
/// (`RESOURCE_EXHAUSTED`).
pub const MESSAGE_TOO_LARGE: &str = "message_too_large";
/// A failure reported at a logical time before the activity started.
pub const OCCURRED_BEFORE_START: &str = "occurred_before_start";
/// A resolution that is neither fail nor retry.
pub const UNKNOWN_RESOLUTION: &str = "unknown_resolution";

/// A durable report that skips attempts.
pub const ATTEMPT_OUT_OF_ORDER: &str = "attempt_out_of_order";
/// A durable report for an activity that is already closed.
pub const ACTIVITY_CLOSED: &str = "activity_closed";
/// A new report for an activity parked for manual review.
pub const ACTIVITY_PARKED: &str = "activity_parked";
/// A resolution for an activity that is not parked.
pub const ACTIVITY_NOT_PARKED: &str = "activity_not_parked";
/// An activity the store does not hold.
pub const ACTIVITY_NOT_FOUND: &str = "activity_not_found";

// Server hints (`ServerHint.source`, `ServerHint.ignored`).

/// Source: `Retry-After` as delay-seconds.
pub const SOURCE_RETRY_AFTER_SECONDS: &str = "retry_after_seconds";
/// Source: `Retry-After` as an HTTP-date.
pub const SOURCE_RETRY_AFTER_DATE: &str = "retry_after_date";
/// Source: `grpc-retry-pushback-ms`.
pub const SOURCE_GRPC_RETRY_PUSHBACK: &str = "grpc_retry_pushback";
/// Source: `google.rpc.RetryInfo.retry_delay`.
pub const SOURCE_RETRY_INFO: &str = "retry_info";

/// Reason: `Retry-After` is neither delay-seconds nor an HTTP-date
/// (garbage, a sign, a fraction, a wrong weekday...); ignored.
pub const RETRY_AFTER_INVALID: &str = "retry_after_invalid";
/// Reason: `Retry-After` is an HTTP-date but the response's `Date` is not;
/// the date was measured against `occurred_at` instead.
pub const DATE_INVALID: &str = "date_invalid";
/// Reason: the `RetryInfo` delay is negative or not a valid `Duration`;
/// ignored.
pub const RETRY_INFO_INVALID: &str = "retry_info_invalid";
/// Reason: a negative `grpc-retry-pushback-ms`, the server asking not to
/// retry ([`Hint::do_not_retry`](super::hint::Hint::do_not_retry)).
pub const GRPC_PUSHBACK_DO_NOT_RETRY: &str = "grpc_pushback_do_not_retry";

// The server, its configuration and its edge.

/// A call that arrived after the server's drain delay, as it closes
/// (`UNAVAILABLE`): ask another replica.
pub const SHUTTING_DOWN: &str = "shutting_down";
/// Something unexpected failed inside the server (`INTERNAL`); the details
/// are in its log, not in the answer.
pub const INTERNAL: &str = "internal";
/// A call on a connection past the server's `max_connections`
/// (`UNAVAILABLE`, with a time to come back): the connection is closed
/// after the answer, and a new one may find room or another replica.
pub const TOO_MANY_CONNECTIONS: &str = "too_many_connections";
/// A call still running at the server's `request_timeout`
/// (`DEADLINE_EXCEEDED`); a save already handed to the store commits all
/// the same, and the same report again replays it.
pub const REQUEST_TIMEOUT: &str = "request_timeout";
/// The configuration file cannot be read.
pub const CONFIG_UNREADABLE: &str = "config_unreadable";
/// The configuration file, or a flag or variable, is not a valid
/// configuration.
pub const CONFIG_INVALID: &str = "config_invalid";

// Who asks (authentication, `src/auth/`).

/// No `x-tenant-id` where the configuration requires one
/// (`auth.default_tenant = ""`): `INVALID_ARGUMENT`.
pub const TENANT_REQUIRED: &str = "tenant_required";
/// No credential, or one the server does not accept (`UNAUTHENTICATED`);
/// which of the two is never said.
pub const UNAUTHENTICATED: &str = "unauthenticated";
/// The caller proved one tenant and named another in `x-tenant-id`
/// (`PERMISSION_DENIED`).
pub const TENANT_MISMATCH: &str = "tenant_mismatch";
/// The mesh proved an identity that the configured pattern maps to no
/// tenant (`PERMISSION_DENIED`).
pub const IDENTITY_NOT_MAPPED: &str = "identity_not_mapped";

// The store.

/// The store failed an operation (the database or the journal): nothing
/// was acknowledged, so asking again is safe.
pub const STORE_UNAVAILABLE: &str = "store_unavailable";
/// A stored record cannot be decoded.
pub const STORE_CORRUPT: &str = "store_corrupt";
/// The store is shutting down and takes no more writes.
pub const STORE_CLOSED: &str = "store_closed";
/// Too many saves wait to be written (the disk is slower than the
/// requests): the store refuses new ones, with a time to come back, until
/// the writer catches up.
pub const STORE_BACKLOGGED: &str = "store_backlogged";
/// Another replica kept changing the activity while this one decided, more
/// times in a row than the ledger tries again: nothing was acknowledged,
/// and asking again is safe.
pub const STORE_CONFLICT: &str = "store_conflict";

/// Every stable code, the decisions' first (the most frequent first), so
/// that [`intern`] finds the common ones at once.
pub const ALL: &[&str] = &[
    SCHEDULE_RETRY,
    ATTEMPTS_EXHAUSTED,
    DEADLINE_EXCEEDED,
    FAIL_PERMANENT,
    MANUAL_REVIEW,
    DEFERRED,
    SUCCEEDED,
    RESOLVED_FAILED,
    RESOLVED_RETRY,
    TENANT_SHARE_EXHAUSTED,
    GLOBAL_CAPACITY_EXHAUSTED,
    TENANT_BACKLOG_FULL,
    DEPENDENCY_BUDGET_EXHAUSTED,
    RESERVATION_PAST_MAX_WAIT,
    INVALID_DEPENDENCY,
    INVALID_TRAFFIC,
    TOO_MANY_DEPENDENCIES,
    TRAFFIC_REPORTS_TOO_FREQUENT,
    ATTEMPT_MUST_BE_POSITIVE,
    UNKNOWN_ERROR_CLASS,
    EMPTY_ACTIVITY_ID,
    ACTIVITY_ID_TOO_LONG,
    ACTIVITY_ID_CONTROL_CHARACTER,
    INVALID_TENANT,
    INVALID_WORKFLOW_ID,
    INVALID_TIMESTAMP,
    TIMESTAMP_IMPLAUSIBLE,
    INVALID_UTF8,
    MALFORMED_REQUEST,
    MESSAGE_TOO_LARGE,
    OCCURRED_BEFORE_START,
    UNKNOWN_RESOLUTION,
    ATTEMPT_OUT_OF_ORDER,
    ACTIVITY_CLOSED,
    ACTIVITY_PARKED,
    ACTIVITY_NOT_PARKED,
    ACTIVITY_NOT_FOUND,
    SOURCE_RETRY_AFTER_SECONDS,
    SOURCE_RETRY_AFTER_DATE,
    SOURCE_GRPC_RETRY_PUSHBACK,
    SOURCE_RETRY_INFO,
    RETRY_AFTER_INVALID,
    DATE_INVALID,
    RETRY_INFO_INVALID,
    GRPC_PUSHBACK_DO_NOT_RETRY,
    SHUTTING_DOWN,
    INTERNAL,
    TOO_MANY_CONNECTIONS,
    REQUEST_TIMEOUT,
    CONFIG_UNREADABLE,
    CONFIG_INVALID,
    TENANT_REQUIRED,
    UNAUTHENTICATED,
    TENANT_MISMATCH,
    IDENTITY_NOT_MAPPED,
    STORE_UNAVAILABLE,
    STORE_CORRUPT,
    STORE_CLOSED,
    STORE_BACKLOGGED,
    STORE_CONFLICT,
];

/// The code equal to `code` as a `&'static str` (for metric labels, which
/// must not allocate on the request path), or `"other"` for a text that is
/// not a stable code.
pub fn intern(code: &str) -> &'static str {
    ALL.iter().find(|c| **c == code).copied().unwrap_or("other")
}
