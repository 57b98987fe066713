//! Arbitrary bytes as `retrybudget.v1` requests, through the service the
//! server runs: `RetryBudgetService` over a `Ledger` on a real embedded store.
//!
//! The input is a sequence of steps, each `[kind][length: u16 LE][bytes]`
//! (the last one takes what is left): `kind % 6` picks the request type
//! (RetryDelay, NextAction, RecordSuccess, ResolveActivity, GetActivity,
//! ReportTraffic) and the bytes are decoded as it, as the server's codec
//! decodes them. `ReportTraffic` carries the tenant's gate on a real
//! bucket, as the layer attaches it.
//! Bytes that are not such a message are refused by the codec before the
//! service; the step is skipped. A sequence can report attempts of one
//! activity, resolve it, close it and read it back.
//!
//! Each input runs as a tenant of its own, so the store's earlier contents
//! never change its answers and a crash replays from its input alone.
//!
//! Checks, besides never panicking:
//! - a refusal has a gRPC code for bad input or state (never `INTERNAL`),
//!   a message starting with a stable code of `codes::ALL`, and an
//!   `ErrorInfo` with that code as reason in the API's domain; asked again,
//!   the same refusal;
//! - a durable `NextAction` that is refused, or a dry run, changes nothing
//!   stored (`GetActivity` before and after);
//! - a decision's code is its action's; a retry of a named activity waits
//!   between 1 s and the larger of its policy's cap and the hint cap, with
//!   `delay_seconds == delay_ms / 1000`; a durable retry starts at
//!   `occurred_at + delay_ms`, before the activity's deadline;
//! - a durable decision asked again is replayed unchanged;
//! - `RetryDelay` is the reference delay within its cap, and the same when
//!   asked again; a second `RecordSuccess` changes nothing;
//! - a `ReportTraffic` refused (counts that cannot be true, too many
//!   dependencies, too many reports) changes nothing the tenant's listing
//!   shows, and a pace is never negative or NaN.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tokio::runtime::Runtime;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

use retry_budget::bucket::{FairBucket, TenantGate};
use retry_budget::budget::activity::Policy;
use retry_budget::budget::classify::RuleSet;
use retry_budget::budget::codes;
use retry_budget::budget::{DelayParams, activity::Defaults};
use retry_budget::config::Config;
use retry_budget::grpc::pb::{self, retry_budget_server::RetryBudget};
use retry_budget::grpc::status::ERROR_DOMAIN;
use retry_budget::grpc::{Draining, RetryBudgetService};
use retry_budget::ledger::Ledger;
use retry_budget::store::{EmbeddedStore, EmbeddedStoreOptions};

/// Inputs served by one store before it is dropped and a new one opened,
/// so that a long run does not grow one store without end.
const INPUTS_PER_STORE: u64 = 20_000;

/// The service on its store, and the directory the store lives in.
struct Server {
    service: RetryBudgetService<EmbeddedStore>,
    bucket: FairBucket,
    defaults: Defaults,
    inputs: u64,
    _dir: tempfile::TempDir,
}

impl Server {
    fn open(runtime: &Runtime) -> Self {
        // tmpfs when there is one: the store fsyncs every decision.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("a temporary directory");
        let config = Config::default();
        let defaults = Defaults {
            policy: config.policy.policy(),
            max_hint_ms: config.hints.max_hint_ms(),
        };
        let _entered = runtime.enter();
        let store = EmbeddedStore::open(&EmbeddedStoreOptions::new(dir.path())).expect("the store opens");
        let ledger = Arc::new(Ledger::new(store, defaults));
        let rules = Arc::new(ArcSwap::from_pointee(RuleSet::default()));
        let bucket = FairBucket::with_dependencies(&config.bucket, config.dependencies.clone())
            .expect("the default bucket");
        Self {
            service: RetryBudgetService::new(ledger, Draining::default(), rules),
            bucket,
            defaults,
            inputs: 0,
            _dir: dir,
        }
    }
}

struct Harness {
    runtime: Runtime,
    server: Mutex<Option<Server>>,
    tenants: std::sync::atomic::AtomicU64,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| Harness {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime"),
        server: Mutex::new(None),
        tenants: Default::default(),
    })
}

/// A request as the server hands it to the service: the tenant in its
/// metadata.
fn request<T>(tenant: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "x-tenant-id",
        tenant.parse().expect("tenant names are ASCII"),
    );
    request
}

/// The stable code of a refusal, after checking that it is one.
fn refusal_code(status: &Status) -> &'static str {
    assert!(
        matches!(
            status.code(),
            Code::InvalidArgument | Code::FailedPrecondition | Code::NotFound
        ),
        "a refusal of bad input or state: {status:?}"
    );
    let code = status
        .message()
        .split_once(": ")
        .map(|(code, _)| code)
        .unwrap_or_default();
    let stable = codes::intern(code);
    assert_ne!(stable, "other", "a stable code first: {status:?}");
    let details = status
        .get_error_details()
        .error_info()
        .cloned()
        .unwrap_or_else(|| panic!("an ErrorInfo: {status:?}"));
    assert_eq!(
        (details.reason.as_str(), details.domain.as_str()),
        (stable, ERROR_DOMAIN)
    );
    stable
}

/// The code of an answer: Ok, or the refusal's stable code.
fn outcome<T>(answer: &Result<tonic::Response<T>, Status>) -> Result<(), &'static str> {
    match answer {
        Ok(_) => Ok(()),
        Err(status) => Err(refusal_code(status)),
    }
}

/// The decision fields of a `NextAction` answer, without those that say how
/// it was answered (replayed, and whether this call took a token or booked
/// a slot).
fn decision(r: &pb::NextActionResponse) -> pb::NextActionResponse {
    pb::NextActionResponse {
        replayed: false,
        token_taken: false,
        slot_booked: false,
        ..r.clone()
    }
}

fn check_decision(req: &pb::NextActionRequest, r: &pb::NextActionResponse, defaults: &Defaults) {
    let action = pb::Action::try_from(r.action).expect("a known action");
    assert_ne!(action, pb::Action::Unspecified);
    let name = action
        .as_str_name()
        .strip_prefix("ACTION_")
        .expect("prefixed");
    assert_eq!(r.code, name.to_ascii_lowercase(), "the action's code");
    if action != pb::Action::ScheduleRetry || req.activity_id.is_empty() {
        return;
    }
    // The policy that decided: the recorded one (durable), the request's
    // (pure), else the reference's.
    let params = r
        .policy
        .or(req.policy)
        .map_or_else(DelayParams::default, |p| Policy::from(p).delay_params());
    let backoff_max = u64::from(params.cap.max(1)) * 1000 + 999;
    assert!(
        (1000..=backoff_max.max(defaults.max_hint_ms)).contains(&r.delay_ms),
        "delay {} ms with cap {} s and hints up to {} ms",
        r.delay_ms,
        params.cap,
        defaults.max_hint_ms
    );
    assert_eq!(u64::from(r.delay_seconds), r.delay_ms / 1000);
}

/// The activity as stored, or the refusal's code.
async fn stored(
    service: &RetryBudgetService<EmbeddedStore>,
    tenant: &str,
    activity_id: &str,
) -> Result<pb::Activity, &'static str> {
    let got = service
        .get_activity(request(
            tenant,
            pb::GetActivityRequest {
                activity_id: activity_id.to_owned(),
            },
        ))
        .await;
    outcome(&got)?;
    let activity = got.expect("checked").into_inner();
    assert_eq!(
        (activity.tenant.as_str(), activity.activity_id.as_str()),
        (tenant, activity_id)
    );
    Ok(activity)
}

/// `ReportTraffic` as the layer hands it over: with the tenant's gate.
fn gated<T>(server: &Server, tenant: &str, message: T) -> Request<T> {
    let mut r = request(tenant, message);
    r.extensions_mut()
        .insert(TenantGate::new(server.bucket.clone(), Arc::from(tenant)));
    r
}

/// What the tenant's listing shows of its dependencies, the paces aside
/// (they move with time): names and counters.
async fn listing(server: &Server, tenant: &str) -> Vec<(String, u64, u64, u64)> {
    let answer = server
        .service
        .report_traffic(gated(server, tenant, pb::ReportTrafficRequest::default()))
        .await
        .expect("an empty report lists");
    let mut rows: Vec<_> = answer
        .into_inner()
        .dependencies
        .into_iter()
        .map(|d| {
            assert!(
                d.allowed_rate.is_finite() && d.allowed_rate >= 0.0,
                "a pace: {d:?}"
            );
            (d.dependency, d.calls, d.successes, d.failures)
        })
        .collect();
    rows.sort();
    rows
}

async fn report_traffic(server: &Server, tenant: &str, req: pb::ReportTrafficRequest) {
    let before = listing(server, tenant).await;
    let answer = server
        .service
        .report_traffic(gated(server, tenant, req.clone()))
        .await;
    match &answer {
        Ok(r) => {
            for pace in &r.get_ref().dependencies {
                assert!(
                    pace.allowed_rate.is_finite() && pace.allowed_rate >= 0.0,
                    "a pace: {pace:?}"
                );
            }
        }
        Err(status) if status.code() == Code::ResourceExhausted => {
            // More reports a second than a tenant may send.
            assert!(
                status.message().starts_with(codes::TRAFFIC_REPORTS_TOO_FREQUENT),
                "{status:?}"
            );
            assert_eq!(listing(server, tenant).await, before, "refused, unchanged");
        }
        Err(status) => {
            refusal_code(status);
            assert_eq!(listing(server, tenant).await, before, "refused, unchanged");
        }
    }
}

async fn next_action(server: &Server, tenant: &str, req: pb::NextActionRequest) {
    let service = &server.service;
    let durable = req.budget.is_none();
    let before = if durable {
        Some(stored(service, tenant, &req.activity_id).await)
    } else {
        None
    };
    let answer = service.next_action(request(tenant, req.clone())).await;
    let again = service.next_action(request(tenant, req.clone())).await;
    match (&answer, &again) {
        (Ok(first), Ok(second)) => {
            let (first, second) = (first.get_ref(), second.get_ref());
            check_decision(&req, first, &server.defaults);
            check_decision(&req, second, &server.defaults);
            if durable && !req.dry_run {
                assert!(second.replayed, "asked again, replayed: {second:?}");
                // A replay spends nothing: no token is taken, no slot booked.
                assert!(
                    !second.token_taken && !second.slot_booked,
                    "a replay takes no token: {second:?}"
                );
                assert_eq!(
                    decision(first),
                    decision(second),
                    "a replay is the decision"
                );
                let activity = stored(service, tenant, &req.activity_id)
                    .await
                    .expect("a decided activity is stored");
                assert!(activity.attempts >= first.attempt);
                if first.action == pb::Action::ScheduleRetry as i32 {
                    let ms = |t: &prost_types::Timestamp| {
                        t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
                    };
                    let not_before = ms(first.not_before.as_ref().expect("a retry has a start"));
                    // A replay answers with the recorded occurred_at.
                    if let Some(occurred_at) = req.occurred_at.as_ref().filter(|_| !first.replayed)
                    {
                        let delay = i64::try_from(first.delay_ms).expect("bounded above");
                        assert_eq!(not_before, ms(occurred_at).saturating_add(delay));
                    }
                    let policy = activity.policy.expect("recorded");
                    let started = ms(activity.started_at.as_ref().expect("recorded"));
                    let deadline = i64::try_from(policy.deadline_seconds.saturating_mul(1000))
                        .unwrap_or(i64::MAX);
                    assert!(
                        not_before <= started.saturating_add(deadline),
                        "before the deadline"
                    );
                }
            }
        }
        (Err(first), Err(second)) => {
            assert_eq!(
                refusal_code(first),
                refusal_code(second),
                "the same refusal again"
            );
        }
        // Nothing changed in between that could change the answer: a
        // refusal stores nothing, and a decision is replayed.
        (Err(first), Ok(_)) => panic!("refused, then accepted: {first:?}"),
        (Ok(_), Err(second)) => panic!("answered, then refused: {second:?}"),
    }
    if let Some(before) = before
        && (answer.is_err() || req.dry_run)
    {
        let after = stored(service, tenant, &req.activity_id).await;
        assert_eq!(
            before, after,
            "a refusal or a dry run changes nothing stored"
        );
    }
}

async fn retry_delay(server: &Server, tenant: &str, req: pb::RetryDelayRequest) {
    let service = &server.service;
    let answer = service.retry_delay(request(tenant, req.clone())).await;
    let again = service.retry_delay(request(tenant, req.clone())).await;
    assert_eq!(outcome(&answer), outcome(&again));
    if let (Ok(answer), Ok(again)) = (answer, again) {
        let (answer, again) = (answer.into_inner(), again.into_inner());
        assert_eq!(answer, again, "a pure function");
        let cap = req.cap.unwrap_or(DelayParams::default().cap);
        let max = u64::from(cap.max(1)) * 1000 + 999;
        assert!(
            (1000..=max).contains(&answer.delay_ms),
            "{answer:?} with cap {cap}"
        );
        assert_eq!(u64::from(answer.delay_seconds), answer.delay_ms / 1000);
    }
}

async fn record_success(server: &Server, tenant: &str, req: pb::RecordSuccessRequest) {
    let service = &server.service;
    let answer = service.record_success(request(tenant, req.clone())).await;
    if outcome(&answer).is_err() {
        return;
    }
    let again = service
        .record_success(request(tenant, req.clone()))
        .await
        .unwrap_or_else(|status| panic!("a success recorded twice: {status:?}"))
        .into_inner();
    assert!(!again.changed, "a second success changes nothing");
    let status = pb::ActivityStatus::try_from(again.status).expect("known");
    let known = stored(service, tenant, &req.activity_id).await;
    match status {
        pb::ActivityStatus::Unspecified => assert_eq!(known, Err(codes::ACTIVITY_NOT_FOUND)),
        pb::ActivityStatus::Closed => assert_eq!(
            known.expect("closed is stored").status,
            pb::ActivityStatus::Closed as i32
        ),
        other => panic!("a success leaves {other:?}"),
    }
}

async fn resolve(server: &Server, tenant: &str, req: pb::ResolveActivityRequest) {
    let answer = server
        .service
        .resolve_activity(request(tenant, req.clone()))
        .await;
    if let Ok(answer) = outcome(&answer).map(|()| answer.expect("checked").into_inner()) {
        let activity = stored(&server.service, tenant, &req.activity_id)
            .await
            .expect("a resolved activity is stored");
        assert_eq!(activity.status, answer.status);
    }
}

async fn get(server: &Server, tenant: &str, req: pb::GetActivityRequest) {
    let _ = stored(&server.service, tenant, &req.activity_id).await;
}

fuzz_target!(|data: &[u8]| {
    let harness = harness();
    let mut slot = harness.server.lock().expect("one input at a time");
    if slot.as_ref().is_some_and(|s| s.inputs >= INPUTS_PER_STORE) {
        // Dropped inside the runtime: closing the store checkpoints it.
        let _entered = harness.runtime.enter();
        *slot = None;
    }
    let server = slot.get_or_insert_with(|| Server::open(&harness.runtime));
    server.inputs += 1;
    let n = harness
        .tenants
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tenant = format!("fuzz-{n}");
    let mut rest = data;
    harness.runtime.block_on(async {
        while let [kind, tail @ ..] = rest {
            let (len, tail) = match tail {
                [lo, hi, tail @ ..] => (usize::from(u16::from_le_bytes([*lo, *hi])), tail),
                _ => (tail.len(), &[][..]),
            };
            let (bytes, tail) = tail.split_at(len.min(tail.len()));
            rest = tail;
            match kind % 6 {
                0 => {
                    if let Ok(req) = pb::RetryDelayRequest::decode(bytes) {
                        retry_delay(server, &tenant, req).await;
                    }
                }
                1 => {
                    if let Ok(req) = pb::NextActionRequest::decode(bytes) {
                        next_action(server, &tenant, req).await;
                    }
                }
                2 => {
                    if let Ok(req) = pb::RecordSuccessRequest::decode(bytes) {
                        record_success(server, &tenant, req).await;
                    }
                }
                3 => {
                    if let Ok(req) = pb::ResolveActivityRequest::decode(bytes) {
                        resolve(server, &tenant, req).await;
                    }
                }
                4 => {
                    if let Ok(req) = pb::GetActivityRequest::decode(bytes) {
                        get(server, &tenant, req).await;
                    }
                }
                _ => {
                    if let Ok(req) = pb::ReportTrafficRequest::decode(bytes) {
                        report_traffic(server, &tenant, req).await;
                    }
                }
            }
        }
    });
});
