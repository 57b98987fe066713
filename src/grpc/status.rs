//! Errors to `tonic::Status`, in exactly one place.
//!
//! Bad input is `INVALID_ARGUMENT`, a report that contradicts what is stored
//! is `FAILED_PRECONDITION`, an unknown activity is `NOT_FOUND`: each with
//! the stable code first in the message. A store that is down is
//! `UNAVAILABLE` (nothing was acknowledged: safe to ask again). Anything
//! unexpected is `INTERNAL`, logged here and not echoed to the caller.

use tonic::Status;

/// The trailer a server sets to tell gRPC clients when to retry (gRFC A6).
const RETRY_PUSHBACK: &str = "grpc-retry-pushback-ms";

use crate::budget::activity::{BudgetError, ErrorKind};
use crate::budget::codes;
use crate::ledger::LedgerError;
use crate::store::StoreError;

impl From<BudgetError> for Status {
    fn from(err: BudgetError) -> Self {
        let message = err.to_string();
        match err.kind() {
            ErrorKind::InvalidArgument => Status::invalid_argument(message),
            ErrorKind::FailedPrecondition => Status::failed_precondition(message),
            ErrorKind::NotFound => Status::not_found(message),
        }
    }
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        let mut status = match err {
            StoreError::Backend { .. } | StoreError::Closed => {
                tracing::warn!(error = %err, "store unavailable");
                Status::unavailable(err.to_string())
            }
            // The store logs once when it starts and stops refusing.
            StoreError::Backlogged { .. } => Status::unavailable(err.to_string()),
            // Other replicas kept winning the race for this activity: the
            // ledger gave up deciding again; the client may ask again.
            StoreError::Conflict { .. } => Status::aborted(err.to_string()),
            StoreError::Corrupt { .. } => {
                tracing::error!(error = %err, "stored record cannot be read");
                return Status::internal(format!(
                    "{}: a stored record cannot be read; see the server log",
                    codes::INTERNAL
                ));
            }
        };
        // The wait goes back as gRPC's server pushback (gRFC A6), which
        // gRPC clients' retry policies honour.
        if let Some(ms) = err
            .retry_after()
            .and_then(|wait| wait.as_millis().to_string().parse().ok())
        {
            status.metadata_mut().insert(RETRY_PUSHBACK, ms);
        }
        status
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
    Status::unavailable(format!(
        "{}: the server is draining; ask another replica",
        codes::SHUTTING_DOWN
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
    }
}
