//! Failure classification (in progress).
