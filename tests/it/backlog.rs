//! A backlog that drains, through the real binary at its defaults (no
//! flag, no traffic report): 300 activities of one tenant failing at once
//! against one dependency, each with 30 s to live, every worker asking
//! again when told. None is ended by the budget while its deadline has
//! time left, none is told to come back more than `max_deferral` (10 s)
//! ahead or past its deadline, every deferral keeps a place in line; and
//! the pure form keeps its budget's deadline as the durable form does
//! (issue #60).

use crate::common;
use crate::common::binary;

use std::collections::HashMap;
use std::time::Duration;

use common::{pb, report, ts};
use pb::retry_budget_client::RetryBudgetClient;
use retry_budget::clock::now_ms;
use tonic::transport::Channel;

/// The default `max_deferral`, and the slack of a round trip.
const MAX_DEFERRAL_MS: i64 = 10_000;
const SLACK_MS: i64 = 250;
const ACTIVITIES: usize = 300;
const DEADLINE_SECONDS: u64 = 30;

async fn client(addr: &str) -> RetryBudgetClient<Channel> {
    RetryBudgetClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// What happened to one activity: its answers in order, with when each
/// came.
#[derive(Debug, Default)]
struct Story {
    answers: Vec<(i64, pb::NextActionResponse)>,
}

/// Attempt 1 of `id` failed at `occurred`; asks until the answer is not a
/// deferral, sleeping until each `not_before` as the README says.
async fn worker(mut c: RetryBudgetClient<Channel>, id: String, occurred: i64) -> Story {
    let mut story = Story::default();
    loop {
        let mut request = report(&id, 1, pb::ErrorClass::Transient);
        request.dependency = "ledger".into();
        request.occurred_at = Some(ts(occurred));
        request.policy = Some(pb::Policy {
            max_attempts: 5,
            deadline_seconds: DEADLINE_SECONDS,
            base: None,
            cap: None,
        });
        let answer = c.next_action(request).await.expect("answered").into_inner();
        let asked = now_ms();
        let deferred = answer.action == pb::Action::Deferred as i32;
        let not_before = answer.not_before.as_ref().map(common::ms);
        story.answers.push((asked, answer));
        if !deferred {
            return story;
        }
        let at = not_before.expect("a deferral says when");
        tokio::time::sleep(Duration::from_millis((at - now_ms()).max(1) as u64)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_failures_at_once_drain_and_none_is_ended_early() {
    let (_child, addr, _dir) = binary::spawn_at_defaults().await;
    let occurred = now_ms();
    let mut workers = Vec::new();
    // A few connections, as a fleet of workers would share them.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&addr).await);
    }
    for i in 0..ACTIVITIES {
        let c = clients[i % clients.len()].clone();
        workers.push(tokio::spawn(worker(c, format!("outage-{i}"), occurred)));
    }
    let mut stories = Vec::new();
    for w in workers {
        stories.push(w.await.unwrap());
    }
    let deadline = occurred + DEADLINE_SECONDS as i64 * 1000;
    let mut ends: HashMap<String, usize> = HashMap::new();
    let mut deferrals = 0;
    let mut farthest = 0;
    let mut last_grant = 0;
    for story in &stories {
        for (asked, answer) in &story.answers {
            if answer.action == pb::Action::Deferred as i32 {
                deferrals += 1;
                let ahead = answer.not_before.as_ref().map_or(0, common::ms) - asked;
                farthest = farthest.max(ahead);
                assert!(
                    ahead <= MAX_DEFERRAL_MS + SLACK_MS,
                    "told {ahead} ms ahead: {answer:?}"
                );
                assert!(
                    answer.not_before.as_ref().map_or(0, common::ms) <= deadline,
                    "told past the deadline: {answer:?}"
                );
                assert!(
                    answer.waiting_since.is_some(),
                    "a durable deferral keeps a place: {answer:?}"
                );
            }
        }
        let (asked, last) = story.answers.last().expect("answered");
        *ends.entry(last.code.clone()).or_default() += 1;
        if last.code == "deadline_exceeded" {
            assert!(
                *asked >= deadline,
                "ended {} ms before its deadline: {last:?}",
                deadline - asked
            );
        } else {
            assert_eq!(last.code, "schedule_retry", "{last:?}");
            last_grant = last_grant.max(asked - occurred);
        }
    }
    eprintln!(
        "{ACTIVITIES} failures at once: {ends:?}, {deferrals} deferrals, the farthest \
         {farthest} ms ahead, the last retry granted {last_grant} ms after the failures"
    );
    assert_eq!(
        ends.get("schedule_retry").copied().unwrap_or(0),
        ACTIVITIES,
        "every one retried within its 30 s: {ends:?}"
    );
    assert!(deferrals > 0, "300 at once cannot all be granted at once");
}

/// The pure form (a `budget` instead of an activity) stops a retry at its
/// deadline, or whose Retry-After would start after it, and takes no
/// token for it, as the durable form does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pure_form_keeps_its_deadline_as_the_durable_form_does() {
    let (_child, addr, _dir) = binary::spawn_at_defaults().await;
    let mut c = client(&addr).await;
    // Attempt 1 of 5 failed transiently `elapsed` s into a `deadline` s
    // budget, with `error` when the server said more.
    let pure =
        |elapsed: u64, deadline: u64, error: Option<pb::ErrorDetail>| pb::NextActionRequest {
            budget: Some(pb::Budget {
                attempts: 1,
                max_attempts: 5,
                elapsed,
                deadline,
            }),
            error_class: pb::ErrorClass::Transient as i32,
            error,
            occurred_at: Some(ts(now_ms())),
            ..Default::default()
        };
    // The deadline reached: no retry, whatever the backoff.
    let answer = c
        .next_action(pure(60, 60, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.code, "deadline_exceeded", "{answer:?}");
    assert!(!answer.token_taken, "no token for a retry that cannot run");
    // Retry-After 120 at 10 s of 60: the durable form's answer.
    let too_late = pb::ErrorDetail {
        http_status: 429,
        retry_after: "120".into(),
        ..Default::default()
    };
    let answer = c
        .next_action(pure(10, 60, Some(too_late)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.code, "deadline_exceeded", "{answer:?}");
    assert!(!answer.token_taken);
    // With time left, the same failure is retried.
    let answer = c
        .next_action(pure(0, 600, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.code, "schedule_retry", "{answer:?}");
}
