//! The service's wall clock, read in one place. The core never reads it: the
//! edge reads it once a request and passes it in, to stamp a missing time
//! (then recorded) and to date events for audits.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now (0 before 1970, saturating far in the future).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
