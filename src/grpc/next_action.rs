//! A `NextAction` request in the core's terms, converted once: the
//! handler checks it here, then hands what it asks to the core (a budget
//! given) or to the ledger (the activity's recorded budget), and converts
//! the decision back in [`super::convert`].

use tonic::Status;

use super::convert;
use super::pb;
use crate::budget::activity::{
    ActivityKey, Policy, Report, validate_activity_id, validate_dependency, validate_workflow_id,
};
use crate::budget::classify::RuleSet;
use crate::budget::decision::{ClassifiedFailure, PureReport};
use crate::budget::timestamp::TimeBounds;
use crate::budget::{Budget, DelayParams, ErrorClass};

/// What a `NextAction` asks.
pub(super) enum Asked<'r> {
    /// A budget was given: the core decides on it, nothing is stored.
    Pure(PureReport<'r>),
    /// No budget: the ledger decides on the activity's recorded one.
    Durable(ActivityKey, Report<'r>),
}

/// The server's side of a conversion: its clock, its rules and its bounds
/// on a client's timestamps.
pub(super) struct Context<'c> {
    /// The server's clock, unix milliseconds.
    pub now: i64,
    /// The classification rules in force when the request came.
    pub rules: &'c RuleSet,
    /// How far from `now` a client's timestamp may be.
    pub time_bounds: &'c TimeBounds,
}

/// Checks `req`, sent for `tenant`, and says what it asks.
///
/// # Errors
/// The refusal of the first field at fault; nothing is decided.
pub(super) fn asked<'r>(
    req: &'r pb::NextActionRequest,
    tenant: &str,
    context: &Context<'r>,
) -> Result<Asked<'r>, Status> {
    validate_dependency(&req.dependency)?;
    let (class, rule) = classify(context.rules, req, tenant)?;
    let occurred_at_ms = convert::client_time(
        req.occurred_at.as_ref(),
        "occurred_at",
        context.now,
        context.time_bounds,
    )?;
    let hints = req.error.as_ref().and_then(convert::raw_hints);
    let policy = req.policy.map(Policy::from);
    if let Some(budget) = &req.budget {
        return Ok(Asked::Pure(PureReport {
            budget: Budget {
                attempts: budget.attempts,
                max_attempts: budget.max_attempts,
                elapsed: budget.elapsed,
                deadline: budget.deadline,
            },
            failure: ClassifiedFailure {
                class,
                rule,
                hints,
                occurred_at_ms,
            },
            activity_id: &req.activity_id,
            params: policy.map_or_else(DelayParams::default, |p| p.delay_params()),
            dependency: &req.dependency,
        }));
    }
    validate_activity_id(&req.activity_id)?;
    validate_workflow_id(&req.workflow_id)?;
    let key = ActivityKey {
        tenant: tenant.to_owned(),
        activity_id: req.activity_id.clone(),
    };
    Ok(Asked::Durable(
        key,
        Report {
            attempt: req.attempt,
            class,
            rule,
            hints,
            policy,
            occurred_at_ms,
            workflow_id: &req.workflow_id,
            dependency: &req.dependency,
        },
    ))
}

/// The class of a reported failure: the worker's own, else what `rules`
/// make of the raw failure, with the rule that matched.
fn classify<'a>(
    rules: &'a RuleSet,
    req: &pb::NextActionRequest,
    tenant: &str,
) -> Result<(ErrorClass, Option<&'a str>), Status> {
    Ok(match (&req.error, req.error_class) {
        (Some(detail), 0) => {
            let c = rules.classify(&convert::failure(detail, tenant));
            (c.class, Some(c.rule))
        }
        (_, class) => (convert::error_class(class)?, None),
    })
}
