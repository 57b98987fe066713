//! [`AuthLayer`]: the outermost layer of the API, which resolves each
//! request's [`Tenant`] once and answers the refusals itself.

use std::borrow::Cow;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use futures_util::future::Either;
use http::{HeaderMap, HeaderName, HeaderValue};
use tonic::Code;
use tower::{Layer, Service};

use super::identity::{IdentityPattern, spiffe_id, xfcc_uri};
use super::keys::KeySet;
use super::{AuthConfig, AuthMode, Tenant};
use crate::budget::tenant::{self, DEFAULT_TENANT, TENANT_HEADER, TenantError};
use crate::peer::Peer;
use crate::refusal::Refusal;
use crate::setting::ConfigError;

/// The target of the layer's log lines: a refusal at debug level (its
/// code, the method, the caller's address; never a key or a header's
/// value), key reloads at info.
pub const AUTH_LOG: &str = "retry_budget::auth";

/// The header Envoy (and so Istio) sets with the client certificate's
/// details; its `URI=` field is read, not the whole value.
const XFCC: &str = "x-forwarded-client-cert";

/// Who may ask what: the mode and what it checks against. Shared by every
/// connection; the keys are swapped whole on reload.
#[derive(Debug)]
pub struct Authenticator {
    mode: AuthMode,
    /// In `none` mode, the tenant of a request without `x-tenant-id`.
    default_tenant: Option<Arc<str>>,
    /// Whether health and reflection need a credential too.
    protect_health_reflection: bool,
    /// In `api-keys` mode, the keys in force.
    keys: ArcSwap<KeySet>,
    /// In `mesh` mode, how identities name tenants.
    pattern: Option<IdentityPattern>,
    /// In `mesh` mode, the sidecar's identity header, when trusted.
    mesh_header: Option<HeaderName>,
}

impl Authenticator {
    /// The authenticator `config` describes; reads the keys file in
    /// `api-keys` mode.
    ///
    /// # Errors
    /// [`ConfigError`] as [`AuthConfig::validate`].
    pub fn new(config: &AuthConfig) -> Result<Self, ConfigError> {
        let (keys, pattern, mesh_header) = config.checked()?;
        if config.mode == AuthMode::ApiKeys {
            log_keys(&keys, "API keys loaded");
        }
        Ok(Self {
            mode: config.mode,
            default_tenant: (!config.default_tenant.is_empty())
                .then(|| Arc::from(config.default_tenant.as_str())),
            protect_health_reflection: config.protect_health_reflection,
            keys: ArcSwap::from_pointee(keys),
            pattern,
            mesh_header,
        })
    }

    /// The mode in force.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Replaces the keys (a reload). Requests already past the layer keep
    /// the tenant they were given.
    pub fn set_keys(&self, keys: KeySet) {
        if self.mode == AuthMode::ApiKeys {
            log_keys(&keys, "API keys reloaded");
            self.keys.store(Arc::new(keys));
        }
    }

    /// The tenant a request acts for, from its headers and what its
    /// connection proved: `None` when it is what [`super::tenant_of`]
    /// reads from the request itself (`none` mode: the checked header, or
    /// the built-in default), so nothing needs attaching.
    ///
    /// # Errors
    /// [`TenantError`]: the refusal the layer answers.
    pub fn resolve(
        &self,
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> Result<Option<Tenant>, TenantError> {
        let claimed = headers.get(&super::TENANT).map(HeaderValue::as_bytes);
        match self.mode {
            AuthMode::None => {
                let tenant = tenant::trusted(claimed, self.default_tenant.as_deref())?;
                Ok(match &self.default_tenant {
                    Some(default) if claimed.is_none() && tenant != DEFAULT_TENANT => {
                        Some(Tenant::shared(Arc::clone(default)))
                    }
                    _ => None,
                })
            }
            AuthMode::ApiKeys => {
                let key = bearer(headers).ok_or(TenantError::Unauthenticated)?;
                let keys = self.keys.load();
                let owner = keys.tenant(key).ok_or(TenantError::Unauthenticated)?;
                tenant::proven(owner, claimed)?;
                Ok(Some(Tenant::shared(Arc::clone(owner))))
            }
            AuthMode::Mesh => {
                let identity = self
                    .identity(headers, extensions)
                    .ok_or(TenantError::Unauthenticated)?;
                let pattern = self.pattern.as_ref().ok_or(TenantError::NotMapped)?;
                let Some(mapped) = pattern.tenant(&identity) else {
                    tracing::debug!(target: AUTH_LOG, %identity, "identity maps to no tenant");
                    return Err(TenantError::NotMapped);
                };
                tenant::proven(mapped, claimed)?;
                Ok(Some(Tenant::shared(Arc::from(mapped))))
            }
        }
    }

    /// The identity the mesh proved: the SPIFFE ID of the verified client
    /// certificate when the connection has one (a caller connected
    /// directly, not through the sidecar, so no header of its own is
    /// believed), else the sidecar's header when one is trusted.
    fn identity<'a>(
        &self,
        headers: &'a HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<Cow<'a, str>> {
        let certificate = extensions
            .get::<Peer>()
            .and_then(|peer| peer.client_certificate.as_ref());
        if let Some(certificate) = certificate {
            return spiffe_id(certificate).map(Cow::Owned);
        }
        let name = self.mesh_header.as_ref()?;
        let mut values = headers.get_all(name).iter();
        if name == XFCC {
            // The last line, as the sidecar appends its element last.
            return xfcc_uri(values.next_back()?.to_str().ok()?).map(Cow::Borrowed);
        }
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let identity = value.to_str().ok()?.trim();
        (!identity.is_empty()).then_some(Cow::Borrowed(identity))
    }
}

/// The key of an `authorization: Bearer <key>` header (the scheme in any
/// case, RFC 6750); `None` without one, or with several.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let value = values.next()?.as_bytes();
    if values.next().is_some() {
        return None;
    }
    let (scheme, key) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let key = key.trim_ascii();
    (!key.is_empty()).then_some(key)
}

fn log_keys(keys: &KeySet, message: &'static str) {
    tracing::info!(
        target: AUTH_LOG,
        keys = keys.len(),
        tenants = keys.tenant_count(),
        "{message}"
    );
    if keys.is_empty() {
        tracing::warn!(target: AUTH_LOG, "the API keys file has no key: every call is refused");
    }
}

/// A tenant refused in an authentication mode: what the caller is told.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
struct Refused<'a> {
    error: &'a TenantError,
    mode: AuthMode,
}

impl Refusal for Refused<'_> {
    fn grpc_code(&self) -> Code {
        match self.error {
            TenantError::Invalid | TenantError::Required => Code::InvalidArgument,
            TenantError::Unauthenticated => Code::Unauthenticated,
            TenantError::Mismatch { .. } | TenantError::NotMapped => Code::PermissionDenied,
        }
    }
    fn stable_code(&self) -> &'static str {
        self.error.code()
    }
    fn details(&self) -> Vec<(&'static str, String)> {
        match self.error {
            TenantError::Invalid | TenantError::Required => {
                vec![("header", TENANT_HEADER.to_owned())]
            }
            TenantError::Unauthenticated | TenantError::NotMapped => {
                vec![("auth_mode", self.mode.as_str().to_owned())]
            }
            TenantError::Mismatch { proven, claimed } => vec![
                ("tenant", proven.clone()),
                ("claimed_tenant", claimed.clone()),
            ],
        }
    }
}

/// The status a refusal is answered with ([`Refusal::status`]).
fn status(error: &TenantError, mode: AuthMode) -> tonic::Status {
    Refused { error, mode }.status()
}

/// Whether `path` is a method of health or reflection, open by default.
fn is_health_or_reflection(path: &str) -> bool {
    path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.")
}

/// Builds [`Authenticate`] services sharing one [`Authenticator`].
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
}

impl AuthLayer {
    /// A layer deciding with `auth`.
    pub fn new(auth: Arc<Authenticator>) -> Self {
        Self { auth }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate {
            inner,
            auth: Arc::clone(&self.auth),
        }
    }
}

/// Puts each request's [`Tenant`] in its extensions, or answers it with
/// the refusal (a gRPC trailers-only response) without passing it on.
#[derive(Debug, Clone)]
pub struct Authenticate<S> {
    inner: S,
    auth: Arc<Authenticator>,
}

impl<S, B, ResBody> Service<http::Request<B>> for Authenticate<S>
where
    S: Service<http::Request<B>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if !self.auth.protect_health_reflection && is_health_or_reflection(request.uri().path()) {
            return Either::Right(self.inner.call(request));
        }
        match self.auth.resolve(request.headers(), request.extensions()) {
            Ok(tenant) => {
                if let Some(tenant) = tenant {
                    request.extensions_mut().insert(tenant);
                }
                Either::Right(self.inner.call(request))
            }
            Err(error) => {
                tracing::debug!(
                    target: AUTH_LOG,
                    code = error.code(),
                    method = request.uri().path(),
                    peer = ?request.extensions().get::<Peer>().and_then(|p| p.remote_addr),
                    "refused"
                );
                let response = status(&error, self.auth.mode).into_http();
                Either::Left(ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests;
