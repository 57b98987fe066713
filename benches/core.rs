//! Criterion micro-benchmarks of the core: what one decision costs before
//! any network or disk is involved (`cargo bench --bench core`).
//!
//! - `retry_delay`: the sha256-jittered backoff.
//! - `next_action`: the reference decision, and with its explanation (the
//!   pure `NextAction` computes both).
//! - `activity_plan`: the durable state machine on a record that already
//!   holds a few events: a fresh decision, and a replay.
//! - `record_json`: encoding and decoding that record, which every durable
//!   decision does once each way.
//! - `redb_load`: loading a record from the embedded store (10k stored).
//! - `classify`, `hint`: failure classification and hint normalisation.
//! - token-bucket admission: see the marked place at the end.

#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use retry_budget::budget::activity::{
    self, ActivityKey, ActivityRecord, Defaults, Plan, Policy, Report,
};
use retry_budget::budget::classify::{Failure, NetworkFailure, Reach, RuleSet, Safety};
use retry_budget::budget::hint::{self, RawHints};
use retry_budget::budget::{Budget, DelayParams, ErrorClass, explain, next_action, retry_delay};
use retry_budget::store::{RedbStore, RedbStoreOptions, Store};

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
    }
}

/// The record of `id` after `attempts` transient failures, each reported
/// at the previous retry's `not_before`, as the durable path builds it.
fn record_with(id: &str, attempts: u32) -> ActivityRecord {
    let defaults = Defaults {
        policy: policy(),
        max_hint_ms: 3_600_000,
    };
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
    let defaults = Defaults {
        policy: policy(),
        max_hint_ms: 3_600_000,
    };
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
    let mut group = c.benchmark_group("record_json_4_events");
    group.bench_function("encode", |b| {
        b.iter(|| serde_json::to_vec(black_box(&record)))
    });
    group.bench_function("decode", |b| {
        b.iter(|| serde_json::from_slice::<ActivityRecord>(black_box(&bytes)))
    });
    group.finish();
}

fn redb_load(c: &mut Criterion) {
    const STORED: u32 = 10_000;
    let dir = tempfile::tempdir().expect("a temp dir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let store = RedbStore::open(&RedbStoreOptions::new(dir.path())).expect("the store opens");
    runtime.block_on(async {
        let template = record_with("template", 2);
        // Concurrent saves share group commits: the setup takes a second,
        // not STORED fsyncs.
        let mut saves = tokio::task::JoinSet::new();
        for i in 0..STORED {
            let mut record = template.clone();
            record.activity_id = format!("act-{i:06}");
            let store = store.clone();
            saves.spawn(async move { store.save(&record, None).await });
        }
        while let Some(saved) = saves.join_next().await {
            saved
                .expect("a save task completes")
                .expect("a save succeeds");
        }
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

// ---------------------------------------------------------------------------
// TOKEN-BUCKET ADMISSION: add here once `retry_budget::bucket` is exported
// from src/lib.rs (it is commented out there for now). A sketch, against the
// API in progress (`FairBucket::new(&BucketConfig)`, `admit(tenant)`):
//
//     fn bucket(c: &mut Criterion) {
//         let bucket = FairBucket::new(&BucketConfig::default()).expect("valid defaults");
//         c.bench_function("bucket_admit", |b| b.iter(|| bucket.admit(black_box("bench"))));
//     }
//
// and add `bucket` to `criterion_group!` below.
// ---------------------------------------------------------------------------

criterion_group!(
    benches,
    delay,
    action,
    plan,
    json,
    redb_load,
    classification,
    hints
);
criterion_main!(benches);
