//! `google.rpc.Code` numbers the default policy names, and every code's name
//! as an operator may write it in a rule. Apart because the default table,
//! the matcher (which reads codes outside 0-16 as `UNKNOWN`) and the rule
//! parser all need them (and the metrics, for their status label).
#![allow(missing_docs)]

pub const CANCELLED: u8 = 1;
pub const UNKNOWN: u8 = 2;
pub const INVALID_ARGUMENT: u8 = 3;
pub const DEADLINE_EXCEEDED: u8 = 4;
pub const NOT_FOUND: u8 = 5;
pub const ALREADY_EXISTS: u8 = 6;
pub const PERMISSION_DENIED: u8 = 7;
pub const RESOURCE_EXHAUSTED: u8 = 8;
pub const FAILED_PRECONDITION: u8 = 9;
pub const ABORTED: u8 = 10;
pub const OUT_OF_RANGE: u8 = 11;
pub const UNIMPLEMENTED: u8 = 12;
pub const INTERNAL: u8 = 13;
pub const UNAVAILABLE: u8 = 14;
pub const DATA_LOSS: u8 = 15;
pub const UNAUTHENTICATED: u8 = 16;
/// The largest code `google.rpc.Code` defines.
pub const MAX: u8 = 16;

/// The `google.rpc.Code` names, indexed by number.
pub const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];
