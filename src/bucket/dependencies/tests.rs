//! The dependencies' budgets simulated on exact times: the helpers every
//! test shares, and the tests by what they cover: `nesting` the nesting
//! and the evidence rule, `lines` the lines of deferred retries,
//! `tracking` the bounds on tracked names, `persist` a snapshot and
//! restore.

use super::*;
use crate::budget::token::{Admission, Answer, Ask};

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn global(rate: f64) -> (FairShares, BucketConfig) {
    let config = BucketConfig {
        rate,
        burst: rate as u32,
        ..BucketConfig::default()
    };
    (FairShares::new(&config).unwrap(), config)
}

fn dependencies(template: &BucketConfig) -> Dependencies {
    Dependencies::new(DependenciesConfig::default(), template).unwrap()
}

fn pure(now: Duration) -> Ask<'static> {
    Ask {
        activity_id: None,
        waiting_since_ms: None,
        now_ms: now.as_millis() as i64,
        planned_ms: None,
        observed: None,
    }
}

fn durable<'a>(id: &'a str, since: Option<i64>, now: Duration) -> Ask<'a> {
    Ask {
        activity_id: Some(id),
        waiting_since_ms: since,
        now_ms: now.as_millis() as i64,
        planned_ms: None,
        observed: None,
    }
}

fn granted(answer: &Answer) -> bool {
    answer.admission == Admission::Granted
}

/// A failure asked about, and a retry asked for it: what a worker does.
fn fail_and_ask(
    deps: &mut Dependencies,
    global: &mut FairShares,
    tenant: &str,
    dependency: &str,
    retry_failed: bool,
    now: Duration,
) -> Answer {
    deps.observe(tenant, dependency, Observed { retry_failed }, now);
    deps.admit(global, tenant, dependency, &pure(now), now)
}

/// How many of the failures asked at `times` ([`fail_and_ask`]) got a
/// retry.
fn granted_at(
    deps: &mut Dependencies,
    global: &mut FairShares,
    tenant: &str,
    dependency: &str,
    retry_failed: bool,
    times: impl IntoIterator<Item = Duration>,
) -> usize {
    times
        .into_iter()
        .filter(|&at| {
            granted(&fail_and_ask(
                deps,
                global,
                tenant,
                dependency,
                retry_failed,
                at,
            ))
        })
        .count()
}

mod lines;
mod nesting;
mod persist;
mod tracking;
