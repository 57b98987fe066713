//! The layer driven in-process: requests built by hand, the [`Peer`] of a
//! mutual-TLS connection put in their extensions as the server's listener
//! does, and the answer read as a gRPC client reads it.

use std::convert::Infallible;
use std::path::Path;

use rustls::pki_types::CertificateDer;
use tonic_types::StatusExt;
use tower::ServiceExt;

use super::*;
use crate::auth::{append_key, new_api_key};
use crate::budget::codes;

const METHOD: &str = "/retrybudget.v1.RetryBudget/GetActivity";
const HEALTH: &str = "/grpc.health.v1.Health/Check";

/// What the layer did with a request: the tenant the service saw, or the
/// refusal's gRPC code and stable reason.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Tenant(String),
    /// Passed on without a tenant (health, reflection).
    Open,
    Refused(Code, String),
}

async fn send(auth: &Arc<Authenticator>, request: http::Request<()>) -> Seen {
    let inner = tower::service_fn(|request: http::Request<()>| async move {
        // As the token layer and the gRPC edge read it (health and
        // reflection read none; protected, they have one attached).
        let open = is_health_or_reflection(request.uri().path())
            && request.extensions().get::<Tenant>().is_none();
        let tenant = (!open).then(|| {
            crate::auth::tenant_of(request.extensions(), request.headers())
                .expect("an admitted request has a tenant")
                .to_owned()
        });
        let mut response = http::Response::new(String::new());
        if let Some(tenant) = tenant {
            response
                .headers_mut()
                .insert("seen", HeaderValue::try_from(tenant).unwrap());
        }
        Ok::<_, Infallible>(response)
    });
    let response = AuthLayer::new(Arc::clone(auth))
        .layer(inner)
        .oneshot(request)
        .await
        .unwrap();
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        let reason = status
            .get_error_details()
            .error_info()
            .unwrap()
            .reason
            .clone();
        assert!(
            status.message().starts_with(&format!("{reason}: ")),
            "{status:?}"
        );
        return Seen::Refused(status.code(), reason);
    }
    match response.headers().get("seen") {
        Some(tenant) => Seen::Tenant(tenant.to_str().unwrap().to_owned()),
        None => Seen::Open,
    }
}

fn request(path: &str, headers: &[(&str, &str)]) -> http::Request<()> {
    let mut builder = http::Request::post(path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap()
}

fn authenticator(config: AuthConfig) -> Arc<Authenticator> {
    Arc::new(Authenticator::new(&config).unwrap())
}

fn tenant(name: &str) -> Seen {
    Seen::Tenant(name.to_owned())
}

fn refused(code: Code, reason: &str) -> Seen {
    Seen::Refused(code, reason.to_owned())
}

#[tokio::test]
async fn none_believes_the_header_and_refuses_an_empty_one() {
    let auth = authenticator(AuthConfig::default());
    assert_eq!(
        send(&auth, request(METHOD, &[(TENANT_HEADER, "acme")])).await,
        tenant("acme")
    );
    assert_eq!(send(&auth, request(METHOD, &[])).await, tenant("default"));
    assert_eq!(
        send(&auth, request(METHOD, &[(TENANT_HEADER, "")])).await,
        refused(Code::InvalidArgument, codes::INVALID_TENANT)
    );
    assert_eq!(
        send(&auth, request(METHOD, &[(TENANT_HEADER, "a b")])).await,
        refused(Code::InvalidArgument, codes::INVALID_TENANT)
    );
    // The header (or the built-in default) is the answer: nothing is
    // attached, so the request allocates nothing for it.
    let none = |headers: &[(&str, &str)]| {
        auth.resolve(request(METHOD, headers).headers(), &http::Extensions::new())
            .map(|tenant| tenant.is_none())
    };
    assert_eq!(none(&[(TENANT_HEADER, "acme")]), Ok(true));
    assert_eq!(none(&[]), Ok(true));
    let shared = authenticator(AuthConfig {
        default_tenant: "shared".to_owned(),
        ..AuthConfig::default()
    });
    assert_eq!(send(&shared, request(METHOD, &[])).await, tenant("shared"));
    assert_eq!(
        send(&shared, request(METHOD, &[(TENANT_HEADER, "acme")])).await,
        tenant("acme")
    );
    let required = authenticator(AuthConfig {
        default_tenant: String::new(),
        ..AuthConfig::default()
    });
    assert_eq!(
        send(&required, request(METHOD, &[])).await,
        refused(Code::InvalidArgument, codes::TENANT_REQUIRED)
    );
    assert_eq!(send(&required, request(HEALTH, &[])).await, Seen::Open);
}

fn keys_config(path: &Path) -> AuthConfig {
    AuthConfig {
        mode: AuthMode::ApiKeys,
        api_keys_file: Some(path.to_owned()),
        ..AuthConfig::default()
    }
}

#[tokio::test]
async fn api_keys_prove_their_tenant_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let key = new_api_key().unwrap();
    append_key(&path, "acme", &key).unwrap();
    let auth = authenticator(keys_config(&path));
    let bearer = format!("Bearer {key}");
    let lower = format!("bearer  {key}");
    assert_eq!(
        send(&auth, request(METHOD, &[("authorization", &bearer)])).await,
        tenant("acme")
    );
    assert_eq!(
        send(&auth, request(METHOD, &[("authorization", &lower)])).await,
        tenant("acme")
    );
    assert_eq!(
        send(
            &auth,
            request(
                METHOD,
                &[("authorization", &bearer), (TENANT_HEADER, "acme")]
            )
        )
        .await,
        tenant("acme")
    );
    assert_eq!(
        send(
            &auth,
            request(
                METHOD,
                &[("authorization", &bearer), (TENANT_HEADER, "globex")]
            )
        )
        .await,
        refused(Code::PermissionDenied, codes::TENANT_MISMATCH)
    );
    let wrong = format!("Bearer {}", new_api_key().unwrap());
    for headers in [
        vec![],
        vec![(TENANT_HEADER, "acme")],
        vec![("authorization", wrong.as_str())],
        vec![("authorization", key.as_str())],
        vec![("authorization", "Bearer ")],
        vec![("authorization", "Basic YWNtZTprZXk=")],
        vec![
            ("authorization", bearer.as_str()),
            ("authorization", bearer.as_str()),
        ],
    ] {
        assert_eq!(
            send(&auth, request(METHOD, &headers)).await,
            refused(Code::Unauthenticated, codes::UNAUTHENTICATED),
            "{headers:?}"
        );
    }
    assert_eq!(send(&auth, request(HEALTH, &[])).await, Seen::Open);
    assert_eq!(
        send(
            &auth,
            request(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                &[]
            )
        )
        .await,
        Seen::Open
    );
    let protected = authenticator(AuthConfig {
        protect_health_reflection: true,
        ..keys_config(&path)
    });
    assert_eq!(
        send(&protected, request(HEALTH, &[])).await,
        refused(Code::Unauthenticated, codes::UNAUTHENTICATED)
    );
    assert_eq!(
        send(&protected, request(HEALTH, &[("authorization", &bearer)])).await,
        tenant("acme")
    );

    // A reload swaps the keys: the old one stops working, the new one works.
    let next = new_api_key().unwrap();
    std::fs::remove_file(&path).unwrap();
    append_key(&path, "acme", &next).unwrap();
    auth.set_keys(KeySet::load(&path).unwrap());
    assert_eq!(
        send(&auth, request(METHOD, &[("authorization", &bearer)])).await,
        refused(Code::Unauthenticated, codes::UNAUTHENTICATED)
    );
    let bearer = format!("Bearer {next}");
    assert_eq!(
        send(&auth, request(METHOD, &[("authorization", &bearer)])).await,
        tenant("acme")
    );
}

fn svid(uri: &str) -> Arc<CertificateDer<'static>> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::URI(uri.try_into().unwrap()));
    let key = rcgen::KeyPair::generate().unwrap();
    Arc::new(params.self_signed(&key).unwrap().der().clone())
}

fn with_certificate(mut request: http::Request<()>, uri: &str) -> http::Request<()> {
    request.extensions_mut().insert(Peer {
        remote_addr: None,
        client_certificate: Some(svid(uri)),
    });
    request
}

fn mesh_config(header: Option<&str>) -> AuthConfig {
    AuthConfig {
        mode: AuthMode::Mesh,
        identity_pattern: Some("spiffe://cluster.local/ns/{tenant}/sa/*".to_owned()),
        mesh_header: header.map(str::to_owned),
        ..AuthConfig::default()
    }
}

#[tokio::test]
async fn mesh_maps_the_client_certificates_spiffe_id() {
    let auth = authenticator(mesh_config(None));
    let acme = "spiffe://cluster.local/ns/acme/sa/worker";
    assert_eq!(
        send(&auth, with_certificate(request(METHOD, &[]), acme)).await,
        tenant("acme")
    );
    assert_eq!(
        send(
            &auth,
            with_certificate(request(METHOD, &[(TENANT_HEADER, "globex")]), acme)
        )
        .await,
        refused(Code::PermissionDenied, codes::TENANT_MISMATCH)
    );
    assert_eq!(
        send(
            &auth,
            with_certificate(request(METHOD, &[]), "spiffe://other.org/ns/acme/sa/w")
        )
        .await,
        refused(Code::PermissionDenied, codes::IDENTITY_NOT_MAPPED)
    );
    assert_eq!(
        send(&auth, request(METHOD, &[(TENANT_HEADER, "acme")])).await,
        refused(Code::Unauthenticated, codes::UNAUTHENTICATED)
    );
    // Without a trusted header, a header naming an identity is nobody's.
    let xfcc = "URI=spiffe://cluster.local/ns/acme/sa/worker";
    assert_eq!(
        send(&auth, request(METHOD, &[("x-forwarded-client-cert", xfcc)])).await,
        refused(Code::Unauthenticated, codes::UNAUTHENTICATED)
    );
}

#[tokio::test]
async fn mesh_believes_the_sidecars_header_only_when_configured() {
    let istio = authenticator(mesh_config(Some("X-Forwarded-Client-Cert")));
    let xfcc = "By=spiffe://cluster.local/ns/rb/sa/retry-budget;Hash=ab;\
                URI=spiffe://cluster.local/ns/acme/sa/worker";
    assert_eq!(
        send(
            &istio,
            request(METHOD, &[("x-forwarded-client-cert", xfcc)])
        )
        .await,
        tenant("acme")
    );
    // A caller's own element comes first; the sidecar's is last.
    let forged = format!("URI=spiffe://cluster.local/ns/globex/sa/w,{xfcc}");
    assert_eq!(
        send(
            &istio,
            request(METHOD, &[("x-forwarded-client-cert", &forged)])
        )
        .await,
        tenant("acme")
    );
    // A connection with its own certificate did not come through the
    // sidecar: its header is not believed.
    assert_eq!(
        send(
            &istio,
            with_certificate(
                request(METHOD, &[("x-forwarded-client-cert", xfcc)]),
                "spiffe://cluster.local/ns/globex/sa/w"
            )
        )
        .await,
        tenant("globex")
    );
    let linkerd = authenticator(AuthConfig {
        identity_pattern: Some(
            "*.{tenant}.serviceaccount.identity.linkerd.cluster.local".to_owned(),
        ),
        ..mesh_config(Some("l5d-client-id"))
    });
    let id = "worker.acme.serviceaccount.identity.linkerd.cluster.local";
    assert_eq!(
        send(&linkerd, request(METHOD, &[("l5d-client-id", id)])).await,
        tenant("acme")
    );
    assert_eq!(
        send(
            &linkerd,
            request(METHOD, &[("l5d-client-id", id), ("l5d-client-id", id)])
        )
        .await,
        refused(Code::Unauthenticated, codes::UNAUTHENTICATED)
    );
    assert_eq!(
        send(
            &linkerd,
            request(METHOD, &[("l5d-client-id", "worker.acme.evil")])
        )
        .await,
        refused(Code::PermissionDenied, codes::IDENTITY_NOT_MAPPED)
    );
}
