//! The integration tests, in one binary: each module was a test file of its
//! own, and one binary links the crate once instead of once per file.
//! `cargo test --test it MODULE::` runs one of them (`cargo test --test it
//! cluster:: -- --ignored --test-threads=1` the multi-replica ones CI runs alone).

mod common;

mod auth_e2e;
mod backlog;
mod bucket_e2e;
mod bucket_fairness;
mod classification_e2e;
mod cluster;
mod codec_e2e;
mod config_file;
mod contract_e2e;
mod coordination;
mod crash;
mod dependencies;
mod durable;
mod herd;
mod hostile;
mod limits_e2e;
mod logs_e2e;
mod metrics_e2e;
mod migrate;
mod parity;
mod postgres_replicas;
mod races;
mod reload;
mod rollout;
mod server_e2e;
mod state_machine;
mod store_conformance;
mod sweep_race;
mod tls_e2e;
