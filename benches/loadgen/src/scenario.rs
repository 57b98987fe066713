//! What one request of each scenario is, and what counts as its success.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::{self, Action, retry_budget_client::RetryBudgetClient};
use tonic::Request;
use tonic::metadata::{Ascii, MetadataValue};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::conn::{Conn, RawClient};
use crate::mixed::Mixed;
use crate::stored::{Rng, Stored};

/// The durable policy: far more attempts than any run walks and a deadline of ten years, so
/// every answer is a scheduled retry.
pub const GENEROUS_MAX_ATTEMPTS: u32 = 1000;
pub const GENEROUS_DEADLINE_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// The dependency durable reports name (`--dependency`), set once before the first request.
pub static DEPENDENCY: OnceLock<String> = OnceLock::new();

/// A transient failure of `attempt` under the durable policy.
pub fn durable_report(id: String, attempt: u32, at: Timestamp) -> pb::NextActionRequest {
    let (max_attempts, deadline_seconds) = (GENEROUS_MAX_ATTEMPTS, GENEROUS_DEADLINE_SECONDS);
    pb::NextActionRequest {
        attempt,
        error_class: pb::ErrorClass::Transient as i32,
        policy: Some(pb::Policy {
            max_attempts,
            deadline_seconds,
            base: None,
            cap: None,
        }),
        dependency: DEPENDENCY.get().cloned().unwrap_or_default(),
        activity_id: id,
        occurred_at: Some(at),
        ..Default::default()
    }
}

/// `Ok` if the answer is as expected, else the error key `unexpected`.
fn expect(ok: bool, unexpected: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(unexpected.into()) }
}

pub fn health_request() -> HealthCheckRequest {
    HealthCheckRequest::default()
}

pub fn check_health(response: &HealthCheckResponse) -> Result<(), String> {
    expect(
        response.status == ServingStatus::Serving as i32,
        "unexpected_not_serving",
    )
}

pub fn retry_delay_request() -> pb::RetryDelayRequest {
    pb::RetryDelayRequest {
        activity_id: "flight-1".into(),
        attempt: 4,
        base: None,
        cap: None,
    }
}

/// The article's `retry_delay("flight-1", 4)` is 11 seconds.
pub fn check_retry_delay(response: &pb::RetryDelayResponse) -> Result<(), String> {
    expect(response.delay_seconds == 11, "unexpected_delay")
}

/// A transient failure with two of three attempts and 25 of 30 seconds left: a retry.
pub fn pure_next_action_request() -> pb::NextActionRequest {
    pb::NextActionRequest {
        budget: Some(pb::Budget {
            attempts: 1,
            max_attempts: 3,
            elapsed: 5,
            deadline: 30,
        }),
        activity_id: "flight-1".into(),
        error_class: pb::ErrorClass::Transient as i32,
        ..Default::default()
    }
}

pub fn check_pure_next_action(response: &pb::NextActionResponse) -> Result<(), String> {
    expect(
        response.action == Action::ScheduleRetry as i32,
        "unexpected_action",
    )
}

/// A durable report's answer is a fresh decision to retry: no report is sent twice.
pub fn check_durable(response: &pb::NextActionResponse) -> Result<(), String> {
    expect(!response.replayed, "unexpected_replay")?;
    if response.action == Action::ScheduleRetry as i32 {
        return Ok(());
    }
    Err(format!("unexpected_action_{}", response.code))
}

/// One virtual client on one of the shared connections, and its own request state.
pub enum VirtualClient {
    /// `--client h2`: its scenario's one request, prepared once.
    Raw(RawClient),
    Health(HealthClient<Conn>),
    RetryDelay(RetryBudgetClient<Conn>),
    PureNextAction(RetryBudgetClient<Conn>),
    Durable(RetryBudgetClient<Conn>, Walk),
    /// Reports over preloaded activities, drawn by the client's own generator.
    Stored(
        RetryBudgetClient<Conn>,
        MetadataValue<Ascii>,
        Arc<Stored>,
        Rng,
    ),
    Mixed(RetryBudgetClient<Conn>, Mixed),
}

/// The durable walk: activities `{prefix}{seq}`, each through attempts 1 to `attempts`, each
/// attempt failed at the previous answer's `not_before`, as a worker that retries on time.
pub struct Walk {
    tenant: MetadataValue<Ascii>,
    prefix: String,
    seq: u64,
    attempt: u32,
    attempts: u32,
    occurred_at: Timestamp,
}

impl Walk {
    pub fn new(tenant: MetadataValue<Ascii>, prefix: String, attempts: u32) -> Self {
        Self {
            tenant,
            prefix,
            seq: 0,
            attempt: 1,
            attempts,
            occurred_at: now(),
        }
    }

    async fn call(&mut self, budget: &mut RetryBudgetClient<Conn>) -> Result<(), String> {
        let id = format!("{}{}", self.prefix, self.seq);
        let report = durable_report(id, self.attempt, self.occurred_at);
        let outcome = match budget.next_action(with_tenant(report, &self.tenant)).await {
            Ok(response) => check_durable(response.get_ref()).map(|()| response.into_inner()),
            Err(status) => Err(code(status)),
        };
        match &outcome {
            // On to the next attempt; after the last one, or whatever went wrong, a new activity.
            Ok(answer) if self.attempt < self.attempts => {
                self.attempt += 1;
                self.occurred_at = answer.not_before.unwrap_or_else(now);
            }
            _ => (self.seq, self.attempt, self.occurred_at) = (self.seq + 1, 1, now()),
        }
        outcome.map(|_| ())
    }
}

impl VirtualClient {
    /// Sends one request and checks the answer; the error is a gRPC code's name or an
    /// `unexpected_*` key, counted by key.
    pub async fn call(&mut self) -> Result<(), String> {
        match self {
            Self::Raw(raw) => raw.call().await,
            Self::Health(health) => check_health(
                health
                    .check(health_request())
                    .await
                    .map_err(code)?
                    .get_ref(),
            ),
            Self::RetryDelay(budget) => {
                let response = budget.retry_delay(retry_delay_request()).await;
                check_retry_delay(response.map_err(code)?.get_ref())
            }
            Self::PureNextAction(budget) => {
                let response = budget.next_action(pure_next_action_request()).await;
                check_pure_next_action(response.map_err(code)?.get_ref())
            }
            Self::Durable(budget, walk) => walk.call(budget).await,
            Self::Stored(budget, tenant, stored, rng) => {
                let claim = stored
                    .claim(rng)
                    .ok_or_else(|| "no_free_activity".to_owned())?;
                let id = crate::preload::activity_id(crate::preload::PREFIX, claim.index as u64);
                let request = with_tenant(durable_report(id, claim.attempt, now()), tenant);
                let outcome = match budget.next_action(request).await {
                    Ok(response) => check_durable(response.get_ref()),
                    Err(status) => Err(code(status)),
                };
                stored.release(claim, &outcome);
                outcome
            }
            Self::Mixed(budget, mixed) => mixed.call(budget).await,
        }
    }
}

pub fn with_tenant<T>(message: T, tenant: &MetadataValue<Ascii>) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(TENANT_HEADER, tenant.clone());
    request
}

/// A failed call's gRPC code, as an error key.
pub fn code(status: tonic::Status) -> String {
    format!("{:?}", status.code())
}

/// The wall clock in whole milliseconds (what the service keeps), as a protobuf timestamp.
pub fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since.subsec_millis() * 1_000_000).unwrap_or(0),
    }
}
