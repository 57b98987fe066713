//! The hardened contract over a real server: every refusal carries its
//! stable code (first in the message, and as `google.rpc.ErrorInfo.reason`
//! in the `retrybudget.v1` domain) with the values involved as metadata,
//! `RetryInfo` only where asking again helps, and changes nothing stored;
//! `token_taken` is true only for the call that took the token.

use crate::common;
use crate::common::raw;

use std::collections::HashMap;
use std::time::Duration;

use common::{TestServer, get, pb, report, ts, with_tenant};
use pb::retry_budget_client::RetryBudgetClient;
use prost::Message;
use raw::raw;
use retry_budget::clock::now_ms;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// A refusal as a client reads it: code, reason, metadata, and whether it
/// says when to ask again.
#[derive(Debug)]
struct Refusal {
    code: Code,
    reason: String,
    metadata: HashMap<String, String>,
    retry_info: bool,
}

fn refusal(status: &Status) -> Refusal {
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("an ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "retrybudget.v1", "{status:?}");
    assert!(
        status.message().starts_with(&format!("{}: ", info.reason)),
        "the code comes first: {status:?}"
    );
    Refusal {
        code: status.code(),
        reason: info.reason.clone(),
        metadata: info.metadata.clone(),
        retry_info: details.retry_info().is_some(),
    }
}

impl Refusal {
    fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
}

/// A durable report of `id` at a time near now.
fn now_report(id: &str, attempt: u32) -> pb::NextActionRequest {
    let mut r = report(id, attempt, pb::ErrorClass::Transient);
    r.occurred_at = Some(ts(now_ms()));
    r
}

/// An activity with one decided attempt, and how it reads.
async fn recorded(client: &mut RetryBudgetClient<Channel>, id: &str) -> pb::Activity {
    let first = client.next_action(now_report(id, 1)).await.unwrap();
    assert_eq!(first.into_inner().code, "schedule_retry");
    get(client, id).await
}

#[tokio::test]
async fn bytes_that_are_not_the_request_are_invalid_argument_naming_the_field() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = recorded(&mut client, "utf8-1").await;

    // Attempt 2 of the same activity, with a byte that is not UTF-8 in a
    // string field: at the top, and inside the failure's details.
    let valid = now_report("utf8-1", 2).encode_to_vec();
    let workflow = [&valid[..], &[0x4a, 0x02, b'w', 0xff]].concat(); // field 9
    let retry_after = [&valid[..], &[0x22, 0x03, 0x32, 0x01, 0xc3]].concat(); // 4.6
    for (body, field) in [
        (workflow, "workflow_id"),
        (retry_after, "error.retry_after"),
    ] {
        let status = raw::<pb::NextActionResponse>(&server, "NextAction", body)
            .await
            .expect_err(field);
        let r = refusal(&status);
        assert_eq!(
            (r.code, r.reason.as_str()),
            (Code::InvalidArgument, "invalid_utf8")
        );
        assert_eq!(r.meta("field"), Some(field), "{r:?}");
        assert_eq!(r.meta("message"), Some("NextActionRequest"));
        assert!(!r.retry_info, "the same bytes would fail again");
    }
    // Another RPC's request names its own message.
    let status = raw::<pb::Activity>(&server, "GetActivity", vec![0x0a, 0x01, 0x80])
        .await
        .expect_err("not UTF-8");
    let r = refusal(&status);
    assert_eq!(r.reason, "invalid_utf8");
    assert_eq!(
        (r.meta("field"), r.meta("message")),
        (Some("activity_id"), Some("GetActivityRequest"))
    );

    // Bytes that are no message at all.
    let truncated = [&valid[..], &[0x28]].concat();
    let status = raw::<pb::NextActionResponse>(&server, "NextAction", truncated)
        .await
        .expect_err("truncated");
    let r = refusal(&status);
    assert_eq!(
        (r.code, r.reason.as_str()),
        (Code::InvalidArgument, "malformed_request")
    );
    assert_eq!(r.meta("message"), Some("NextActionRequest"));
    assert!(!r.retry_info);

    assert_eq!(get(&mut client, "utf8-1").await, before, "nothing changed");
}

#[tokio::test]
async fn an_oversized_request_is_resource_exhausted_before_it_is_read() {
    let limit = 2048;
    let server = TestServer::start_with(|c| c.limits.max_message_bytes = limit).await;
    let mut client = server.client().await;
    let before = recorded(&mut client, "big-1").await;

    // A report of attempt 2 padded with a workflow id to `len` bytes.
    let padded = |len: usize| {
        let mut r = now_report("big-1", 2);
        r.workflow_id = "w".repeat(len);
        let over = r.encoded_len() - len;
        r.workflow_id = "w".repeat(len - over);
        // The length's varint may have shrunk by a byte.
        while r.encoded_len() < len {
            r.workflow_id.push('w');
        }
        assert_eq!(r.encoded_len(), len);
        r.encode_to_vec()
    };
    // At the limit, the message is read: its workflow id is too long.
    let status = raw::<pb::NextActionResponse>(&server, "NextAction", padded(limit))
        .await
        .expect_err("too long a workflow id");
    assert_eq!(refusal(&status).reason, "invalid_workflow_id");
    // A byte over, and a megabyte over, it is not.
    for size in [limit + 1, 1 << 20] {
        let status = raw::<pb::NextActionResponse>(&server, "NextAction", padded(size))
            .await
            .expect_err("too large");
        let r = refusal(&status);
        assert_eq!(
            (r.code, r.reason.as_str()),
            (Code::ResourceExhausted, "message_too_large"),
            "{status:?}"
        );
        assert_eq!(r.meta("limit"), Some("2048"));
        assert_eq!(r.meta("size"), Some(size.to_string().as_str()));
        assert!(!r.retry_info, "the same message would be refused again");
    }
    // The generated client, as a worker would send it.
    let mut resolve = pb::ResolveActivityRequest {
        activity_id: "big-1".into(),
        resolution: pb::Resolution::Fail as i32,
        note: "n".repeat(4096),
    };
    let status = client
        .resolve_activity(resolve.clone())
        .await
        .expect_err("too large");
    assert_eq!(refusal(&status).reason, "message_too_large");
    assert_eq!(get(&mut client, "big-1").await, before, "nothing changed");
    // The connection still serves.
    resolve.note = "short".into();
    let status = client.resolve_activity(resolve).await.expect_err("open");
    assert_eq!(refusal(&status).reason, "activity_not_parked");
}

#[tokio::test]
async fn the_default_limit_takes_the_largest_legitimate_request() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    // Both ids at their longest, every hint set.
    let mut r = now_report(&"a".repeat(256), 1);
    r.workflow_id = "w".repeat(256);
    r.error = Some(pb::ErrorDetail {
        http_status: 503,
        retry_after: "Wed, 21 Oct 2015 07:28:00 GMT".into(),
        date: "Wed, 21 Oct 2015 07:27:00 GMT".into(),
        grpc_retry_pushback_ms: Some(1000),
        ..Default::default()
    });
    r.error_class = 0;
    assert!(r.encoded_len() < 2048, "{}", r.encoded_len());
    client.next_action(r).await.expect("served");
    let status = raw::<pb::NextActionResponse>(&server, "NextAction", vec![0; 65 << 10])
        .await
        .expect_err("over 64 KiB");
    let r = refusal(&status);
    assert_eq!(r.reason, "message_too_large");
    assert_eq!(r.meta("limit"), Some("65536"));
}

#[tokio::test]
async fn timestamps_out_of_range_or_far_from_the_clock_are_refused_and_change_nothing() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = recorded(&mut client, "time-1").await;
    let now = now_ms();
    let at = |seconds: i64, nanos: i32| {
        let mut r = now_report("time-1", 2);
        r.occurred_at = Some(prost_types::Timestamp { seconds, nanos });
        r
    };

    // Milliseconds in the seconds field: the year 58,893.
    let status = client.next_action(at(now, 0)).await.expect_err("ms");
    let r = refusal(&status);
    assert_eq!(
        (r.code, r.reason.as_str()),
        (Code::InvalidArgument, "invalid_timestamp")
    );
    assert_eq!(r.meta("field"), Some("occurred_at"));
    assert_eq!(r.meta("seconds"), Some(now.to_string().as_str()));
    assert_eq!(r.meta("max"), Some("9999-12-31T23:59:59.999Z"));
    assert!(!r.retry_info);
    let status = client
        .next_action(at(now / 1000, 1_000_000_000))
        .await
        .expect_err("nanos");
    assert_eq!(refusal(&status).reason, "invalid_timestamp");

    // All zero, as protobufjs sends a JavaScript Date: 1970.
    let status = client.next_action(at(0, 0)).await.expect_err("1970");
    let r = refusal(&status);
    assert_eq!(
        (r.code, r.reason.as_str()),
        (Code::InvalidArgument, "timestamp_implausible")
    );
    assert_eq!(r.meta("field"), Some("occurred_at"));
    assert_eq!(r.meta("value"), Some("1970-01-01T00:00:00.000Z"));
    assert_eq!(r.meta("bound"), Some("max_timestamp_past"));
    assert_eq!(r.meta("limit"), Some("1year"));
    assert!(r.meta("server_time").is_some_and(|t| t.starts_with("20")));
    assert!(!r.retry_info);

    // Two hours ahead of the server.
    let status = client
        .next_action(at(now / 1000 + 7200, 0))
        .await
        .expect_err("future");
    let r = refusal(&status);
    assert_eq!(r.reason, "timestamp_implausible");
    assert_eq!(
        (r.meta("bound"), r.meta("limit")),
        (Some("max_timestamp_future"), Some("1h"))
    );

    // The pure form and RecordSuccess check the same way.
    let mut pure = at(0, 0);
    pure.budget = Some(pb::Budget {
        attempts: 1,
        max_attempts: 3,
        elapsed: 0,
        deadline: 60,
    });
    let status = client.next_action(pure).await.expect_err("pure");
    assert_eq!(refusal(&status).reason, "timestamp_implausible");
    let status = client
        .record_success(pb::RecordSuccessRequest {
            activity_id: "time-1".into(),
            occurred_at: Some(ts(0)),
            ..Default::default()
        })
        .await
        .expect_err("success in 1970");
    assert_eq!(refusal(&status).reason, "timestamp_implausible");

    assert_eq!(get(&mut client, "time-1").await, before, "nothing changed");
    // A month-old report, a worker replaying its history, is taken.
    let mut old = now_report("time-2", 1);
    old.occurred_at = Some(ts(now - 30 * 86_400_000));
    client
        .next_action(old)
        .await
        .expect("a month ago is plausible");
}

#[tokio::test]
async fn the_timestamp_bounds_are_configurable() {
    let server = TestServer::start_with(|c| {
        c.limits.max_timestamp_past = Duration::from_secs(60);
        c.limits.max_timestamp_future = Duration::from_secs(5);
    })
    .await;
    let mut client = server.client().await;
    let mut r = now_report("bounds-1", 1);
    r.occurred_at = Some(ts(now_ms() - 120_000));
    let status = client.next_action(r).await.expect_err("2 minutes ago");
    let r = refusal(&status);
    assert_eq!(
        (r.reason.as_str(), r.meta("limit")),
        ("timestamp_implausible", Some("1m"))
    );
    let mut r = now_report("bounds-1", 1);
    r.occurred_at = Some(ts(now_ms() + 60_000));
    let status = client.next_action(r).await.expect_err("a minute ahead");
    assert_eq!(refusal(&status).meta("limit"), Some("5s"));
    let mut r = now_report("bounds-1", 1);
    r.occurred_at = Some(ts(now_ms() - 30_000));
    client
        .next_action(r)
        .await
        .expect("30 s ago is within a minute");
}

#[tokio::test]
async fn refusals_of_the_core_name_the_values_involved() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let before = recorded(&mut client, "core-1").await;

    let status = client
        .next_action(now_report("core-1", 5))
        .await
        .expect_err("skips");
    let r = refusal(&status);
    assert_eq!(
        (r.code, r.reason.as_str()),
        (Code::FailedPrecondition, "attempt_out_of_order")
    );
    assert_eq!((r.meta("expected"), r.meta("got")), (Some("2"), Some("5")));
    assert!(!r.retry_info);

    let status = client
        .next_action(now_report(&"x".repeat(300), 1))
        .await
        .expect_err("long");
    let r = refusal(&status);
    assert_eq!(r.reason, "activity_id_too_long");
    assert_eq!(
        (r.meta("field"), r.meta("size"), r.meta("limit")),
        (Some("activity_id"), Some("300"), Some("256"))
    );

    let status = client
        .resolve_activity(pb::ResolveActivityRequest {
            activity_id: "core-1".into(),
            resolution: pb::Resolution::Retry as i32,
            note: String::new(),
        })
        .await
        .expect_err("not parked");
    let r = refusal(&status);
    assert_eq!(r.code, Code::FailedPrecondition);
    assert_eq!(r.meta("status"), Some("open"));

    let status = client
        .get_activity(with_tenant(
            pb::GetActivityRequest {
                activity_id: "core-1".into(),
            },
            "other",
        ))
        .await
        .expect_err("another tenant's");
    let r = refusal(&status);
    assert_eq!(
        (r.code, r.reason.as_str()),
        (Code::NotFound, "activity_not_found")
    );
    assert_eq!(r.meta("activity_id"), Some("core-1"));

    let mut closed = now_report("core-1", 2);
    closed.error_class = pb::ErrorClass::Permanent as i32;
    client.next_action(closed).await.unwrap();
    let status = client
        .next_action(now_report("core-1", 3))
        .await
        .expect_err("closed");
    let r = refusal(&status);
    assert_eq!(r.reason, "activity_closed");
    assert_eq!(
        (r.meta("status"), r.meta("closed_code"), r.meta("attempts")),
        (Some("closed"), Some("fail_permanent"), Some("2"))
    );
    // Whatever attempt comes after: the activity is closed, not an
    // attempt out of order that points at another refused call.
    let status = client
        .next_action(now_report("core-1", 7))
        .await
        .expect_err("closed");
    assert_eq!(refusal(&status).reason, "activity_closed");
    let after = get(&mut client, "core-1").await;
    assert_eq!(
        after.events.len(),
        before.events.len() + 1,
        "only attempt 2"
    );
}

/// A server whose bucket refills once a second and holds one token, with
/// that token spent by a first retry.
async fn drained() -> (TestServer, RetryBudgetClient<Channel>) {
    let server = TestServer::start_with(|c| {
        c.bucket.rate = 1.0;
        c.bucket.burst = 1;
        c.bucket.max_reservation_ms = c.bucket.max_reservation_ms.max(1000);
    })
    .await;
    let client = server.client().await;
    (server, client)
}

fn booked(id: &str, attempt: u32) -> pb::NextActionRequest {
    let mut r = now_report(id, attempt);
    r.policy = Some(pb::Policy {
        max_attempts: 10,
        deadline_seconds: 3600,
        base: Some(0),
        cap: Some(0),
    });
    r
}

#[tokio::test]
async fn token_taken_is_true_only_for_the_call_that_took_the_token() {
    let (_server, mut client) = drained().await;

    let first = client
        .next_action(booked("tok-a", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.code, "schedule_retry");
    assert!(first.token_taken && !first.slot_booked && !first.replayed);
    // The same attempt again: the recorded decision, no new token.
    let again = client
        .next_action(booked("tok-a", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed && !again.token_taken, "{again:?}");
    assert_eq!(again.code, "schedule_retry");
    assert!(
        get(&mut client, "tok-a").await.events[0].token_taken,
        "history kept"
    );

    // The bucket is empty: a deferral holding a place is not a token. Its
    // failure is 10 s old, so its turn, not the planned start (1 s after
    // the failure), sets not_before.
    let mut report_b = booked("tok-b", 1);
    report_b.occurred_at = Some(ts(now_ms() - 10_000));
    let b = client.next_action(report_b).await.unwrap().into_inner();
    assert_eq!(b.code, "deferred");
    assert!(b.slot_booked && !b.token_taken, "{b:?}");
    let b_at = common::ms(b.not_before.as_ref().unwrap());
    let wait = b_at - now_ms();
    assert!(
        b.reason.contains("ask again in"),
        "the turn set not_before: {}",
        b.reason
    );
    assert!(wait > 0 && wait <= 1000, "{wait}");
    let event = &get(&mut client, "tok-b").await.events[0];
    assert!(event.slot_booked && !event.token_taken);
    // Asked again early: the same deferral, its place held, still no token.
    let early = client
        .next_action(booked("tok-b", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(early.replayed && early.slot_booked && !early.token_taken);
    // A dry run neither takes nor books.
    let mut dry = booked("tok-c", 1);
    dry.dry_run = true;
    let dry = client.next_action(dry).await.unwrap().into_inner();
    assert!(!dry.token_taken && !dry.slot_booked, "{dry:?}");

    // At the slot, this call redeems the booking: it took the token.
    while now_ms() < b_at {
        tokio::time::sleep(Duration::from_millis((b_at - now_ms()).max(1) as u64)).await;
    }
    let redeemed = client
        .next_action(booked("tok-b", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(redeemed.code, "schedule_retry");
    assert!(redeemed.token_taken && !redeemed.replayed && !redeemed.slot_booked);
    let replay = client
        .next_action(booked("tok-b", 1))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed && !replay.token_taken);
}
