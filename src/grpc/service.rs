//! The `RetryBudget` service: validate, call the core or the ledger, convert
//! back. No decision logic lives here.

use std::future::ready;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use tonic::{Request, Response, Status};

use super::convert::{self, millis};
use super::pb::{self, retry_budget_server::RetryBudget};
use super::status;
use crate::bucket::{Admission, FairBucket, PermitSlot, SlotSpentError};
use crate::budget::activity::{
    ActivityKey, BudgetError, Policy, Report, plan_delay, validate_activity_id,
    validate_workflow_id,
};
use crate::budget::classify::RuleSet;
use crate::budget::hint::{RawHints, normalize};
use crate::budget::{Action, Budget, DelayParams, ErrorClass, explain, next_action, retry_delay};
use crate::clock::now_ms;
use crate::ledger::{Decided, Ledger, SuccessOutcome, TokenGate, TokenOutcome};
use crate::store::Store;

/// Set when the server starts draining: new calls are refused with
/// `UNAVAILABLE` while calls in flight finish.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    /// Starts refusing new calls.
    pub fn start(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<(), Status> {
        if self.0.load(Ordering::Acquire) {
            return Err(status::draining());
        }
        Ok(())
    }
}

/// The `retrybudget.v1.RetryBudget` implementation.
pub struct RetryBudgetService<S> {
    ledger: Arc<Ledger<S>>,
    draining: Draining,
    /// The global retry-token bucket: successes deposit into it. Retries
    /// take its tokens through the [`PermitSlot`] its tower layer puts in
    /// each `NextAction` request.
    bucket: Option<FairBucket>,
    /// The classification rules: the operator's overrides, then the
    /// defaults.
    rules: Arc<RuleSet>,
}

impl<S> RetryBudgetService<S> {
    /// The service over a ledger; it refuses new calls once `draining`
    /// starts. Successes deposit into `bucket`, if any.
    pub fn new(
        ledger: Arc<Ledger<S>>,
        draining: Draining,
        bucket: Option<FairBucket>,
        rules: Arc<RuleSet>,
    ) -> Self {
        Self {
            ledger,
            draining,
            bucket,
            rules,
        }
    }
}

/// The token layer's permit as the ledger's [`TokenGate`]. Without a permit
/// (no layer installed) every retry is granted.
struct SlotGate<'a>(Option<&'a PermitSlot>);

impl TokenGate for SlotGate<'_> {
    fn take(self, now_ms: i64, max_wait_ms: i64) -> TokenOutcome {
        let Some(slot) = self.0 else {
            return TokenOutcome::Granted;
        };
        let max_wait = Duration::from_millis(max_wait_ms.max(0).unsigned_abs());
        let later = |wait: Duration| {
            now_ms.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX))
        };
        match slot.commit_within(max_wait) {
            Ok(Admission::Granted) => TokenOutcome::Granted,
            Ok(Admission::Deferred { wait, reason }) => TokenOutcome::Deferred {
                not_before_ms: later(wait),
                reason,
                booked: true,
            },
            Ok(Admission::Refused {
                retry_after,
                reason,
            }) => TokenOutcome::Deferred {
                not_before_ms: later(retry_after),
                reason,
                booked: false,
            },
            // The ledger takes a token once a decision; a spent slot means
            // a second decision in one request, which cannot happen.
            Err(SlotSpentError) => TokenOutcome::Granted,
        }
    }
}

fn key<T>(request: &Request<T>, activity_id: String) -> Result<ActivityKey, BudgetError> {
    validate_activity_id(&activity_id)?;
    Ok(ActivityKey {
        tenant: convert::tenant(request.metadata())?,
        activity_id,
    })
}

impl<S: Store> RetryBudgetService<S> {
    /// The class of a reported failure: the worker's own, else what the
    /// rules make of the raw failure (with the rule that matched).
    fn classify<'a>(
        &'a self,
        req: &pb::NextActionRequest,
        tenant: &str,
    ) -> Result<(ErrorClass, Option<&'a str>), Status> {
        Ok(match (&req.error, req.error_class) {
            (Some(detail), 0) => {
                let c = self.rules.classify(&convert::failure(detail, tenant));
                (c.class, Some(c.rule))
            }
            (_, class) => (convert::error_class(class)?, None),
        })
    }

    /// `NextAction`: the pure form answered, or the durable form's wait.
    fn next_action_now(
        &self,
        request: Request<pb::NextActionRequest>,
    ) -> Result<Answer<'_>, Status> {
        self.draining.check()?;
        let slot = request.extensions().get::<PermitSlot>().cloned();
        // The token layer read and checked the tenant when it gave the
        // request a slot; without one (no layer, or an invalid id) the
        // handler reads it, and rejects an invalid one.
        let parsed;
        let tenant = match &slot {
            Some(slot) => slot.tenant(),
            None => {
                parsed = convert::tenant(request.metadata())?;
                parsed.as_str()
            }
        };
        let req = request.into_inner();
        if let Some(budget) = &req.budget {
            let response = self.next_action_pure(tenant, slot.as_ref(), budget, &req)?;
            return Ok(Box::pin(ready(Ok(Response::new(response)))));
        }
        let tenant = tenant.to_owned();
        self.next_action_durable(tenant, slot, req)
    }

    /// `NextAction` with a `budget`: decided on the budget as given,
    /// nothing stored.
    fn next_action_pure(
        &self,
        tenant: &str,
        slot: Option<&PermitSlot>,
        budget: &pb::Budget,
        req: &pb::NextActionRequest,
    ) -> Result<pb::NextActionResponse, Status> {
        let (class, rule) = self.classify(req, tenant)?;
        let input = PureInput {
            class,
            rule,
            hints: req.error.as_ref().and_then(convert::raw_hints),
            occurred_at_ms: occurred_at(req)?,
            activity_id: &req.activity_id,
            policy: req.policy,
            max_hint_ms: self.ledger.defaults().max_hint_ms,
        };
        let gate = (!req.dry_run).then_some(SlotGate(slot));
        let mut response = pure_next_action(budget, &input, gate)?;
        response.dry_run = req.dry_run;
        Ok(response)
    }

    /// `NextAction` without a budget: decided on the activity's recorded
    /// budget, answered once the decision is durable.
    ///
    /// Decided in this call when the activity's lock is free and the store
    /// reads at once (nearly always): the future returned then holds only
    /// the lock's guard, the decision and the save's wait, so that the
    /// requests of a group waiting for its fsync keep little memory alive.
    /// Otherwise the whole request goes into the future, which waits for
    /// the lock or the read, and decides then.
    fn next_action_durable(
        &self,
        tenant: String,
        slot: Option<PermitSlot>,
        mut req: pb::NextActionRequest,
    ) -> Result<Answer<'_>, Status> {
        let dry_run = req.dry_run;
        let key = ActivityKey {
            tenant,
            activity_id: std::mem::take(&mut req.activity_id),
        };
        let tried = {
            let report = self.durable_report(&key, &req)?;
            self.ledger
                .try_report(&key, &report, SlotGate(slot.as_ref()), now_ms(), dry_run)
        };
        let Some(unsaved) = tried else {
            return Ok(Box::pin(async move {
                let report = self.durable_report(&key, &req)?;
                let decided = self
                    .ledger
                    .report(&key, &report, SlotGate(slot.as_ref()), now_ms(), dry_run)
                    .await?;
                Ok(answer(decided, dry_run))
            }));
        };
        match self.ledger.save(unsaved?).now() {
            Ok(decided) => Ok(Box::pin(ready(Ok(answer(decided, dry_run))))),
            Err(saving) => Ok(Box::pin(
                saving
                    .durable()
                    .map(move |decided| Ok(answer(decided?, dry_run))),
            )),
        }
    }

    /// The report of a durable `NextAction` on `key`, once the request is
    /// checked (its activity id is in `key`).
    fn durable_report<'r>(
        &'r self,
        key: &ActivityKey,
        req: &'r pb::NextActionRequest,
    ) -> Result<Report<'r>, Status> {
        let (class, rule) = self.classify(req, &key.tenant)?;
        let occurred_at_ms = occurred_at(req)?;
        validate_activity_id(&key.activity_id)?;
        validate_workflow_id(&req.workflow_id)?;
        Ok(Report {
            attempt: req.attempt,
            class,
            rule,
            hints: req.error.as_ref().and_then(convert::raw_hints),
            policy: req.policy.map(Into::into),
            occurred_at_ms,
            workflow_id: &req.workflow_id,
        })
    }
}

/// What `NextAction` returns: a future boxed once, by us rather than by
/// `async_trait` (see `next_action`).
type Answer<'a> =
    Pin<Box<dyn Future<Output = Result<Response<pb::NextActionResponse>, Status>> + Send + 'a>>;

/// The response to a decision of the ledger.
fn answer(decided: Decided, dry_run: bool) -> Response<pb::NextActionResponse> {
    let mut response = pb::NextActionResponse::from(decided);
    response.dry_run = dry_run;
    Response::new(response)
}

/// When the failure occurred, if the request says.
fn occurred_at(req: &pb::NextActionRequest) -> Result<Option<i64>, BudgetError> {
    req.occurred_at
        .as_ref()
        .map(|ts| millis(ts, "occurred_at"))
        .transpose()
}

#[tonic::async_trait]
impl<S: Store> RetryBudget for RetryBudgetService<S> {
    async fn retry_delay(
        &self,
        request: Request<pb::RetryDelayRequest>,
    ) -> Result<Response<pb::RetryDelayResponse>, Status> {
        self.draining.check()?;
        let req = request.into_inner();
        if req.attempt == 0 {
            return Err(BudgetError::AttemptMustBePositive.into());
        }
        validate_activity_id(&req.activity_id)?;
        let defaults = DelayParams::default();
        let params = DelayParams {
            base: req.base.unwrap_or(defaults.base),
            cap: req.cap.unwrap_or(defaults.cap),
        };
        let delay = retry_delay(&req.activity_id, req.attempt, params)
            .map_err(|_| BudgetError::AttemptMustBePositive)?;
        Ok(Response::new(pb::RetryDelayResponse {
            delay_seconds: delay.seconds,
            delay_ms: delay.millis,
        }))
    }

    /// Not an `async fn`: `async_trait` would box a future holding the
    /// request (twice) for every call. Here the pure form is answered in the
    /// call, and a durable one returns the one future it needs to wait for
    /// its fsync (see `next_action_durable`). tonic polls what this returns
    /// at once, in the same task, so nothing runs earlier than it would in
    /// an `async fn`.
    fn next_action<'life0, 'async_trait>(
        &'life0 self,
        request: Request<pb::NextActionRequest>,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.next_action_now(request)
            .unwrap_or_else(|status| Box::pin(ready(Err(status))))
    }

    async fn record_success(
        &self,
        request: Request<pb::RecordSuccessRequest>,
    ) -> Result<Response<pb::RecordSuccessResponse>, Status> {
        self.draining.check()?;
        let occurred_at_ms = request
            .get_ref()
            .occurred_at
            .as_ref()
            .map(|ts| millis(ts, "occurred_at"))
            .transpose()?;
        let key = key(&request, request.get_ref().activity_id.clone())?;
        let outcome = self
            .ledger
            .record_success(&key, occurred_at_ms, now_ms())
            .await?;
        // A success earns retry capacity once: a repeated RecordSuccess of a
        // closed activity deposits nothing.
        if outcome != SuccessOutcome::AlreadyClosed
            && let Some(bucket) = &self.bucket
        {
            bucket.deposit_success();
        }
        let (status, changed) = match outcome {
            SuccessOutcome::Unknown => (pb::ActivityStatus::Unspecified, false),
            SuccessOutcome::AlreadyClosed => (pb::ActivityStatus::Closed, false),
            SuccessOutcome::Closed => (pb::ActivityStatus::Closed, true),
        };
        Ok(Response::new(pb::RecordSuccessResponse {
            status: status as i32,
            changed,
        }))
    }

    async fn resolve_activity(
        &self,
        request: Request<pb::ResolveActivityRequest>,
    ) -> Result<Response<pb::ResolveActivityResponse>, Status> {
        self.draining.check()?;
        let resolution = convert::resolution(request.get_ref().resolution)?;
        let key = key(&request, request.get_ref().activity_id.clone())?;
        let note = &request.get_ref().note;
        let status = self
            .ledger
            .resolve(&key, resolution, note, now_ms())
            .await?;
        Ok(Response::new(pb::ResolveActivityResponse {
            status: convert::status_to_pb(status) as i32,
        }))
    }

    async fn get_activity(
        &self,
        request: Request<pb::GetActivityRequest>,
    ) -> Result<Response<pb::Activity>, Status> {
        self.draining.check()?;
        let key = key(&request, request.get_ref().activity_id.clone())?;
        let record = self.ledger.get(&key).await?;
        Ok(Response::new(record.into()))
    }
}

/// What the pure form evaluates besides the budget.
struct PureInput<'a> {
    class: ErrorClass,
    rule: Option<&'a str>,
    hints: Option<RawHints<'a>>,
    occurred_at_ms: Option<i64>,
    activity_id: &'a str,
    policy: Option<pb::Policy>,
    max_hint_ms: u64,
}

/// The pure form: the reference `next_action` on the budget as given, plus
/// the delay of a retry when an activity id is named (the server's hint when
/// it asks for longer). Nothing is stored. A retry takes a global token
/// through `gate` (none for a dry run); the pure form keeps no record to
/// hold a booked slot, so without a token now it is deferred to when the
/// next one comes, and asks again then.
fn pure_next_action(
    budget: &pb::Budget,
    input: &PureInput<'_>,
    gate: Option<SlotGate<'_>>,
) -> Result<pb::NextActionResponse, Status> {
    let budget = Budget {
        attempts: budget.attempts,
        max_attempts: budget.max_attempts,
        elapsed: budget.elapsed,
        deadline: budget.deadline,
    };
    let now = now_ms();
    let hint = input
        .hints
        .map(|raw| normalize(&raw, input.occurred_at_ms.unwrap_or(now), input.max_hint_ms));
    let mut action = next_action(&budget, input.class);
    let mut reason = explain(action, &budget);
    if action == Action::ScheduleRetry && hint.is_some_and(|h| h.do_not_retry) {
        action = Action::FailPermanent;
        reason = "the server asked not to retry (grpc_pushback_do_not_retry)".to_owned();
    }
    let mut response = pb::NextActionResponse {
        attempt: budget.attempts,
        error_class: convert::error_class_to_pb(input.class) as i32,
        rule: input.rule.unwrap_or_default().to_owned(),
        hint: hint.as_ref().map(pb::ServerHint::from),
        ..Default::default()
    };
    if action == Action::ScheduleRetry && !input.activity_id.is_empty() {
        validate_activity_id(input.activity_id)?;
        let params = input
            .policy
            .map_or_else(DelayParams::default, |p| Policy::from(p).delay_params());
        let planned = plan_delay(input.activity_id, budget.attempts, params, hint.as_ref())?;
        response.delay_seconds = planned.seconds;
        response.delay_ms = planned.millis;
    }
    if action == Action::ScheduleRetry
        && let Some(gate) = gate
    {
        match gate.take(now, 0) {
            TokenOutcome::Granted => response.token_taken = true,
            TokenOutcome::Deferred {
                not_before_ms,
                reason: why,
                ..
            } => {
                action = Action::Deferred;
                response.defer_reason = why.to_owned();
                response.not_before = Some(convert::timestamp(not_before_ms));
                reason = format!("retry capacity is exhausted ({why}); ask again at not_before");
                response.delay_seconds = 0;
                response.delay_ms = 0;
            }
        }
    }
    response.action = convert::action_to_pb(action) as i32;
    response.code = action.code().to_owned();
    response.reason = reason;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `NextAction` allocates the future it returns. A pure one's
    /// holds only its answer, and a durable one's, once decided, only what
    /// waits for the fsync: not the request, and not a second box.
    #[tokio::test]
    async fn a_next_action_future_holds_its_answer_or_its_wait_and_not_the_request() {
        let (_dir, ledger) = crate::ledger::tests::ledger();
        let rules = Arc::new(RuleSet::new(Vec::new()).unwrap());
        let service = RetryBudgetService::new(ledger, Draining::default(), None, rules);
        let request = |budget| {
            let mut request = Request::new(pb::NextActionRequest {
                activity_id: "a".into(),
                attempt: 1,
                error_class: pb::ErrorClass::Transient as i32,
                budget,
                ..Default::default()
            });
            request
                .metadata_mut()
                .insert("x-tenant-id", "t".parse().unwrap());
            request
        };
        let answer = std::mem::size_of::<
            std::future::Ready<Result<Response<pb::NextActionResponse>, Status>>,
        >();
        let pure = service.next_action(request(Some(pb::Budget {
            attempts: 1,
            max_attempts: 3,
            elapsed: 0,
            deadline: 3600,
        })));
        assert_eq!(std::mem::size_of_val(&*pure), answer, "pure");
        let response = pure.await.unwrap().into_inner();
        assert_eq!(response.code, "schedule_retry");
        let durable = service.next_action(request(None));
        let size = std::mem::size_of_val(&*durable);
        let request_size = std::mem::size_of::<Request<pb::NextActionRequest>>();
        // 136 bytes in this build, where a request is 368: async_trait's box
        // held the request twice (760 bytes) and the durable path's own box
        // the request and the save (1,640).
        assert!(
            size < request_size / 2,
            "durable: {size} bytes, a request {request_size}"
        );
        let response = durable.await.unwrap().into_inner();
        assert_eq!(
            (response.code.as_str(), response.replayed),
            ("schedule_retry", false)
        );
        // Decided and saved: the same attempt again is a replay, answered in
        // the call.
        let replay = service.next_action(request(None));
        assert_eq!(std::mem::size_of_val(&*replay), answer, "replay");
        assert!(replay.await.unwrap().into_inner().replayed);
    }
}
