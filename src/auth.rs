//! Who asks: one tower layer decides, once per request, which tenant a
//! request acts for, and puts the answer in the request's extensions as a
//! [`Tenant`]. The gRPC edge reads it there once a call, with
//! [`tenant_of`], to key the tenant's activities and to charge its share of
//! the retry bucket; nothing else reads `x-tenant-id`.
//!
//! In `none` mode the answer is usually the request's own `x-tenant-id`
//! (or, without one, the built-in default), which the layer has checked:
//! it then attaches nothing, and [`tenant_of`] reads that header. A request
//! pays no allocation for being authenticated in the default mode (an
//! extension is a box, and a fourth one grows the request's extension
//! map); the header is the one source either way.
//!
//! # Modes (`[auth] mode`, `--auth`)
//! - `none` (the default, for development and trusted networks):
//!   `x-tenant-id` is believed. An absent header is `auth.default_tenant`
//!   (`"default"`; `""` makes the header required), an empty or malformed
//!   one is refused.
//! - `api-keys`: `authorization: Bearer <key>`; the key's SHA-256 is looked
//!   up, in constant time, in `auth.api_keys_file` (see [`KeySet`]), and
//!   the tenant is the key's.
//! - `mesh`: the tenant is the identity the service mesh proves: the SPIFFE
//!   ID of the verified client certificate (mutual TLS on this port), or
//!   the identity header the sidecar sets (`auth.mesh_header`, believed
//!   only when configured), mapped to a tenant by `auth.identity_pattern`
//!   (see [`IdentityPattern`]).
//!
//! In the authenticated modes an `x-tenant-id` may repeat the proven tenant
//! but not name another (`PERMISSION_DENIED`, `tenant_mismatch`); a
//! missing or wrong credential is `UNAUTHENTICATED` (`unauthenticated`).
//! The layer answers those refusals itself, before anything is decoded or
//! charged. Health and reflection stay open unless
//! `auth.protect_health_reflection` is set. `docs/security.md` has the
//! threat model.

mod config;
mod identity;
mod keys;
mod layer;

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

pub use self::config::{AuthConfig, AuthMode};
pub use self::identity::{IdentityPattern, PatternError, spiffe_id, xfcc_uri};
pub use self::keys::{API_KEY_PREFIX, KeySet, KeysFileError, append_key, key_digest, new_api_key};
pub use self::layer::{AuthLayer, Authenticate, Authenticator};
use crate::budget::activity::BudgetError;
use crate::budget::tenant::{self, TENANT_HEADER};

/// `x-tenant-id` as a header name: a lookup by name skips the parse (and
/// lower-casing) that a lookup by `&str` makes on every call.
pub(crate) static TENANT: HeaderName = HeaderName::from_static(TENANT_HEADER);

/// The tenant a request acts for, as the authentication layer proved it: a
/// name shared with the key set, the configuration or the identity mapped
/// (cloning it copies no name).
#[derive(Debug, Clone)]
pub struct Tenant(Arc<str>);

impl Tenant {
    /// A tenant the server names.
    pub(crate) fn shared(name: Arc<str>) -> Self {
        Self(name)
    }

    /// The tenant id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The tenant a request acts for: the [`Tenant`] the authentication layer
/// put in its extensions, or, when it put none, `x-tenant-id` as the
/// `none` mode reads it (absent: the built-in default tenant). The layer
/// attaches a [`Tenant`] to every request it admits in `api-keys` and
/// `mesh` mode, and in `none` mode whenever the answer differs from that
/// reading (a configured default); a request that did not come through the
/// layer at all (a service driven in-process, as unit tests do) is read the
/// same way. The server puts the layer in front of every service.
///
/// # Errors
/// [`BudgetError::InvalidTenant`] when, without the layer, `x-tenant-id`
/// is not a valid tenant id.
pub fn tenant_of<'a>(
    extensions: &'a http::Extensions,
    headers: &'a HeaderMap,
) -> Result<&'a str, BudgetError> {
    match extensions.get::<Tenant>() {
        Some(tenant) => Ok(tenant.as_str()),
        None => tenant::parse(headers.get(&TENANT).map(HeaderValue::as_bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layers_answer_wins_over_the_header() {
        let mut headers = HeaderMap::new();
        headers.insert(TENANT_HEADER, HeaderValue::from_static("claimed"));
        let mut extensions = http::Extensions::new();
        assert_eq!(tenant_of(&extensions, &headers), Ok("claimed"));
        extensions.insert(Tenant::shared(Arc::from("proven")));
        assert_eq!(tenant_of(&extensions, &headers), Ok("proven"));
        headers.insert(TENANT_HEADER, HeaderValue::from_static(""));
        assert_eq!(
            tenant_of(&http::Extensions::new(), &headers),
            Err(BudgetError::InvalidTenant)
        );
    }
}
