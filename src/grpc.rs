//! The `retrybudget.v1` edge: the only place the API's protobuf types exist
//! (the store keeps its own, private schema for what it writes).
//!
//! - [`pb`]: the generated messages, service and descriptor set.
//! - [`codec`]: tonic-prost's codec, decoding each message from one slice;
//!   bytes that are not the request message are refused with a stable code.
//! - [`limit`]: the bound on a request message's size.
//! - `convert`: protobuf <-> core types, with input validation.
//! - `status`: the one place errors become `tonic::Status`.
//! - [`RetryBudgetService`]: the service implementation, thin: validate,
//!   call the core or the ledger, convert back.

pub mod codec;
mod convert;
pub mod limit;
mod next_action;
mod service;
pub mod status;

pub use service::{Draining, RetryBudgetService};

/// The generated protobuf types and service of `retrybudget.v1`.
pub mod pb {
    #![allow(
        missing_docs,
        clippy::doc_lazy_continuation,
        clippy::doc_overindented_list_items
    )]
    tonic::include_proto!("retrybudget.v1");

    /// The encoded descriptor set of every `retrybudget.v1` file, served by
    /// server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("retrybudget_descriptor");
}

/// The full gRPC name of the service, as health checks name it.
pub const SERVICE_NAME: &str = "retrybudget.v1.RetryBudget";
/// The request metadata key that names the tenant.
pub use crate::bucket::TENANT_HEADER;
