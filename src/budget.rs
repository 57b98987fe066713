//! The pure core: everything a decision is made of, with no I/O, no clock and
//! no async runtime (no tokio, tonic or prost in here).
//!
//! - [`delay`]: the article's `retry_delay`, exact to the reference, and its
//!   millisecond refinement.
//! - [`action`]: the article's `next_action` on a [`Budget`].
//! - [`hint`]: a server's `Retry-After`, pushback and `RetryInfo`, normalised.
//! - [`classify`]: a raw failure to its class, by rules.
//! - [`decision`]: the one decision on a failed attempt that both forms of
//!   `NextAction` make, and what the global token's answer does to it.
//! - [`token`]: that answer ([`Admission`]), how a retry is paid, and the
//!   [`TokenGate`] asked.
//! - [`traffic`]: a worker's traffic report, checked.
//! - [`activity`]: the durable state machine that owns an activity's budget:
//!   given the recorded activity and a new failure report, the decision and
//!   the new record.
//! - [`record`]: the record it keeps; [`error`]: what it refuses;
//!   [`tenant`]: who asks; [`timestamp`]: the times a client sends, checked
//!   against their range and the server's clock.
//! - [`codes`]: every stable string a client may match on, defined once.
//!
//! Time is always a parameter (`now`, logical milliseconds), never read here,
//! so a replay of the same inputs gives the same answer.

pub mod action;
pub mod activity;
pub mod classify;
pub mod codes;
pub mod decision;
pub mod delay;
pub mod error;
pub mod hint;
pub mod record;
pub mod tenant;
pub mod timestamp;
pub mod token;
pub mod traffic;

pub use action::{Action, Budget, ErrorClass, explain, next_action};
pub use delay::{Delay, DelayParams, retry_delay};
pub use token::{Admission, TokenGate, Unlimited};
