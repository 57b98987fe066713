//! retry-budget: tells workers of a durable-execution system whether and when
//! to retry a failed activity.
//!
//! # Layout
//! Dependencies point inward: the core depends on nothing of ours.
//! - [`budget`]: the pure core (backoff, next action, the activity state
//!   machine, stable codes). No I/O, no clock, no tokio, tonic or prost.
//! - [`auth`]: who asks: the tenant each request acts for, proven by an
//!   API key or the service mesh, or named by `x-tenant-id`.
//! - [`bucket`]: the global retry-token bucket with fair per-tenant shares,
//!   and the tower layer that hands every call a gate its decision asks.
//! - [`coord`]: one global retry budget across replicas, agreed through
//!   the database once an interval.
//! - [`ledger`]: durable activity budgets: one activity at a time, durable
//!   before the reply.
//! - [`store`]: where activities live, behind one [`store::Store`] trait.
//! - [`refusal`]: the one shape of every refusal, whichever layer refuses.
//! - [`setting`]: what every configuration section shares (durations, the
//!   error of a setting), below the sections and the [`config`] gathering
//!   them.
//! - [`grpc`]: the `retrybudget.v1` edge: protobuf types, conversions and
//!   the one place the core's and the stores' errors become refusals.
//! - [`metrics`]: Prometheus metrics: the RPC layer, decisions, and what
//!   the bucket, the store and the coordination count, read at scrape.
//! - [`server`]: the wiring: store, services, health, reflection, shutdown.
//! - [`cli`]: the command line, for people without grpcurl.
#![forbid(unsafe_code)]

pub mod auth;
pub mod bucket;
pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod coord;
pub mod grpc;
pub mod ledger;
pub mod metrics;
pub mod peer;
pub mod refusal;
pub mod server;
pub mod setting;
pub mod store;
