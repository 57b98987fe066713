//! What one request of each scenario is, and what counts as its success.

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::Timestamp;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::{self, retry_budget_client::RetryBudgetClient};
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
pub fn durable_report(
    activity_id: String,
    attempt: u32,
    occurred_at: Timestamp,
) -> pb::NextActionRequest {
    pb::NextActionRequest {
        attempt,
        error_class: pb::ErrorClass::Transient as i32,
        policy: Some(pb::Policy {
            max_attempts: GENEROUS_MAX_ATTEMPTS,
            deadline_seconds: GENEROUS_DEADLINE_SECONDS,
            base: None,
            cap: None,
        }),
        dependency: DEPENDENCY.get().cloned().unwrap_or_default(),
        activity_id,
        occurred_at: Some(occurred_at),
        ..Default::default()
    }
}

/// The request a scenario sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Health,
    RetryDelay,
    PureNextAction,
    Durable { attempts: u32 },
    Stored,
    Mixed { attempts: u32, tenants: u64 },
}

pub fn health_request() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

pub fn check_health(response: &HealthCheckResponse) -> Result<(), String> {
    let serving = response.status == ServingStatus::Serving as i32;
    serving
        .then_some(())
        .ok_or_else(|| "unexpected_not_serving".into())
}

/// The body h2load sends too.
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
    (response.delay_seconds == 11)
        .then_some(())
        .ok_or_else(|| "unexpected_delay".into())
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
    let retry = response.action == pb::Action::ScheduleRetry as i32;
    retry
        .then_some(())
        .ok_or_else(|| "unexpected_action".into())
}

/// A durable report's answer is a fresh decision to retry: no report is sent twice.
pub fn check_durable(response: &pb::NextActionResponse) -> Result<(), String> {
    if response.replayed {
        return Err("unexpected_replay".into());
    }
    if response.action != pb::Action::ScheduleRetry as i32 {
        return Err(format!("unexpected_action_{}", response.code));
    }
    Ok(())
}

/// How a virtual client sends.
pub enum Transport {
    Tonic {
        health: HealthClient<Conn>,
        budget: RetryBudgetClient<Conn>,
    },
    Raw(RawClient),
}

impl Transport {
    pub fn tonic(conn: Conn) -> Self {
        Self::Tonic {
            health: HealthClient::new(conn.clone()),
            budget: RetryBudgetClient::new(conn),
        }
    }
}

/// One virtual client on one of the shared connections, and its own request state.
pub struct VirtualClient {
    kind: Kind,
    transport: Transport,
    tenant: MetadataValue<Ascii>,
    /// The durable walk: ids `{prefix}{seq}`, the attempt to report next and when it failed
    /// (the previous answer's `not_before`, as a worker that retries on time reports it).
    prefix: String,
    seq: u64,
    attempt: u32,
    occurred_at: Timestamp,
    stored: Option<(Arc<Stored>, Rng)>,
    mixed: Option<Mixed>,
}

impl VirtualClient {
    pub fn new(kind: Kind, transport: Transport, tenant: &str, prefix: &str) -> Self {
        let mixed = match kind {
            Kind::Mixed { attempts, tenants } => {
                let seed = prefix.bytes().fold(0u64, |h, b| {
                    h.wrapping_mul(0x100_0000_01B3).wrapping_add(u64::from(b))
                });
                Some(Mixed::new(prefix, attempts, tenants, seed))
            }
            _ => None,
        };
        Self {
            kind,
            transport,
            tenant: MetadataValue::try_from(tenant)
                .unwrap_or_else(|_| MetadataValue::from_static("bench")),
            prefix: prefix.to_owned(),
            seq: 0,
            attempt: 1,
            occurred_at: now(),
            stored: None,
            mixed,
        }
    }

    /// Reports over `stored` activities, drawn by a generator seeded with `seed`.
    pub fn with_stored(mut self, stored: Arc<Stored>, seed: u64) -> Self {
        self.stored = Some((stored, Rng::new(seed)));
        self
    }

    /// Sends one request and checks the answer; the error is a gRPC code's name or an
    /// `unexpected_*` key, counted by key.
    pub async fn call(&mut self) -> Result<(), String> {
        let (health, budget) = match &mut self.transport {
            Transport::Raw(raw) => return raw.call().await,
            Transport::Tonic { health, budget } => (health, budget),
        };
        match self.kind {
            Kind::Health => check_health(
                health
                    .check(health_request())
                    .await
                    .map_err(code)?
                    .get_ref(),
            ),
            Kind::RetryDelay => check_retry_delay(
                budget
                    .retry_delay(retry_delay_request())
                    .await
                    .map_err(code)?
                    .get_ref(),
            ),
            Kind::PureNextAction => {
                let response = budget
                    .next_action(pure_next_action_request())
                    .await
                    .map_err(code)?;
                check_pure_next_action(response.get_ref())
            }
            Kind::Durable { attempts } => {
                let report = durable_report(
                    format!("{}{}", self.prefix, self.seq),
                    self.attempt,
                    self.occurred_at,
                );
                let outcome = match budget.next_action(with_tenant(report, &self.tenant)).await {
                    Ok(response) => {
                        check_durable(response.get_ref()).map(|()| response.into_inner().not_before)
                    }
                    Err(status) => Err(code(status)),
                };
                match outcome {
                    // On to the next attempt; after the last one, or whatever went wrong, a
                    // new activity.
                    Ok(not_before) if self.attempt < attempts => {
                        self.attempt += 1;
                        self.occurred_at = not_before.unwrap_or_else(now);
                    }
                    _ => (self.seq, self.attempt, self.occurred_at) = (self.seq + 1, 1, now()),
                }
                outcome.map(|_| ())
            }
            Kind::Stored => {
                let Some((stored, rng)) = &mut self.stored else {
                    return Err("no_stored_activities".into());
                };
                let claim = stored
                    .claim(rng)
                    .ok_or_else(|| "no_free_activity".to_owned())?;
                let id = crate::preload::activity_id(crate::preload::PREFIX, claim.index as u64);
                let request = with_tenant(durable_report(id, claim.attempt, now()), &self.tenant);
                let outcome = match budget.next_action(request).await {
                    Ok(response) => check_durable(response.get_ref()),
                    Err(status) => Err(code(status)),
                };
                stored.release(claim, &outcome);
                outcome
            }
            Kind::Mixed { .. } => match &mut self.mixed {
                Some(mixed) => mixed.call(budget).await,
                None => Err("no_mixed_state".into()),
            },
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
