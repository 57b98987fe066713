//! Server retry hints (in progress).
