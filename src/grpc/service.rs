//! The `RetryBudget` service: validate, call the core or the ledger, convert
//! back. No decision logic lives here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use tonic::{Request, Response, Status};

use super::convert::{self, client_time};
use super::next_action::{self, Asked, Context};
use super::pb::{self, retry_budget_server::RetryBudget};
use super::status;
use crate::bucket::TenantGate;
use crate::budget::activity::{
    ActivityKey, BudgetError, validate_activity_id, validate_dependency,
};
use crate::budget::classify::RuleSet;
use crate::budget::decision::pure_decision;
use crate::budget::timestamp::TimeBounds;
use crate::budget::traffic::{self, Traffic};
use crate::budget::{DelayParams, retry_delay};
use crate::clock::now_ms;
use crate::ledger::{Ledger, SuccessOutcome};
use crate::metrics::Metrics;
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
    /// The classification rules: the operator's overrides, then the
    /// defaults.
    rules: Arc<ArcSwap<RuleSet>>,
    /// Where decisions are counted, when metrics are on.
    metrics: Option<Metrics>,
    /// How far from the server's clock a client's timestamp may be.
    time_bounds: TimeBounds,
}

impl<S> RetryBudgetService<S> {
    /// The service over a ledger; it refuses new calls once `draining`
    /// starts. The retry budget reaches it only as the [`TenantGate`] its
    /// tower layer puts in each call that spends budget; without the layer
    /// every retry is granted.
    pub fn new(ledger: Arc<Ledger<S>>, draining: Draining, rules: Arc<ArcSwap<RuleSet>>) -> Self {
        Self {
            ledger,
            draining,
            rules,
            metrics: None,
            time_bounds: TimeBounds::default(),
        }
    }

    /// Refuses client timestamps further from the server's clock than
    /// `bounds` (`[limits] max_timestamp_past`, `max_timestamp_future`).
    #[must_use]
    pub fn with_time_bounds(mut self, bounds: TimeBounds) -> Self {
        self.time_bounds = bounds;
        self
    }

    /// Counts every `NextAction` answer in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Option<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
}

fn key<T>(request: &Request<T>, activity_id: String) -> Result<ActivityKey, BudgetError> {
    validate_activity_id(&activity_id)?;
    Ok(ActivityKey {
        tenant: convert::tenant(request.extensions(), request.metadata())?.to_owned(),
        activity_id,
    })
}

impl<S> RetryBudgetService<S> {
    /// The classification rules in force now. A reload replaces them; a
    /// request keeps the version it started with.
    fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }
}

/// The target of the per-decision log lines, at debug level: turned on
/// with `RUST_LOG=info,retry_budget::decision=debug`.
pub const DECISION_LOG: &str = "retry_budget::decision";

/// One line per `NextAction` answer, when [`DECISION_LOG`] is on: who,
/// which activity and attempt, what was decided, and the trace id of the
/// worker's `traceparent`, so a decision can be found from a trace.
fn log_decision(
    tenant: &str,
    activity: &str,
    trace: Option<&str>,
    response: &pb::NextActionResponse,
) {
    tracing::debug!(
        target: DECISION_LOG,
        method = "NextAction",
        tenant,
        activity,
        attempt = response.attempt,
        code = %response.code,
        replayed = response.replayed,
        delay_ms = response.delay_ms,
        defer_reason = %response.defer_reason,
        trace_id = trace.unwrap_or_default(),
        "decision"
    );
}

/// Each handler checks the draining flag, converts its request, and calls
/// the core or the ledger.
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

    /// One route: the request converted once into what it asks, decided
    /// by the core (a budget given) or the ledger (the recorded budget),
    /// the decision converted back. The tenant is read once; the gate is
    /// asked by the decision only, when it needs a token.
    async fn next_action(
        &self,
        mut request: Request<pb::NextActionRequest>,
    ) -> Result<Response<pb::NextActionResponse>, Status> {
        self.draining.check()?;
        let gate = request.extensions_mut().remove::<TenantGate>();
        // The layer resolved the tenant of a call it gave a gate, from the
        // same request: read once.
        let tenant = match &gate {
            Some(gate) => gate.tenant(),
            None => convert::tenant(request.extensions(), request.metadata())?,
        };
        let req = request.get_ref();
        let rules = self.rules();
        let now = now_ms();
        let context = Context {
            now,
            rules: &rules,
            time_bounds: &self.time_bounds,
        };
        let asked = next_action::asked(req, tenant, &context)?;
        let gate = gate.as_ref().map(|g| g.dependency(&req.dependency));
        let response = match asked {
            Asked::Pure(report) => {
                // A dry run asks no gate; no token layer is a gate that
                // grants every retry.
                let gate = (!req.dry_run).then_some(gate);
                let max_hint_ms = self.ledger.defaults().max_hint_ms;
                let event = pure_decision(&report, gate, max_hint_ms, now)?;
                convert::decision(event, false, req.dry_run)
            }
            Asked::Durable(key, report) => {
                let decided = self
                    .ledger
                    .report(&key, &report, gate, now, req.dry_run)
                    .await?;
                convert::durable_decision(decided, req.dry_run)
            }
        };
        if let Some(metrics) = &self.metrics {
            let labels = convert::decision_labels(&response);
            metrics.decision(&labels);
        }
        // Only when decisions are logged: a worker's trace id finds its
        // decision in the log.
        if tracing::enabled!(target: DECISION_LOG, tracing::Level::DEBUG) {
            let trace = convert::trace_id(request.metadata());
            log_decision(tenant, &req.activity_id, trace, &response);
        }
        Ok(Response::new(response))
    }

    async fn record_success(
        &self,
        mut request: Request<pb::RecordSuccessRequest>,
    ) -> Result<Response<pb::RecordSuccessResponse>, Status> {
        self.draining.check()?;
        let gate = request.extensions_mut().remove::<TenantGate>();
        let now = now_ms();
        let occurred_at_ms = client_time(
            request.get_ref().occurred_at.as_ref(),
            "occurred_at",
            now,
            &self.time_bounds,
        )?;
        let dependency = &request.get_ref().dependency;
        validate_dependency(dependency)?;
        let key = key(&request, request.get_ref().activity_id.clone())?;
        let outcome = self
            .ledger
            .record_success(&key, occurred_at_ms, now)
            .await?;
        if let Some(gate) = &gate {
            match &outcome {
                // A success the service cannot check counts once, for the
                // caller's tenant alone, and earns no global capacity.
                SuccessOutcome::Unknown => gate.record_success(dependency, false, false),
                // Counted when the activity closed: a repeated call is the
                // same success.
                SuccessOutcome::AlreadyClosed => {}
                SuccessOutcome::Closed { left_line } => {
                    gate.record_success(dependency, true, true);
                    if let Some((line, since)) = left_line {
                        gate.leave_line(
                            line.as_deref().unwrap_or_default(),
                            &key.activity_id,
                            *since,
                        );
                    }
                }
            }
        }
        let (status, changed) = match outcome {
            SuccessOutcome::Unknown => (pb::ActivityStatus::Unspecified, false),
            SuccessOutcome::AlreadyClosed => (pb::ActivityStatus::Closed, false),
            SuccessOutcome::Closed { .. } => (pb::ActivityStatus::Closed, true),
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

    async fn report_traffic(
        &self,
        mut request: Request<pb::ReportTrafficRequest>,
    ) -> Result<Response<pb::ReportTrafficResponse>, Status> {
        self.draining.check()?;
        let gate = request.extensions_mut().remove::<TenantGate>();
        convert::tenant(request.extensions(), request.metadata())?;
        let req = request.into_inner();
        let report: Vec<Traffic<'_>> = req
            .dependencies
            .iter()
            .map(|t| Traffic {
                dependency: &t.dependency,
                calls: t.calls,
                successes: t.successes,
                failures: t.failures,
            })
            .collect();
        traffic::validate(&report)?;
        let Some(gate) = gate else {
            return Ok(Response::new(pb::ReportTrafficResponse::default()));
        };
        let dependencies = if report.is_empty() {
            gate.dependencies()
        } else {
            gate.admit_report()?;
            report
                .iter()
                .map(|t| gate.report_traffic(t.dependency, t.calls, t.successes, t.failures))
                .collect()
        };
        Ok(Response::new(pb::ReportTrafficResponse {
            dependencies: dependencies.into_iter().map(convert::pace_to_pb).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Driven in-process, without the token layer: no gate, so every
    /// retry is granted; the durable form decides, saves and then replays.
    #[tokio::test]
    async fn without_the_token_layer_every_retry_is_granted_and_a_decision_replays() {
        let (_dir, ledger) = crate::ledger::tests::ledger();
        let rules = Arc::new(ArcSwap::from_pointee(RuleSet::new(Vec::new()).unwrap()));
        let service = RetryBudgetService::new(ledger, Draining::default(), rules);
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
        let pure = service
            .next_action(request(Some(pb::Budget {
                attempts: 1,
                max_attempts: 3,
                elapsed: 0,
                deadline: 3600,
            })))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (pure.code.as_str(), pure.token_taken),
            ("schedule_retry", true)
        );
        let durable = service
            .next_action(request(None))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (durable.code.as_str(), durable.replayed, durable.token_taken),
            ("schedule_retry", false, true)
        );
        let replay = service
            .next_action(request(None))
            .await
            .unwrap()
            .into_inner();
        assert!(replay.replayed);
        assert_eq!(replay.not_before, durable.not_before);
    }
}
