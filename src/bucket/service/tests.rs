//! The layer driven through `tower_test::mock`, on paused tokio time: no
//! sockets, no sleeps.

use std::time::Duration;

use tower_test::mock::{self, Handle, Spawn};

use super::*;
use crate::bucket::{
    Admission, BucketConfig, GLOBAL_CAPACITY_EXHAUSTED, PermitSlot, RetryTokenLayer,
    TENANT_SHARE_EXHAUSTED,
};

type Req = http::Request<()>;
type Res = http::Response<()>;

struct Harness {
    bucket: FairBucket,
    service: Spawn<RetryToken<mock::Mock<Req, Res>>>,
    handle: Handle<Req, Res>,
}

fn harness(rate: f64, burst: u32) -> Harness {
    let bucket = FairBucket::new(&BucketConfig {
        rate,
        burst,
        ..BucketConfig::default()
    })
    .expect("valid test configuration");
    let (service, handle) = mock::spawn_layer(RetryTokenLayer::new(bucket.clone()));
    Harness {
        bucket,
        service,
        handle,
    }
}

fn request(path: &str, tenant: Option<&str>) -> Req {
    let mut builder = http::Request::post(path);
    if let Some(tenant) = tenant {
        builder = builder.header(TENANT_HEADER, tenant);
    }
    builder.body(()).expect("a valid test request")
}

impl Harness {
    /// Sends `request` through the layer and returns it as the inner
    /// service saw it.
    async fn send(&mut self, request: Req) -> Req {
        assert!(self.service.poll_ready().is_ready());
        let _response = self.service.call(request);
        let (seen, respond) = self
            .handle
            .next_request()
            .await
            .expect("the request reaches the inner service");
        respond.send_response(http::Response::new(()));
        seen
    }

    /// The permit of a `NextAction` request of `tenant`.
    async fn permit(&mut self, tenant: Option<&str>) -> PermitSlot {
        let seen = self.send(request(NEXT_ACTION_PATH, tenant)).await;
        seen.extensions()
            .get::<PermitSlot>()
            .cloned()
            .expect("NextAction carries a permit")
    }
}

#[tokio::test(start_paused = true)]
async fn only_next_action_gets_a_permit() {
    let mut h = harness(10.0, 5);
    for path in [
        "/retrybudget.v1.RetryBudget/RetryDelay",
        "/retrybudget.v1.RetryBudget/RecordSuccess",
        "/grpc.health.v1.Health/Check",
    ] {
        let seen = h.send(request(path, Some("acme"))).await;
        assert!(seen.extensions().get::<PermitSlot>().is_none(), "{path}");
    }
    assert_eq!(h.bucket.stats().taken, 0);
    assert!(h.permit(Some("acme")).await.holds_token());
}

#[tokio::test(start_paused = true)]
async fn the_tenant_header_is_honoured_and_garbage_is_not_tracked() {
    let mut h = harness(10.0, 5);
    assert_eq!(h.permit(Some("acme")).await.tenant(), "acme");
    assert_eq!(h.permit(None).await.tenant(), DEFAULT_TENANT);
    let tracked = h.bucket.stats().tracked_tenants;
    let long = "x".repeat(129);
    for bad in ["", "has space", long.as_str()] {
        let seen = h.send(request(NEXT_ACTION_PATH, Some(bad))).await;
        assert!(seen.extensions().get::<PermitSlot>().is_none(), "{bad:?}");
    }
    let mut non_ascii = request(NEXT_ACTION_PATH, None);
    non_ascii.headers_mut().insert(
        TENANT_HEADER,
        http::HeaderValue::from_bytes("caf\u{e9}".as_bytes()).expect("opaque bytes are allowed"),
    );
    let seen = h.send(non_ascii).await;
    assert!(seen.extensions().get::<PermitSlot>().is_none());
    assert_eq!(h.bucket.stats().tracked_tenants, tracked);
}

#[tokio::test(start_paused = true)]
async fn the_tenant_the_authentication_layer_resolved_is_charged_not_the_header() {
    let mut h = harness(10.0, 5);
    let mut proven = request(NEXT_ACTION_PATH, Some("claimed"));
    proven
        .extensions_mut()
        .insert(crate::auth::Tenant::shared(std::sync::Arc::from("proven")));
    let seen = h.send(proven).await;
    let slot = seen.extensions().get::<PermitSlot>().expect("a permit");
    assert_eq!(slot.tenant(), "proven");
}

#[tokio::test(start_paused = true)]
async fn an_unused_permit_returns_its_token_when_the_request_drops() {
    let mut h = harness(10.0, 1);
    let seen = h.send(request(NEXT_ACTION_PATH, Some("acme"))).await;
    assert_eq!(h.bucket.stats().level, 0.0);
    // A terminal decision: the handler never touches the permit.
    drop(seen);
    let stats = h.bucket.stats();
    assert_eq!((stats.taken, stats.returned, stats.level), (1, 1, 1.0));
    assert!(
        h.permit(Some("acme")).await.holds_token(),
        "the share came back too"
    );
}

#[tokio::test(start_paused = true)]
async fn commit_spends_the_token_for_good() {
    let mut h = harness(10.0, 1);
    let seen = h.send(request(NEXT_ACTION_PATH, Some("acme"))).await;
    let slot = seen.extensions().get::<PermitSlot>().expect("a permit");
    assert_eq!(slot.commit(), Ok(Admission::Granted));
    drop(seen);
    let stats = h.bucket.stats();
    assert_eq!((stats.granted, stats.returned, stats.level), (1, 0, 0.0));
}

#[tokio::test(start_paused = true)]
async fn a_drained_bucket_defers_with_spread_slots() {
    let mut h = harness(100.0, 1);
    assert_eq!(h.permit(Some("a")).await.commit(), Ok(Admission::Granted));
    assert_eq!(h.permit(Some("b")).await.commit(), Ok(Admission::Granted));
    let mut waits = Vec::new();
    for _ in 0..4 {
        let slot = h.permit(Some("a")).await;
        assert!(!slot.holds_token());
        match slot.commit() {
            Ok(Admission::Deferred { wait, reason }) => {
                assert_eq!(reason, TENANT_SHARE_EXHAUSTED);
                waits.push(wait);
            }
            other => panic!("expected a deferral, got {other:?}"),
        }
    }
    // Two tenants share 100 tokens/s: a's slots are 20 ms apart.
    let ms = Duration::from_millis;
    assert_eq!(waits, [ms(10), ms(30), ms(50), ms(70)]);
    let stats = h.bucket.stats();
    assert_eq!(stats.deferred_tenant_share, 4);
}

#[tokio::test(start_paused = true)]
async fn the_bucket_refills_as_paused_time_advances() {
    let mut h = harness(10.0, 1);
    assert_eq!(h.permit(None).await.commit(), Ok(Admission::Granted));
    let slot = h.permit(None).await;
    assert!(!slot.holds_token());
    assert_eq!(
        slot.commit_within(Duration::from_millis(50)),
        Ok(Admission::Refused {
            retry_after: Duration::from_millis(100),
            reason: crate::bucket::RESERVATION_PAST_MAX_WAIT,
        })
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    let slot = h.permit(None).await;
    assert!(slot.holds_token());
    assert_eq!(slot.commit(), Ok(Admission::Granted));
    tokio::time::advance(Duration::from_millis(50)).await;
    match h.permit(None).await.commit() {
        Ok(Admission::Deferred { wait, reason }) => {
            assert_eq!(wait, Duration::from_millis(50));
            assert_eq!(reason, GLOBAL_CAPACITY_EXHAUSTED);
        }
        other => panic!("expected a deferral, got {other:?}"),
    }
}
