//! What one request of each scenario is, and what counts as its success.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::conn::Conn;
use crate::mixed::Mixed;
use crate::raw::RawClient;
use crate::stored::{Rng, Stored};
use prost_types::Timestamp;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::{self, retry_budget_client::RetryBudgetClient};
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// Attempts the durable policy allows: far more than any run walks, so
/// every answer is a scheduled retry.
pub const GENEROUS_MAX_ATTEMPTS: u32 = 1000;
/// Deadline of the durable policy: ten years, never reached.
pub const GENEROUS_DEADLINE_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// The dependency durable reports name (`--dependency`); empty, the
/// default one. Set once, before the first request.
pub static DEPENDENCY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A transient failure of `attempt` under the durable policy: what the
/// durable scenario and the preload report.
pub fn durable_report(
    activity_id: String,
    attempt: u32,
    occurred_at: Timestamp,
) -> pb::NextActionRequest {
    pb::NextActionRequest {
        activity_id,
        attempt,
        error_class: pb::ErrorClass::Transient as i32,
        policy: Some(pb::Policy {
            max_attempts: GENEROUS_MAX_ATTEMPTS,
            deadline_seconds: GENEROUS_DEADLINE_SECONDS,
            base: None,
            cap: None,
        }),
        occurred_at: Some(occurred_at),
        dependency: DEPENDENCY.get().cloned().unwrap_or_default(),
        ..Default::default()
    }
}

/// The request a scenario sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `grpc.health.v1.Health/Check` for service `""`.
    Health,
    /// `RetryDelay("flight-1", 4)`, the body h2load sends too.
    RetryDelay,
    /// `NextAction` with a budget: evaluated as given, nothing stored.
    PureNextAction,
    /// `NextAction` in its durable form, attempts `1..=attempts` of one
    /// activity after another.
    Durable {
        /// Attempts each activity is walked through.
        attempts: u32,
    },
    /// `NextAction` in its durable form: the next attempt of a uniformly
    /// random activity among those already stored ([`crate::stored`]).
    Stored,
    /// Durable reports, deferrals waited out and successes over many
    /// tenants ([`crate::mixed`]).
    Mixed {
        /// Failures reported an activity before its success.
        attempts: u32,
        /// Tenants drawn among.
        tenants: u64,
    },
}

/// The health scenario's request: the server's overall status.
pub fn health_request() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// A health answer is right when the server is serving.
///
/// # Errors
/// `unexpected_not_serving` otherwise.
pub fn check_health(response: &HealthCheckResponse) -> Result<(), String> {
    if response.status != ServingStatus::Serving as i32 {
        return Err("unexpected_not_serving".into());
    }
    Ok(())
}

/// `RetryDelay("flight-1", 4)`, the body h2load sends too.
pub fn retry_delay_request() -> pb::RetryDelayRequest {
    pb::RetryDelayRequest {
        activity_id: "flight-1".into(),
        attempt: 4,
        base: None,
        cap: None,
    }
}

/// The article's `retry_delay("flight-1", 4)` is 11 seconds.
///
/// # Errors
/// `unexpected_delay` for any other delay.
pub fn check_retry_delay(response: &pb::RetryDelayResponse) -> Result<(), String> {
    if response.delay_seconds != 11 {
        return Err("unexpected_delay".into());
    }
    Ok(())
}

/// A pure `NextAction`: a transient failure with two of three attempts
/// and 25 of 30 seconds left, so a retry is planned.
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

/// The pure `NextAction`'s answer is a scheduled retry.
///
/// # Errors
/// `unexpected_action` for any other action.
pub fn check_pure_next_action(response: &pb::NextActionResponse) -> Result<(), String> {
    if response.action != pb::Action::ScheduleRetry as i32 {
        return Err("unexpected_action".into());
    }
    Ok(())
}

/// A durable report's answer is a fresh decision to retry: under the
/// generous policy every failure is scheduled, and no report is sent twice.
///
/// # Errors
/// `unexpected_replay` for an answer replayed from the store,
/// `unexpected_action_{code}` for any action but a scheduled retry.
pub fn check_durable(response: &pb::NextActionResponse) -> Result<(), String> {
    if response.replayed {
        return Err("unexpected_replay".into());
    }
    if response.action != pb::Action::ScheduleRetry as i32 {
        return Err(format!("unexpected_action_{}", response.code));
    }
    Ok(())
}

/// Where a virtual client is in its walk of durable activities.
#[derive(Debug)]
struct Walk {
    /// `b{run}-{client}-`: ids no other client or run uses.
    prefix: String,
    /// The activity being walked, appended to `prefix`.
    seq: u64,
    /// The attempt to report next, 1-based.
    attempt: u32,
    /// When that attempt failed: the previous answer's `not_before`, as a
    /// worker that retries on time would report it.
    occurred_at: Timestamp,
}

impl Walk {
    /// Moves on to a fresh activity.
    fn next_activity(&mut self) {
        self.seq += 1;
        self.attempt = 1;
        self.occurred_at = now();
    }
}

/// One virtual client: a client on one of the shared connections, and its
/// own request state.
pub struct VirtualClient {
    kind: Kind,
    transport: Transport,
    tenant: MetadataValue<tonic::metadata::Ascii>,
    walk: Walk,
    /// The stored activities, for [`Kind::Stored`], and this client's draw.
    stored: Option<(Arc<Stored>, Rng)>,
    /// This client's activities, for [`Kind::Mixed`].
    mixed: Option<Mixed>,
}

/// How a virtual client sends: tonic's generated clients, or the same
/// requests prepared once and sent over h2 ([`crate::raw`]).
pub enum Transport {
    Tonic(TonicClients),
    Raw(RawClient),
}

/// The generated clients on one connection.
pub struct TonicClients {
    health: HealthClient<Conn>,
    budget: RetryBudgetClient<Conn>,
}

impl TonicClients {
    /// Both generated clients on `channel`.
    pub fn new(channel: Conn) -> Self {
        Self {
            health: HealthClient::new(channel.clone()),
            budget: RetryBudgetClient::new(channel),
        }
    }
}

impl VirtualClient {
    /// A client of `kind` sending through `transport`; durable activity ids
    /// start with `prefix`.
    pub fn new(kind: Kind, transport: Transport, tenant: &str, prefix: &str) -> Self {
        Self {
            kind,
            transport,
            tenant: MetadataValue::try_from(tenant)
                .unwrap_or_else(|_| MetadataValue::from_static("bench")),
            walk: Walk {
                prefix: prefix.to_owned(),
                seq: 0,
                attempt: 1,
                occurred_at: now(),
            },
            stored: None,
            mixed: match kind {
                Kind::Mixed { attempts, tenants } => {
                    let seed = prefix.bytes().fold(0u64, |h, b| {
                        h.wrapping_mul(0x100_0000_01B3).wrapping_add(u64::from(b))
                    });
                    Some(Mixed::new(prefix, attempts, tenants, seed))
                }
                _ => None,
            },
        }
    }

    /// Reports over `stored` activities ([`Kind::Stored`]), drawn with a
    /// generator seeded by `seed`.
    #[must_use]
    pub fn with_stored(mut self, stored: Arc<Stored>, seed: u64) -> Self {
        self.stored = Some((stored, Rng::new(seed)));
        self
    }

    /// Sends one request and checks the answer.
    ///
    /// # Errors
    /// The gRPC code of a failed call, or `unexpected_*` for an answer that
    /// is not what the scenario expects; used as a key to count errors.
    pub async fn call(&mut self) -> Result<(), String> {
        let tonic = match &mut self.transport {
            Transport::Raw(raw) => return raw.call().await,
            Transport::Tonic(tonic) => tonic,
        };
        match self.kind {
            Kind::Health => {
                let response = tonic.health.check(health_request()).await.map_err(code)?;
                check_health(response.get_ref())
            }
            Kind::RetryDelay => {
                let response = tonic
                    .budget
                    .retry_delay(retry_delay_request())
                    .await
                    .map_err(code)?;
                check_retry_delay(response.get_ref())
            }
            Kind::PureNextAction => {
                let response = tonic
                    .budget
                    .next_action(pure_next_action_request())
                    .await
                    .map_err(code)?;
                check_pure_next_action(response.get_ref())
            }
            Kind::Durable { attempts } => {
                durable(&mut tonic.budget, &self.tenant, &mut self.walk, attempts).await
            }
            Kind::Stored => {
                let Some((stored, rng)) = &mut self.stored else {
                    return Err("no_stored_activities".into());
                };
                stored_report(&mut tonic.budget, &self.tenant, stored, rng).await
            }
            Kind::Mixed { .. } => {
                let Some(mixed) = &mut self.mixed else {
                    return Err("no_mixed_state".into());
                };
                mixed.call(&mut tonic.budget).await
            }
        }
    }
}

/// Reports the next failure of the activity being walked.
async fn durable(
    budget: &mut RetryBudgetClient<Conn>,
    tenant: &MetadataValue<tonic::metadata::Ascii>,
    walk: &mut Walk,
    attempts: u32,
) -> Result<(), String> {
    let mut request = Request::new(durable_report(
        format!("{}{}", walk.prefix, walk.seq),
        walk.attempt,
        walk.occurred_at,
    ));
    request.metadata_mut().insert(TENANT_HEADER, tenant.clone());
    let answer = match budget.next_action(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            // Whatever happened to this activity, carry on with a new one.
            walk.next_activity();
            return Err(code(status));
        }
    };
    if let Err(key) = check_durable(&answer) {
        walk.next_activity();
        return Err(key);
    }
    if walk.attempt >= attempts {
        walk.next_activity();
    } else {
        walk.attempt += 1;
        walk.occurred_at = answer.not_before.unwrap_or_else(now);
    }
    Ok(())
}

/// Reports the next failure of a random stored activity.
async fn stored_report(
    budget: &mut RetryBudgetClient<Conn>,
    tenant: &MetadataValue<tonic::metadata::Ascii>,
    stored: &Stored,
    rng: &mut Rng,
) -> Result<(), String> {
    let claim = stored
        .claim(rng)
        .ok_or_else(|| "no_free_activity".to_owned())?;
    let mut request = Request::new(durable_report(
        crate::preload::activity_id(claim.index as u64),
        claim.attempt,
        now(),
    ));
    request.metadata_mut().insert(TENANT_HEADER, tenant.clone());
    let outcome = match budget.next_action(request).await {
        Ok(response) => check_durable(response.get_ref()),
        Err(status) => Err(code(status)),
    };
    stored.release(claim, &outcome);
    outcome
}

/// The name of a failed call's gRPC code, as an error key.
fn code(status: tonic::Status) -> String {
    format!("{:?}", status.code())
}

/// The wall clock as a protobuf timestamp.
pub fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        // Whole milliseconds: the service keeps milliseconds.
        nanos: i32::try_from(since.subsec_millis() * 1_000_000).unwrap_or(0),
    }
}
