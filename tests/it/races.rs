//! Requests on one activity that race each other over the real server:
//! the same attempt twice, two different attempts, a report against
//! `RecordSuccess`, `ResolveActivity` and the retention sweeper. Whatever
//! order the server takes them in, every answer must be one of the orders'
//! answers, an acknowledged decision is what the activity records, and a
//! refused report leaves the activity as the other request left it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, get, ms, pb, report, ts};
use pb::ErrorClass::{Transient, Unknown};
use pb::retry_budget_client::RetryBudgetClient;
use retry_budget::clock::now_ms;
use tokio::sync::Barrier;
use tonic::transport::Channel;

/// How many times each race is run.
const ROUNDS: usize = 40;

fn at(mut request: pb::NextActionRequest, occurred_ms: i64) -> pb::NextActionRequest {
    request.occurred_at = Some(ts(occurred_ms));
    request
}

/// Runs `a` and `b` at once, each on its own connection, released together.
async fn race<A, B, RA, RB>(
    server: &TestServer,
    a: impl FnOnce(RetryBudgetClient<Channel>) -> A + Send + 'static,
    b: impl FnOnce(RetryBudgetClient<Channel>) -> B + Send + 'static,
) -> (RA, RB)
where
    A: Future<Output = RA> + Send + 'static,
    B: Future<Output = RB> + Send + 'static,
    RA: Send + 'static,
    RB: Send + 'static,
{
    let start = Arc::new(Barrier::new(2));
    let (ca, cb) = (server.client().await, server.client().await);
    let (sa, sb) = (Arc::clone(&start), start);
    let ta = tokio::spawn(async move {
        sa.wait().await;
        a(ca).await
    });
    let tb = tokio::spawn(async move {
        sb.wait().await;
        b(cb).await
    });
    (
        ta.await.expect("first task"),
        tb.await.expect("second task"),
    )
}

/// The events of an activity as (kind, attempt, code).
fn events(activity: &pb::Activity) -> Vec<(String, u32, String)> {
    activity
        .events
        .iter()
        .map(|e| (e.kind.clone(), e.attempt, e.code.clone()))
        .collect()
}

fn event(kind: &str, attempt: u32, code: &str) -> (String, u32, String) {
    (kind.to_owned(), attempt, code.to_owned())
}

/// The recorded event of a decision as its answer describes it.
fn matches_answer(recorded: &pb::ActivityEvent, answer: &pb::NextActionResponse) {
    assert_eq!(
        (
            recorded.attempt,
            recorded.code.as_str(),
            recorded.not_before,
            recorded.delay_ms,
            // A replay took no token: the recorded event keeps the first
            // call's.
            recorded.token_taken && !answer.replayed,
            recorded.slot_booked,
            recorded.reason.as_str()
        ),
        (
            answer.attempt,
            answer.code.as_str(),
            answer.not_before,
            answer.delay_ms,
            answer.token_taken,
            answer.slot_booked,
            answer.reason.as_str()
        ),
        "the acknowledged decision is the recorded one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reports_of_one_attempt_get_one_decision_and_the_same_answer() {
    let server = TestServer::start().await;
    let t0 = now_ms();
    for round in 0..ROUNDS {
        let id = format!("same-{round}");
        for attempt in 1..=2 {
            let request = at(report(&id, attempt, Transient), t0 + i64::from(attempt));
            let (a, b) = {
                let (ra, rb) = (request.clone(), request.clone());
                race(
                    &server,
                    |mut c| async move { c.next_action(ra).await },
                    |mut c| async move { c.next_action(rb).await },
                )
                .await
            };
            let (mut a, mut b) = (a.unwrap().into_inner(), b.unwrap().into_inner());
            assert_eq!(
                u8::from(a.replayed) + u8::from(b.replayed),
                1,
                "{id} attempt {attempt}: one decides, the other replays"
            );
            assert_eq!(
                (a.token_taken, b.token_taken),
                (!a.replayed, !b.replayed),
                "{id} attempt {attempt}: the one that decided took the token"
            );
            (a.replayed, b.replayed) = (false, false);
            (a.token_taken, b.token_taken) = (false, false);
            assert_eq!(a, b, "{id} attempt {attempt}: the same answer");
            assert_eq!(a.code, "schedule_retry");
        }
        let activity = get(&mut server.client().await, &id).await;
        assert_eq!(activity.attempts, 2);
        assert_eq!(
            events(&activity),
            vec![
                event("decision", 1, "schedule_retry"),
                event("decision", 2, "schedule_retry")
            ],
            "{id}: each attempt recorded once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_different_attempts_racing_are_taken_in_order_or_refused() {
    let server = TestServer::start().await;
    let t0 = now_ms();
    let mut skipped_ahead = 0;
    for round in 0..ROUNDS {
        let id = format!("pair-{round}");
        let mut client = server.client().await;
        client
            .next_action(at(report(&id, 1, Transient), t0))
            .await
            .unwrap();
        let (two, three) = {
            let (r2, r3) = (
                at(report(&id, 2, Transient), t0 + 1),
                at(report(&id, 3, Transient), t0 + 2),
            );
            race(
                &server,
                |mut c| async move { c.next_action(r2).await },
                |mut c| async move { c.next_action(r3).await },
            )
            .await
        };
        // Attempt 2 is next whichever runs first.
        let two = two.expect("attempt 2 is next").into_inner();
        assert!(!two.replayed);
        let activity = get(&mut client, &id).await;
        matches_answer(&activity.events[1], &two);
        match three {
            // Attempt 2 went first.
            Ok(three) => {
                let three = three.into_inner();
                assert!(!three.replayed);
                assert_eq!(activity.attempts, 3);
                matches_answer(&activity.events[2], &three);
            }
            // Attempt 3 went first, and was refused without a trace.
            Err(status) => {
                skipped_ahead += 1;
                assert_eq!(status.code(), tonic::Code::FailedPrecondition);
                assert!(
                    status
                        .message()
                        .starts_with("attempt_out_of_order: expected attempt 2"),
                    "{status:?}"
                );
                assert_eq!(activity.attempts, 2);
            }
        }
        let attempts: Vec<u32> = activity.events.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, (1..=activity.attempts).collect::<Vec<_>>());
    }
    eprintln!("attempt 3 went first and was refused in {skipped_ahead} of {ROUNDS} rounds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_racing_a_success_is_decided_before_it_or_refused_after_it() {
    let server = TestServer::start().await;
    let t0 = now_ms();
    for round in 0..ROUNDS {
        let id = format!("succ-{round}");
        let mut client = server.client().await;
        client
            .next_action(at(report(&id, 1, Transient), t0))
            .await
            .unwrap();
        let (reported, succeeded) = {
            let (r2, success) = (
                at(report(&id, 2, Transient), t0 + 1),
                pb::RecordSuccessRequest {
                    activity_id: id.clone(),
                    occurred_at: Some(ts(t0 + 2)),
                    ..Default::default()
                },
            );
            race(
                &server,
                |mut c| async move { c.next_action(r2).await },
                |mut c| async move { c.record_success(success).await },
            )
            .await
        };
        assert!(
            succeeded
                .expect("a success is recorded")
                .into_inner()
                .changed,
            "{id}: the success closed it"
        );
        let activity = get(&mut client, &id).await;
        assert_eq!(activity.status, pb::ActivityStatus::Closed as i32);
        assert_eq!(activity.closed_code, "succeeded");
        match reported {
            Ok(answer) => {
                let answer = answer.into_inner();
                assert_eq!(answer.code, "schedule_retry");
                matches_answer(&activity.events[1], &answer);
                assert_eq!(
                    events(&activity),
                    vec![
                        event("decision", 1, "schedule_retry"),
                        event("decision", 2, "schedule_retry"),
                        event("success", 3, "succeeded"),
                    ]
                );
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition);
                assert!(
                    status.message().starts_with("activity_closed"),
                    "{status:?}"
                );
                assert_eq!(
                    events(&activity),
                    vec![
                        event("decision", 1, "schedule_retry"),
                        event("success", 2, "succeeded"),
                    ],
                    "{id}: the refused report left no trace"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_racing_a_resolution_is_refused_before_it_or_decided_after_it() {
    let server = TestServer::start().await;
    let t0 = now_ms();
    for round in 0..ROUNDS {
        let id = format!("park-{round}");
        let mut client = server.client().await;
        let parked = client
            .next_action(at(report(&id, 1, Unknown), t0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(parked.code, "manual_review");
        let (reported, resolved) = {
            let (r2, resolve) = (
                at(report(&id, 2, Transient), t0 + 1),
                pb::ResolveActivityRequest {
                    activity_id: id.clone(),
                    resolution: pb::Resolution::Retry as i32,
                    note: "race".into(),
                },
            );
            race(
                &server,
                |mut c| async move { c.next_action(r2).await },
                |mut c| async move { c.resolve_activity(resolve).await },
            )
            .await
        };
        let resolved = resolved.expect("a parked activity resolves").into_inner();
        assert_eq!(resolved.status, pb::ActivityStatus::Open as i32);
        let activity = get(&mut client, &id).await;
        match reported {
            Ok(answer) => {
                let answer = answer.into_inner();
                assert_eq!(answer.code, "schedule_retry");
                assert_eq!(activity.attempts, 2);
                matches_answer(&activity.events[2], &answer);
                assert_eq!(
                    events(&activity),
                    vec![
                        event("decision", 1, "manual_review"),
                        event("resolution", 1, "resolved_retry"),
                        event("decision", 2, "schedule_retry"),
                    ]
                );
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition);
                assert!(
                    status.message().starts_with("activity_parked"),
                    "{status:?}"
                );
                assert_eq!(activity.attempts, 1);
                assert_eq!(
                    events(&activity),
                    vec![
                        event("decision", 1, "manual_review"),
                        event("resolution", 1, "resolved_retry"),
                    ],
                    "{id}: the refused report left no trace"
                );
            }
        }
    }
}

/// The sweep takes no activity lock: it deletes what the purge index says
/// expired, while reports are being decided. Activities here expired long
/// ago (started an hour back with a one-second deadline, retention ten
/// minutes), and a sweep runs every few milliseconds. A report of the next
/// attempt is stamped now, so it closes the activity (`deadline_exceeded`)
/// and makes it purgeable only ten minutes from now. Each report must
/// either find the activity (and then what it was told stays readable) or
/// find it purged (and be refused): never be acknowledged and then lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_racing_the_retention_sweep_is_never_acknowledged_and_lost() {
    let server = TestServer::start_with(|c| {
        c.store.retention = Duration::from_secs(600);
        c.store.sweep_interval = Duration::from_millis(2);
    })
    .await;
    let hour_ago = now_ms() - 3_600_000;
    let expired_policy = pb::Policy {
        max_attempts: 10,
        deadline_seconds: 1,
        base: Some(0),
        cap: Some(0),
    };
    let (mut kept, mut purged) = (0, 0);
    // Until both orders were seen a few times, within a generous bound.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut round = 0;
    while kept < 5 || purged < 5 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the race was not exercised: {kept} kept, {purged} purged in {round} rounds"
        );
        let mut workers = Vec::new();
        for w in 0..8 {
            let id = format!("sweep-{round}-{w}");
            let mut client = server.client().await;
            let mut first = at(report(&id, 1, Transient), hour_ago);
            first.policy = Some(expired_policy);
            workers.push(tokio::spawn(async move {
                // The first report's elapsed time is 0: a retry, at once
                // expired in the service's clock.
                let r = client.next_action(first).await.unwrap().into_inner();
                assert_eq!(r.code, "schedule_retry");
                let second = client.next_action(report(&id, 2, Transient)).await;
                let after = client
                    .get_activity(pb::GetActivityRequest {
                        activity_id: id.clone(),
                    })
                    .await;
                (id, second, after)
            }));
        }
        for w in workers {
            let (id, second, after) = w.await.unwrap();
            match second {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    assert_eq!(answer.code, "deadline_exceeded", "{id}");
                    let activity = after
                        .unwrap_or_else(|s| panic!("{id}: acknowledged, then lost: {s:?}"))
                        .into_inner();
                    assert_eq!(activity.attempts, 2, "{id}");
                    assert_eq!(activity.closed_code, "deadline_exceeded");
                    matches_answer(&activity.events[1], &answer);
                    kept += 1;
                }
                Err(status) => {
                    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{id}");
                    assert!(
                        status
                            .message()
                            .starts_with("attempt_out_of_order: expected attempt 1"),
                        "{id}: {status:?}"
                    );
                    let gone = after.expect_err("purged, and the refusal wrote nothing");
                    assert_eq!(gone.code(), tonic::Code::NotFound, "{id}");
                    purged += 1;
                }
            }
        }
        round += 1;
    }
    eprintln!("{round} rounds: {kept} decided and kept, {purged} refused after a purge");
}

/// A deferral's place in line survives a restart: it is kept in the
/// record, and the worker asking the restarted server takes it again by
/// the time of its first deferral, before a fresh failure that asks after
/// it; the restarted bucket pays for it with its own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_in_line_is_kept_across_a_restart() {
    fn durable(id: &str) -> pb::NextActionRequest {
        let mut r = at(report(id, 1, Transient), now_ms());
        r.policy = Some(pb::Policy {
            max_attempts: 10,
            deadline_seconds: 3600,
            base: Some(0),
            cap: Some(0),
        });
        r
    }
    // One token a second, held one at a time: the first retry takes it,
    // the next is deferred, its turn about a second later.
    let server = TestServer::start_with(|c| {
        c.bucket.rate = 1.0;
        c.bucket.burst = 1;
    })
    .await;
    let mut client = server.client().await;
    let first = client.next_action(durable("first")).await.unwrap();
    assert!(first.into_inner().token_taken);
    let b = client.next_action(durable("b")).await.unwrap().into_inner();
    assert_eq!(b.code, "deferred");
    assert!(b.slot_booked && !b.token_taken, "a place is held");
    let slot = ms(b.not_before.as_ref().expect("a deferral has a time"));
    drop(client);
    let (dir, _keep) = server.stop_keep_dir().await;

    // The restarted server's bucket holds one token and refills once in
    // 100 s, far longer than this test: whoever takes that token leaves
    // none for the next retry.
    let server = TestServer::start_in(dir, |c| {
        c.bucket.rate = 0.01;
        c.bucket.burst = 1;
        c.bucket.max_reservation_ms = 200_000;
    })
    .await;
    let mut client = server.client().await;
    // The server's clock is this process's: wait until it reaches the slot
    // the server gave.
    while now_ms() < slot {
        tokio::time::sleep(Duration::from_millis((slot - now_ms()).max(1) as u64)).await;
    }
    let redeemed = client.next_action(durable("b")).await.unwrap().into_inner();
    assert_eq!(redeemed.code, "schedule_retry", "{redeemed:?}");
    assert!(redeemed.token_taken && !redeemed.replayed);
    assert!(
        redeemed.reason.contains("its turn in line came"),
        "{}",
        redeemed.reason
    );
    let activity = get(&mut client, "b").await;
    assert_eq!(activity.attempts, 1);
    assert!(activity.reservation_not_before.is_none());

    // It took the restarted bucket's one token: a fresh failure now waits.
    let c = client.next_action(durable("c")).await.unwrap().into_inner();
    assert_eq!(c.code, "deferred", "{c:?}");
}
