//! Criterion micro-benchmarks of the core (`cargo bench --bench core`): what one decision
//! costs before any network or disk. `retry_delay` (the sha256-jittered backoff);
//! `next_action` with and without its explanation; `activity_plan`, a fresh decision and a
//! replay on a record of four events; the record encoded and decoded as JSON (the first
//! versions' format) and as the store writes it (`record_codec`); `redb_load` of 10k stored,
//! from redb and from the in-memory overlay; failure classification and hint normalisation;
//! the token bucket as the tower layer pays it, and its fair-share algorithm alone.

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use retry_budget::bucket::{BucketConfig, FairBucket, FairShares};
use retry_budget::budget::activity::{
    self, ActivityKey, ActivityRecord, Defaults, Plan, Policy, Report,
};
use retry_budget::budget::classify::{Failure, NetworkFailure, Reach, RuleSet, Safety};
use retry_budget::budget::hint::{self, RawHints};
use retry_budget::budget::{Budget, DelayParams, ErrorClass, explain, next_action, retry_delay};
use retry_budget::store::{RedbStore, RedbStoreOptions, Store, codec};

/// A fixed logical time (2026-01-01T00:00:00Z), so runs are comparable.
const T0_MS: i64 = 1_767_225_600_000;

fn policy() -> Policy {
    Policy {
        max_attempts: 10,
        deadline_seconds: 3600,
        base: None,
        cap: None,
    }
}

fn defaults() -> Defaults {
    Defaults {
        policy: policy(),
        // The server's default cap on hinted delays (1 h).
        max_hint_ms: 3_600_000,
    }
}

fn key(id: &str) -> ActivityKey {
    ActivityKey {
        tenant: "bench".into(),
        activity_id: id.into(),
    }
}

fn report(attempt: u32, occurred_at_ms: i64) -> Report<'static> {
    Report {
        attempt,
        class: ErrorClass::Transient,
        rule: None,
        hints: None,
        policy: Some(policy()),
        occurred_at_ms: Some(occurred_at_ms),
        workflow_id: "",
        dependency: "",
    }
}

/// The record of `id` after `attempts` transient failures, each reported
/// at the previous retry's `not_before`, as the durable path builds it.
fn record_with(id: &str, attempts: u32) -> ActivityRecord {
    let defaults = defaults();
    let key = key(id);
    let mut record = None;
    let mut at = T0_MS;
    for attempt in 1..=attempts {
        let plan = activity::plan(record.take(), &key, &report(attempt, at), &defaults, at)
            .expect("a fresh attempt in order is accepted");
        let Plan::Fresh(draft) = plan else {
            panic!("attempt {attempt} is fresh");
        };
        let (next, event) = draft.finish();
        at = event
            .not_before_ms
            .expect("a transient failure within budget is retried");
        record = Some(next);
    }
    record.expect("at least one attempt")
}

fn delay(c: &mut Criterion) {
    c.bench_function("retry_delay", |b| {
        b.iter(|| retry_delay(black_box("flight-1"), black_box(4), DelayParams::default()))
    });
}

fn action(c: &mut Criterion) {
    let budget = Budget {
        attempts: 1,
        max_attempts: 3,
        elapsed: 5,
        deadline: 30,
    };
    c.bench_function("next_action", |b| {
        b.iter(|| next_action(black_box(&budget), black_box(ErrorClass::Transient)))
    });
    c.bench_function("next_action_explain", |b| {
        b.iter(|| {
            let action = next_action(black_box(&budget), black_box(ErrorClass::Transient));
            explain(action, &budget)
        })
    });
}

fn plan(c: &mut Criterion) {
    let defaults = defaults();
    let record = record_with("charge-42", 4);
    let key = key("charge-42");
    let next_at = record
        .events
        .last()
        .and_then(|e| e.not_before_ms)
        .expect("the last decision is a retry");
    let mut group = c.benchmark_group("activity_plan");
    group.bench_function("fresh_after_4_events", |b| {
        b.iter_batched(
            || record.clone(),
            |record| {
                let plan =
                    activity::plan(Some(record), &key, &report(5, next_at), &defaults, next_at);
                match plan {
                    Ok(Plan::Fresh(draft)) => Some(draft.finish()),
                    _ => None,
                }
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("replay_after_4_events", |b| {
        b.iter_batched(
            || record.clone(),
            |record| activity::plan(Some(record), &key, &report(3, T0_MS), &defaults, next_at),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn json(c: &mut Criterion) {
    let record = record_with("charge-42", 4);
    let bytes = serde_json::to_vec(&record).expect("a record encodes");
    let event = record.events.last().expect("a record with events");
    let event_bytes = serde_json::to_vec(event).expect("an event encodes");
    // What the store serialises: the whole record, its events included.
    let mut group = c.benchmark_group("record_json");
    group.bench_function("record_encode", |b| {
        b.iter(|| serde_json::to_vec(black_box(&record)))
    });
    group.bench_function("record_decode", |b| {
        b.iter(|| serde_json::from_slice::<ActivityRecord>(black_box(&bytes)))
    });
    group.bench_function("event_encode", |b| {
        b.iter(|| serde_json::to_vec(black_box(event)))
    });
    group.bench_function("event_decode", |b| {
        b.iter(|| serde_json::from_slice::<activity::Event>(black_box(&event_bytes)))
    });
    group.finish();
}

fn stored(c: &mut Criterion) {
    let record = record_with("charge-42", 4);
    let mut bytes = Vec::new();
    codec::encode_into(&record, &mut bytes);
    let mut group = c.benchmark_group("record_codec");
    group.bench_function("record_encode", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(1024);
            codec::encode_into(black_box(&record), &mut out);
            out
        })
    });
    group.bench_function("record_decode", |b| {
        b.iter(|| codec::decode(black_box(&bytes)))
    });
    group.bench_function("record_clone", |b| b.iter(|| black_box(&record).clone()));
    group.finish();
}

fn redb_load(c: &mut Criterion) {
    const STORED: u32 = 10_000;
    let dir = tempfile::tempdir().expect("a temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let mut options = RedbStoreOptions::new(dir.path());
    // No checkpoint by age while the overlay is measured.
    options.segment_age = Duration::from_secs(3600);
    let store = RedbStore::open(&options).expect("the store opens");
    runtime.block_on(async {
        let template = record_with("template", 2);
        // Concurrent saves share group commits: the setup takes a second,
        // not STORED fsyncs.
        let mut saves = tokio::task::JoinSet::new();
        for i in 0..STORED {
            let mut record = template.clone();
            record.activity_id = format!("act-{i:06}");
            let store = store.clone();
            saves.spawn(async move { store.save(record, None).await });
        }
        while let Some(saved) = saves.join_next().await {
            saved
                .expect("a save task completes")
                .expect("a save succeeds");
        }
        // Into redb: the loads below read the B-tree, not the overlay.
        store.checkpoint().await.expect("a checkpoint");
    });
    let keys: Vec<ActivityKey> = (0..STORED)
        .step_by(97)
        .map(|i| key(&format!("act-{i:06}")))
        .collect();
    let mut group = c.benchmark_group("redb_load_10k_stored");
    let mut i = 0;
    group.bench_function("hit", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            runtime.block_on(store.load(black_box(&keys[i])))
        })
    });
    let missing = key("not-stored");
    group.bench_function("miss", |b| {
        b.iter(|| runtime.block_on(store.load(black_box(&missing))))
    });
    // Saved since the last checkpoint: served from memory.
    let fresh = record_with("fresh", 2);
    runtime
        .block_on(store.save(fresh.clone(), None))
        .expect("a save succeeds");
    let fresh = fresh.key();
    group.bench_function("overlay_hit", |b| {
        b.iter(|| runtime.block_on(store.load(black_box(&fresh))))
    });
    group.finish();
}

fn classification(c: &mut Criterion) {
    let rules = RuleSet::default();
    let mut group = c.benchmark_group("classify");
    let http = Failure {
        http_status: Some(503),
        safety: Safety::Idempotent,
        tenant: "bench",
        ..Failure::default()
    };
    group.bench_function("http_503_idempotent", |b| {
        b.iter(|| rules.classify(black_box(&http)).class)
    });
    let reset = Failure {
        network: Some(NetworkFailure::ConnectionReset),
        safety: Safety::NonIdempotent,
        reached: Reach::Unknown,
        tenant: "bench",
        ..Failure::default()
    };
    group.bench_function("connection_reset_non_idempotent", |b| {
        b.iter(|| rules.classify(black_box(&reset)).class)
    });
    group.finish();
}

fn hints(c: &mut Criterion) {
    let mut group = c.benchmark_group("hint_normalize");
    let seconds = RawHints {
        retry_after: "120",
        ..RawHints::default()
    };
    group.bench_function("retry_after_seconds", |b| {
        b.iter(|| hint::normalize(black_box(&seconds), T0_MS, 3_600_000))
    });
    let date = RawHints {
        retry_after: "Thu, 01 Jan 2026 00:02:00 GMT",
        date: "Thu, 01 Jan 2026 00:00:00 GMT",
        ..RawHints::default()
    };
    group.bench_function("retry_after_http_date", |b| {
        b.iter(|| hint::normalize(black_box(&date), T0_MS, 3_600_000))
    });
    group.finish();
}

/// A bucket that never runs dry at these rates, so every call measures
/// the granting path.
fn roomy_bucket() -> BucketConfig {
    BucketConfig {
        rate: 1_000_000.0,
        burst: 1_000_000,
        ..BucketConfig::default()
    }
}

fn bucket(c: &mut Criterion) {
    let mut group = c.benchmark_group("bucket");
    // What a retry's decision does through its gate: a token taken, on
    // the shared, locked, clocked bucket.
    let shared = FairBucket::new(&roomy_bucket()).expect("a valid bucket configuration");
    group.bench_function("gate_granted", |b| {
        b.iter(|| shared.admit_within(black_box("bench"), Duration::MAX))
    });
    // The pure algorithm: a token spent for good, the clock advancing at
    // the refill rate so the bucket stays full.
    let mut shares = FairShares::new(&roomy_bucket()).expect("a valid bucket configuration");
    let mut now = Duration::ZERO;
    group.bench_function("admit_granted", |b| {
        b.iter(|| {
            now += Duration::from_micros(1);
            shares.admit(black_box("bench"), now, Duration::MAX)
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    delay,
    action,
    plan,
    json,
    stored,
    redb_load,
    classification,
    hints,
    bucket
);
criterion_main!(benches);
