//! Builders shared by the classifier's tests: short constructors, so a
//! table of failures reads one row a line; the overrides example of
//! `docs/classification.md`, parsed; and a strategy for arbitrary failures.

use proptest::prelude::*;

use super::{Failure, NetworkFailure, Reach, RuleSet, RuleSpec, Safety};

pub(super) fn h(status: u16) -> Failure<'static> {
    Failure {
        http_status: Some(status),
        ..Failure::default()
    }
}

pub(super) fn g(code: i32) -> Failure<'static> {
    Failure {
        grpc_code: Some(code),
        ..Failure::default()
    }
}

pub(super) fn n(kind: NetworkFailure) -> Failure<'static> {
    Failure {
        network: Some(kind),
        ..Failure::default()
    }
}

/// Short builders, so a table of failures reads one row a line.
pub(super) trait Build {
    fn s(self, safety: Safety) -> Self;
    fn r(self, reached: Reach) -> Self;
    fn n(self, kind: NetworkFailure) -> Self;
    fn g(self, code: i32) -> Self;
}

impl Build for Failure<'static> {
    fn s(self, safety: Safety) -> Self {
        Failure { safety, ..self }
    }
    fn r(self, reached: Reach) -> Self {
        Failure { reached, ..self }
    }
    fn n(self, kind: NetworkFailure) -> Self {
        Failure {
            network: Some(kind),
            ..self
        }
    }
    fn g(self, code: i32) -> Self {
        Failure {
            grpc_code: Some(code),
            ..self
        }
    }
}

/// The overrides example of `docs/classification.md`, so it cannot rot.
fn documented_example() -> &'static str {
    let doc = include_str!("../../../docs/classification.md");
    let start = doc.find("```toml\n").expect("the doc has a toml example") + 8;
    let len = doc[start..].find("```").expect("the example is closed");
    &doc[start..start + len]
}

#[derive(serde::Deserialize)]
pub(super) struct Config {
    pub(super) classification: Section,
}

#[derive(serde::Deserialize)]
pub(super) struct Section {
    pub(super) rules: Vec<RuleSpec>,
}

pub(super) fn configured() -> RuleSet {
    let config: Config = toml::from_str(documented_example()).expect("the example parses");
    RuleSet::new(config.classification.rules).expect("the example is valid")
}

pub(super) fn any_failure() -> impl Strategy<
    Value = (
        Option<u16>,
        Option<i32>,
        Option<NetworkFailure>,
        Safety,
        Reach,
        String,
    ),
> {
    (
        any::<Option<u16>>(),
        any::<Option<i32>>(),
        proptest::option::of(proptest::sample::select(NetworkFailure::ALL.to_vec())),
        proptest::sample::select(Safety::ALL.to_vec()),
        proptest::sample::select(Reach::ALL.to_vec()),
        prop_oneof![
            Just("acme".to_owned()),
            Just("payments".to_owned()),
            any::<String>()
        ],
    )
}
