//! Message bodies as they arrive on the wire, through the server's codec
//! (`src/grpc/codec.rs`). Malformed bodies are refused
//! with `INVALID_ARGUMENT` and the stable code `malformed_request`, and
//! store nothing; unknown fields are skipped, as protobuf requires.

use crate::common;
use crate::common::raw;

use common::{TestServer, pb, report};
use prost::Message;
use tonic::{Code, Status};

/// `NextAction` with `body` as the request message.
async fn next_action_raw(
    server: &TestServer,
    body: Vec<u8>,
) -> Result<pb::NextActionResponse, Status> {
    raw::raw(server, "NextAction", body).await
}

#[tokio::test]
async fn malformed_bodies_are_refused_and_store_nothing() {
    let server = TestServer::start().await;
    let valid = report("codec-1", 1, pb::ErrorClass::Transient).encode_to_vec();
    let cases: [(&str, Vec<u8>); 4] = [
        // activity_id (field 2) says 5 bytes, 1 follows.
        ("a string past the end", vec![0x12, 0x05, b'c']),
        // attempt (field 5 varint... any varint field) with no value.
        ("a tag without its value", [&valid[..], &[0x28]].concat()),
        // A varint that never ends.
        (
            "an endless varint",
            [&valid[..], &[0x28, 0xff, 0xff]].concat(),
        ),
        // Wire type 7 does not exist.
        ("an unknown wire type", [&valid[..], &[0x0f]].concat()),
    ];
    for (what, body) in cases {
        let status = next_action_raw(&server, body).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status
                .message()
                .starts_with("malformed_request: the request is not a valid NextActionRequest: "),
            "{what}: {}",
            status.message()
        );
    }
    let mut client = server.client().await;
    let missing = client
        .get_activity(pb::GetActivityRequest {
            activity_id: "codec-1".into(),
        })
        .await
        .expect_err("nothing was stored");
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn unknown_fields_are_skipped() {
    let server = TestServer::start().await;
    let mut body = report("codec-2", 1, pb::ErrorClass::Transient).encode_to_vec();
    // Field 99, varint 300, and field 100, a 3-byte string: not in the schema.
    body.extend_from_slice(&[0x98, 0x06, 0xac, 0x02, 0xa2, 0x06, 0x03, b'x', b'y', b'z']);
    let response = next_action_raw(&server, body).await.expect("decoded");
    assert_eq!(response.code, "schedule_retry");
    assert_eq!(
        common::get(&mut server.client().await, "codec-2")
            .await
            .attempts,
        1
    );
}

/// tonic starts each call's buffers at 8 KiB in either direction; a larger
/// message grows them. A request with a large unknown field is decoded, and
/// an activity whose history is longer than a buffer comes back whole (the
/// client's generated code uses the same codec).
#[tokio::test]
async fn messages_larger_than_the_first_buffer_pass_both_ways() {
    const BUFFER_SIZE: usize = 8 * 1024;

    let server = TestServer::start().await;
    let mut body = report("codec-3", 1, pb::ErrorClass::Transient).encode_to_vec();
    // Field 100, a string of 5 * BUFFER_SIZE bytes: not in the schema.
    let padding = 5 * BUFFER_SIZE;
    body.extend_from_slice(&[0xa2, 0x06]);
    prost::encoding::encode_varint(padding as u64, &mut body);
    body.resize(body.len() + padding, b'p');
    assert!(body.len() > 5 * BUFFER_SIZE);
    let response = next_action_raw(&server, body).await.expect("decoded");
    assert_eq!(response.code, "schedule_retry");

    let mut client = server.client().await;
    let attempts = 80;
    // Two hours ago: eighty planned retries, each at most a minute after
    // the last, stay within the server's bounds around its clock.
    let mut occurred_at = common::ts(retry_budget::clock::now_ms() - 7_200_000);
    for attempt in 1..=attempts {
        let response = client
            .next_action(pb::NextActionRequest {
                policy: Some(pb::Policy {
                    max_attempts: 1000,
                    deadline_seconds: 10 * 365 * 24 * 3600,
                    base: None,
                    cap: None,
                }),
                occurred_at: Some(occurred_at),
                ..report("codec-4", attempt, pb::ErrorClass::Transient)
            })
            .await
            .expect("a retry")
            .into_inner();
        assert_eq!(response.code, "schedule_retry", "attempt {attempt}");
        occurred_at = response.not_before.expect("a retry has its time");
    }
    let activity = common::get(&mut client, "codec-4").await;
    assert!(
        activity.encoded_len() > BUFFER_SIZE,
        "the response is {} bytes",
        activity.encoded_len()
    );
    assert_eq!(activity.attempts, attempts);
    assert_eq!(
        activity
            .events
            .iter()
            .map(|event| event.attempt)
            .collect::<Vec<_>>(),
        (1..=attempts).collect::<Vec<_>>()
    );
}
