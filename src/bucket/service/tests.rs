//! The layer driven through `tower_test::mock`, on paused tokio time: no
//! sockets, no sleeps.

use std::time::Duration;

use tower_test::mock::{self, Handle, Spawn};

use super::*;
use crate::bucket::{
    Admission, BucketConfig, GLOBAL_CAPACITY_EXHAUSTED, RetryTokenLayer, TENANT_SHARE_EXHAUSTED,
};
use crate::budget::token::TokenGate;

type Req = http::Request<()>;
type Res = http::Response<()>;

struct Harness {
    bucket: FairBucket,
    service: Spawn<RetryToken<mock::Mock<Req, Res>>>,
    handle: Handle<Req, Res>,
}

fn harness(rate: f64, burst: u32) -> Harness {
    // The dependencies' budgets out of the way: these tests are of the
    // global bucket.
    let bucket = FairBucket::with_dependencies(
        &BucketConfig {
            rate,
            burst,
            ..BucketConfig::default()
        },
        crate::bucket::DependenciesConfig::static_rate(crate::bucket::config::MAX_RATE),
    )
    .expect("valid test configuration");
    let (service, handle) = mock::spawn_layer(RetryTokenLayer::new(bucket.clone()));
    Harness {
        bucket,
        service,
        handle,
    }
}

fn request(path: &str) -> Req {
    http::Request::post(path)
        .header(TENANT_HEADER, "acme")
        .body(())
        .expect("a valid test request")
}

impl Harness {
    /// Sends a request through the layer and returns the gate the inner
    /// service found in it.
    async fn gate(&mut self, path: &str) -> Gate {
        assert!(self.service.poll_ready().is_ready());
        let _response = self.service.call(request(path));
        let (seen, respond) = self
            .handle
            .next_request()
            .await
            .expect("the request reaches the inner service");
        respond.send_response(http::Response::new(()));
        seen.extensions()
            .get::<Gate>()
            .cloned()
            .expect("every request carries a gate")
    }
}

#[tokio::test(start_paused = true)]
async fn every_request_gets_a_gate_and_nothing_is_taken_until_a_decision_asks() {
    let mut h = harness(10.0, 5);
    for path in [
        "/retrybudget.v1.RetryBudget/NextAction",
        "/retrybudget.v1.RetryBudget/RetryDelay",
        "/grpc.health.v1.Health/Check",
    ] {
        drop(h.gate(path).await);
    }
    let stats = h.bucket.stats();
    assert_eq!((stats.granted, stats.level), (0, 5.0), "nothing taken");
    assert_eq!(stats.tracked_tenants, 0, "no tenant seen");
    let gate = h.gate("/retrybudget.v1.RetryBudget/NextAction").await;
    assert_eq!(
        gate.tenant("acme", "").take(Duration::MAX).admission,
        Admission::Granted
    );
    let stats = h.bucket.stats();
    assert_eq!((stats.granted, stats.level), (1, 4.0));
}

#[tokio::test(start_paused = true)]
async fn a_drained_bucket_defers_with_spread_slots() {
    let mut h = harness(100.0, 1);
    let gate = h.gate("/retrybudget.v1.RetryBudget/NextAction").await;
    assert_eq!(
        gate.tenant("a", "").take(Duration::MAX).admission,
        Admission::Granted
    );
    assert_eq!(
        gate.tenant("b", "").take(Duration::MAX).admission,
        Admission::Granted
    );
    let mut waits = Vec::new();
    for _ in 0..4 {
        match gate.tenant("a", "").take(Duration::MAX).admission {
            Admission::Deferred { wait, reason } => {
                assert_eq!(reason, TENANT_SHARE_EXHAUSTED);
                waits.push(wait);
            }
            other => panic!("expected a deferral, got {other:?}"),
        }
    }
    // Two tenants share 100 tokens/s: a's slots are 20 ms apart.
    let ms = Duration::from_millis;
    assert_eq!(waits, [ms(10), ms(30), ms(50), ms(70)]);
    assert_eq!(h.bucket.stats().deferred_tenant_share, 4);
}

#[tokio::test(start_paused = true)]
async fn the_bucket_refills_as_paused_time_advances() {
    let mut h = harness(10.0, 1);
    let gate = h.gate("/retrybudget.v1.RetryBudget/NextAction").await;
    assert_eq!(
        gate.tenant("t", "").take(Duration::MAX).admission,
        Admission::Granted
    );
    assert_eq!(
        gate.tenant("t", "")
            .take(Duration::from_millis(50))
            .admission,
        Admission::Refused {
            retry_after: Duration::from_millis(100),
            reason: crate::bucket::RESERVATION_PAST_MAX_WAIT,
        }
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(
        gate.tenant("t", "").take(Duration::MAX).admission,
        Admission::Granted
    );
    tokio::time::advance(Duration::from_millis(50)).await;
    match gate.tenant("t", "").take(Duration::MAX).admission {
        Admission::Deferred { wait, reason } => {
            assert_eq!(wait, Duration::from_millis(50));
            assert_eq!(reason, GLOBAL_CAPACITY_EXHAUSTED);
        }
        other => panic!("expected a deferral, got {other:?}"),
    }
}
