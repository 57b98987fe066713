//! What one request of each scenario is, and what counts as its success.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::conn::Conn;
use prost_types::Timestamp;
use retry_budget::grpc::TENANT_HEADER;
use retry_budget::grpc::pb::{self, retry_budget_client::RetryBudgetClient};
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Attempts the durable policy allows: far more than any run walks, so
/// every answer is a scheduled retry.
pub const GENEROUS_MAX_ATTEMPTS: u32 = 1000;
/// Deadline of the durable policy: ten years, never reached.
pub const GENEROUS_DEADLINE_SECONDS: u64 = 10 * 365 * 24 * 3600;

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
    health: HealthClient<Conn>,
    budget: RetryBudgetClient<Conn>,
    tenant: MetadataValue<tonic::metadata::Ascii>,
    walk: Walk,
}

impl VirtualClient {
    /// A client of `kind` on `channel`; durable activity ids start with
    /// `prefix`.
    pub fn new(kind: Kind, channel: Conn, tenant: &str, prefix: &str) -> Self {
        Self {
            kind,
            health: HealthClient::new(channel.clone()),
            budget: RetryBudgetClient::new(channel),
            tenant: MetadataValue::try_from(tenant)
                .unwrap_or_else(|_| MetadataValue::from_static("bench")),
            walk: Walk {
                prefix: prefix.to_owned(),
                seq: 0,
                attempt: 1,
                occurred_at: now(),
            },
        }
    }

    /// Sends one request and checks the answer.
    ///
    /// # Errors
    /// The gRPC code of a failed call, or `unexpected_*` for an answer that
    /// is not what the scenario expects; used as a key to count errors.
    pub async fn call(&mut self) -> Result<(), String> {
        match self.kind {
            Kind::Health => {
                let request = HealthCheckRequest {
                    service: String::new(),
                };
                let response = self.health.check(request).await.map_err(code)?;
                if response.get_ref().status
                    != tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return Err("unexpected_not_serving".into());
                }
                Ok(())
            }
            Kind::RetryDelay => {
                let request = pb::RetryDelayRequest {
                    activity_id: "flight-1".into(),
                    attempt: 4,
                    base: None,
                    cap: None,
                };
                let response = self.budget.retry_delay(request).await.map_err(code)?;
                // The article's retry_delay("flight-1", 4) is 11 seconds.
                if response.get_ref().delay_seconds != 11 {
                    return Err("unexpected_delay".into());
                }
                Ok(())
            }
            Kind::PureNextAction => {
                let request = pb::NextActionRequest {
                    budget: Some(pb::Budget {
                        attempts: 1,
                        max_attempts: 3,
                        elapsed: 5,
                        deadline: 30,
                    }),
                    activity_id: "flight-1".into(),
                    error_class: pb::ErrorClass::Transient as i32,
                    ..Default::default()
                };
                let response = self.budget.next_action(request).await.map_err(code)?;
                if response.get_ref().action != pb::Action::ScheduleRetry as i32 {
                    return Err("unexpected_action".into());
                }
                Ok(())
            }
            Kind::Durable { attempts } => self.durable(attempts).await,
        }
    }

    /// Reports the next failure of the activity being walked.
    async fn durable(&mut self, attempts: u32) -> Result<(), String> {
        let walk = &mut self.walk;
        let mut request = Request::new(durable_report(
            format!("{}{}", walk.prefix, walk.seq),
            walk.attempt,
            walk.occurred_at,
        ));
        request
            .metadata_mut()
            .insert(TENANT_HEADER, self.tenant.clone());
        let answer = match self.budget.next_action(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                // Whatever happened to this activity, carry on with a new one.
                walk.next_activity();
                return Err(code(status));
            }
        };
        if answer.replayed {
            walk.next_activity();
            return Err("unexpected_replay".into());
        }
        if answer.action != pb::Action::ScheduleRetry as i32 {
            walk.next_activity();
            return Err(format!("unexpected_action_{}", answer.code));
        }
        if walk.attempt >= attempts {
            walk.next_activity();
        } else {
            walk.attempt += 1;
            walk.occurred_at = answer.not_before.unwrap_or_else(now);
        }
        Ok(())
    }
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
