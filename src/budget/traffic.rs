//! A worker's traffic report (`ReportTraffic`), checked: every number a
//! client sends is bounded and consistent, so no count can wrap a sum or
//! claim more successes than calls.

use super::codes;
use super::error::{MAX_DEPENDENCY_BYTES, validate_dependency};

/// Most calls one report may count for one dependency: a worker reports
/// about once a second, and no worker makes a million calls a second to
/// one dependency.
pub const MAX_REPORTED_CALLS: u64 = 1_000_000;
/// Most dependencies one report may name.
pub const MAX_REPORTED_DEPENDENCIES: usize = 64;

/// One dependency's counts, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traffic<'a> {
    /// The dependency (empty: the default one).
    pub dependency: &'a str,
    /// Calls made.
    pub calls: u64,
    /// Of those, calls that succeeded.
    pub successes: u64,
    /// Of those, calls that failed.
    pub failures: u64,
}

/// A traffic report refused; nothing of it was counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrafficError {
    /// A dependency name that is too long or not printable ASCII.
    #[error(
        "{}: dependencies[{index}].dependency must be empty (the default) or 1 to {MAX_DEPENDENCY_BYTES} printable ASCII characters without spaces",
        codes::INVALID_DEPENDENCY
    )]
    InvalidDependency {
        /// Which entry.
        index: usize,
    },
    /// Counts that cannot be: above the per-report maximum, or successes
    /// plus failures above calls.
    #[error(
        "{}: dependencies[{index}].{field}: each count is at most {MAX_REPORTED_CALLS} a report, and successes plus failures at most calls",
        codes::INVALID_TRAFFIC
    )]
    InvalidCounts {
        /// Which entry.
        index: usize,
        /// Which count: `calls`, `successes` or `failures`.
        field: &'static str,
    },
    /// More dependencies than one report may name.
    #[error(
        "{}: dependencies names {got} dependencies, at most {MAX_REPORTED_DEPENDENCIES} a report",
        codes::TOO_MANY_DEPENDENCIES
    )]
    TooManyDependencies {
        /// How many it named.
        got: usize,
    },
    /// The tenant sends reports faster than it may.
    #[error(
        "{}: the tenant sends traffic reports faster than {per_second} a second; retry after {} ms",
        codes::TRAFFIC_REPORTS_TOO_FREQUENT,
        retry_after.as_millis()
    )]
    TooFrequent {
        /// The tenant's limit, reports a second.
        per_second: u32,
        /// When the next report is accepted.
        retry_after: std::time::Duration,
    },
}

impl TrafficError {
    /// The stable code that starts the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidDependency { .. } => codes::INVALID_DEPENDENCY,
            Self::InvalidCounts { .. } => codes::INVALID_TRAFFIC,
            Self::TooManyDependencies { .. } => codes::TOO_MANY_DEPENDENCIES,
            Self::TooFrequent { .. } => codes::TRAFFIC_REPORTS_TOO_FREQUENT,
        }
    }

    /// The values involved, as `ErrorInfo.metadata`: `field` is the path
    /// of the offending field in the request (`dependencies[2].successes`).
    pub fn metadata(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::InvalidDependency { index } => vec![
                ("field", format!("dependencies[{index}].dependency")),
                ("limit", MAX_DEPENDENCY_BYTES.to_string()),
            ],
            Self::InvalidCounts { index, field } => vec![
                ("field", format!("dependencies[{index}].{field}")),
                ("limit", MAX_REPORTED_CALLS.to_string()),
            ],
            Self::TooManyDependencies { got } => vec![
                ("field", "dependencies".to_owned()),
                ("got", got.to_string()),
                ("limit", MAX_REPORTED_DEPENDENCIES.to_string()),
            ],
            Self::TooFrequent {
                per_second,
                retry_after,
            } => vec![
                ("limit", per_second.to_string()),
                ("retry_after_ms", retry_after.as_millis().to_string()),
            ],
        }
    }
}

/// Checks a whole report before anything of it is counted.
///
/// # Errors
/// The first [`TrafficError`] found, in the order of the entries.
pub fn validate(report: &[Traffic<'_>]) -> Result<(), TrafficError> {
    if report.len() > MAX_REPORTED_DEPENDENCIES {
        return Err(TrafficError::TooManyDependencies { got: report.len() });
    }
    for (index, t) in report.iter().enumerate() {
        if validate_dependency(t.dependency).is_err() {
            return Err(TrafficError::InvalidDependency { index });
        }
        let bad = |field| Err(TrafficError::InvalidCounts { index, field });
        if t.calls > MAX_REPORTED_CALLS {
            return bad("calls");
        }
        if t.successes > t.calls {
            return bad("successes");
        }
        if t.failures > t.calls - t.successes {
            return bad("failures");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(calls: u64, successes: u64, failures: u64) -> Traffic<'static> {
        Traffic {
            dependency: "api",
            calls,
            successes,
            failures,
        }
    }

    #[test]
    fn counts_are_checked_against_each_other_and_the_maximum_with_their_path() {
        assert_eq!(validate(&[t(10, 7, 3)]), Ok(()));
        let err = validate(&[t(1, 1, 0), t(1, 1, 0), t(0, u64::MAX, 0)]).unwrap_err();
        assert_eq!(
            err,
            TrafficError::InvalidCounts {
                index: 2,
                field: "successes"
            }
        );
        assert_eq!(err.metadata()[0].1, "dependencies[2].successes");
        assert!(
            err.to_string()
                .starts_with("invalid_traffic: dependencies[2].successes")
        );
        assert_eq!(
            validate(&[t(5, 3, 3)]),
            Err(TrafficError::InvalidCounts {
                index: 0,
                field: "failures"
            })
        );
        assert_eq!(
            validate(&[t(MAX_REPORTED_CALLS + 1, 0, 0)]),
            Err(TrafficError::InvalidCounts {
                index: 0,
                field: "calls"
            })
        );
        let bad_name = Traffic {
            dependency: "has space",
            ..t(0, 0, 0)
        };
        let err = validate(&[t(0, 0, 0), bad_name]).unwrap_err();
        assert_eq!(err.metadata()[0].1, "dependencies[1].dependency");
        let many = vec![t(0, 0, 0); MAX_REPORTED_DEPENDENCIES + 1];
        assert!(matches!(
            validate(&many),
            Err(TrafficError::TooManyDependencies { .. })
        ));
    }
}
