//! retry-budget: tells workers of a durable-execution system whether and when
//! to retry a failed activity.
//!
//! # Layout
//! Dependencies point inward: the core depends on nothing of ours.
//! - [`budget`]: the pure core (backoff, next action, the activity state
//!   machine, stable codes). No I/O, no clock, no tokio, tonic or prost.
//! - [`store`]: where activities live, behind one [`store::Store`] trait.
//! - [`grpc`]: the `retrybudget.v1` edge: protobuf types, conversions and
//!   the one place errors become `tonic::Status`.
//! - [`server`]: the wiring: store, services, health, reflection, shutdown.
//! - [`cli`]: the command line, for people without grpcurl.
#![forbid(unsafe_code)]

pub mod bucket;
pub mod budget;
