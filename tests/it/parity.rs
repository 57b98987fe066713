//! Every vector of `tests/data/parity/` through the library and through the
//! real server on loopback.

use crate::common;

use common::{TestServer, parity, pb};
use retry_budget::budget::{Budget, DelayParams, ErrorClass, next_action, retry_delay};

fn class_number(name: &str) -> i32 {
    match name {
        "transient" => pb::ErrorClass::Transient as i32,
        "permanent" => pb::ErrorClass::Permanent as i32,
        "unknown" => pb::ErrorClass::Unknown as i32,
        // Not a class the wire can name: unspecified, or a number no enum
        // value has; the reference raises unknown_error_class for both.
        "" => pb::ErrorClass::Unspecified as i32,
        _ => 99,
    }
}

fn u32_of(v: &serde_json::Value, field: &str) -> u32 {
    u32::try_from(v[field].as_u64().expect(field)).expect("fits u32")
}

#[test]
fn retry_delay_vectors_through_the_library() {
    let vectors = parity("retry_delay.jsonl");
    assert!(vectors.len() > 500);
    for v in &vectors {
        let params = DelayParams {
            base: u32_of(v, "base"),
            cap: u32_of(v, "cap"),
        };
        let id = v["activity_id"].as_str().expect("id");
        let delay = retry_delay(id, u32_of(v, "attempt"), params).expect("attempt >= 1");
        assert_eq!(
            u64::from(delay.seconds),
            v["delay"].as_u64().unwrap(),
            "{v}"
        );
        assert_eq!(delay.millis / 1000, u64::from(delay.seconds), "{v}");
    }
}

#[test]
fn next_action_vectors_through_the_library() {
    let vectors = parity("next_action.jsonl");
    assert!(vectors.len() > 200);
    for v in &vectors {
        let budget = Budget {
            attempts: u32_of(v, "attempts"),
            max_attempts: u32_of(v, "max_attempts"),
            elapsed: v["elapsed"].as_u64().unwrap(),
            deadline: v["deadline"].as_u64().unwrap(),
        };
        let got = v["error_class"]
            .as_str()
            .unwrap()
            .parse::<ErrorClass>()
            .map(|class| next_action(&budget, class).code())
            .map_err(|_| "unknown_error_class");
        match (&v["action"], &v["error"]) {
            (serde_json::Value::String(code), _) => assert_eq!(got, Ok(code.as_str()), "{v}"),
            (_, serde_json::Value::String(code)) => assert_eq!(got, Err(code.as_str()), "{v}"),
            _ => panic!("vector without action or error: {v}"),
        }
    }
}

#[tokio::test]
async fn every_vector_through_the_real_server() {
    let server = TestServer::start().await;
    let mut client = server.client().await;

    for v in parity("retry_delay.jsonl") {
        let response = client
            .retry_delay(pb::RetryDelayRequest {
                activity_id: v["activity_id"].as_str().unwrap().into(),
                attempt: u32_of(&v, "attempt"),
                base: Some(u32_of(&v, "base")),
                cap: Some(u32_of(&v, "cap")),
            })
            .await
            .unwrap_or_else(|s| panic!("{v}: {s}"))
            .into_inner();
        assert_eq!(
            u64::from(response.delay_seconds),
            v["delay"].as_u64().unwrap(),
            "{v}"
        );
        assert_eq!(response.delay_ms / 1000, u64::from(response.delay_seconds));
    }

    for v in parity("next_action.jsonl") {
        let request = pb::NextActionRequest {
            budget: Some(pb::Budget {
                attempts: u32_of(&v, "attempts"),
                max_attempts: u32_of(&v, "max_attempts"),
                elapsed: v["elapsed"].as_u64().unwrap(),
                deadline: v["deadline"].as_u64().unwrap(),
            }),
            error_class: class_number(v["error_class"].as_str().unwrap()),
            ..Default::default()
        };
        let result = client.next_action(request).await;
        match (&v["action"], &v["error"]) {
            (serde_json::Value::String(code), _) => {
                let response = result.unwrap_or_else(|s| panic!("{v}: {s}")).into_inner();
                assert_eq!(&response.code, code, "{v}");
                assert_eq!(
                    pb::Action::try_from(response.action).unwrap().as_str_name(),
                    format!("ACTION_{}", code.to_uppercase()),
                );
            }
            (_, serde_json::Value::String(code)) => {
                let status = result.expect_err("reference raises");
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{v}");
                assert!(
                    status.message().starts_with(&format!("{code}:")),
                    "{v}: {status}"
                );
            }
            _ => panic!("vector without action or error: {v}"),
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test]
async fn the_articles_printed_lines_through_the_server() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    for (id, expected) in [
        ("flight-1", [1, 2, 4, 11, 16, 35]),
        ("flight-2", [1, 2, 4, 15, 19, 54]),
    ] {
        let mut got = Vec::new();
        for attempt in 1..=6 {
            let r = client
                .retry_delay(pb::RetryDelayRequest {
                    activity_id: id.into(),
                    attempt,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            got.push(r.delay_seconds);
        }
        assert_eq!(got, expected, "{id}");
    }
}

#[tokio::test]
async fn bad_input_gets_a_stable_code() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let cases = [
        ("x", 0, "attempt_must_be_positive"),
        ("", 1, "empty_activity_id"),
        ("a\u{7}b", 1, "activity_id_control_character"),
    ];
    for (id, attempt, code) in cases {
        let status = client
            .retry_delay(pb::RetryDelayRequest {
                activity_id: id.into(),
                attempt,
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(code), "{status:?}");
    }
    let long = "é".repeat(129);
    let status = client
        .retry_delay(pb::RetryDelayRequest {
            activity_id: long,
            attempt: 1,
            ..Default::default()
        })
        .await
        .expect_err("258 bytes");
    assert!(
        status.message().starts_with("activity_id_too_long"),
        "{status:?}"
    );
    let exactly = "x".repeat(256);
    client
        .retry_delay(pb::RetryDelayRequest {
            activity_id: exactly,
            attempt: 1,
            ..Default::default()
        })
        .await
        .expect("256 bytes is allowed");
}

#[tokio::test]
async fn pure_next_action_plans_the_delay_of_a_named_activity() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let r = client
        .next_action(pb::NextActionRequest {
            budget: Some(pb::Budget {
                attempts: 4,
                max_attempts: 10,
                elapsed: 5,
                deadline: 600,
            }),
            activity_id: "flight-1".into(),
            error_class: pb::ErrorClass::Transient as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.code.as_str(), r.delay_seconds), ("schedule_retry", 11));
    assert_eq!(r.delay_ms / 1000, 11);
    assert!(
        !r.replayed && r.not_before.is_none(),
        "pure form stores nothing"
    );
}
