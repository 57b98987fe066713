//! Shared by the integration tests: `server.rs` (a real server in this
//! process, clients for it; the load generator's tests share it alone) and
//! the helpers that need the service binary or the database.

// A `path` makes `server.rs` a directory's module file, so its own `skip`
// is `common/skip.rs` whether it is loaded here or by the load generator.
#[path = "server.rs"]
mod server;
pub use server::*;

pub mod binary;
pub mod cluster;
pub mod postgres;
pub mod raw;
pub mod tls;
