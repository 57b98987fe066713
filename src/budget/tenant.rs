//! Who asks: the rules that turn what a request carries into the tenant it
//! acts for. The authentication layer (`src/auth/`) gathers the evidence
//! (the `x-tenant-id` header, a key's tenant, the mesh's identity) and
//! decides with these functions, once per request; the token layer and the
//! gRPC edge read its answer.

use super::codes;
use super::error::BudgetError;

/// The request header that names the tenant.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// The longest tenant id, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;
/// The tenant of requests that name none, unless the configuration
/// (`auth.default_tenant`) says otherwise.
pub const DEFAULT_TENANT: &str = "default";

/// Why a request acts for no tenant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// `x-tenant-id` is empty, too long or not printable ASCII.
    #[error(
        "{}: x-tenant-id must be 1 to {MAX_TENANT_BYTES} printable ASCII characters",
        codes::INVALID_TENANT
    )]
    Invalid,
    /// No `x-tenant-id`, and no default tenant is configured.
    #[error(
        "{}: this server requires the x-tenant-id header (it has no default tenant)",
        codes::TENANT_REQUIRED
    )]
    Required,
    /// No credential, or one the server does not accept. Which of the two
    /// is never said: that would tell a guesser when it got close.
    #[error(
        "{}: the request carries no credential this server accepts",
        codes::UNAUTHENTICATED
    )]
    Unauthenticated,
    /// The credential proves one tenant, `x-tenant-id` names another.
    #[error(
        "{}: the credential is tenant {proven:?}'s, x-tenant-id names {claimed:?}",
        codes::TENANT_MISMATCH
    )]
    Mismatch {
        /// The tenant the credential proves (the caller's own).
        proven: String,
        /// The tenant the header names.
        claimed: String,
    },
    /// The mesh proved an identity that maps to no tenant.
    #[error(
        "{}: the caller's identity maps to no tenant of this server",
        codes::IDENTITY_NOT_MAPPED
    )]
    NotMapped,
}

impl TenantError {
    /// The stable code that starts the message.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid => codes::INVALID_TENANT,
            Self::Required => codes::TENANT_REQUIRED,
            Self::Unauthenticated => codes::UNAUTHENTICATED,
            Self::Mismatch { .. } => codes::TENANT_MISMATCH,
            Self::NotMapped => codes::IDENTITY_NOT_MAPPED,
        }
    }
}

/// The tenant of a request whose `x-tenant-id` is trusted (no
/// authentication): the header's, or `default` when it is absent.
///
/// # Errors
/// [`TenantError::Invalid`] for a header that is not a valid tenant id,
/// the empty one included (it names nobody, and silently taking it for the
/// default would hide a client's bug); [`TenantError::Required`] for an
/// absent header when there is no default.
pub fn trusted<'a>(
    header: Option<&'a [u8]>,
    default: Option<&'a str>,
) -> Result<&'a str, TenantError> {
    match header {
        Some(bytes) => checked(bytes).ok_or(TenantError::Invalid),
        None => default.ok_or(TenantError::Required),
    }
}

/// The tenant of a request whose credential proves `proven`: the header
/// may repeat it (clients written for unauthenticated servers send it) but
/// not name another.
///
/// # Errors
/// [`TenantError::Invalid`] for a header that is not a valid tenant id;
/// [`TenantError::Mismatch`] for one naming another tenant.
pub fn proven<'a>(proven: &'a str, header: Option<&[u8]>) -> Result<&'a str, TenantError> {
    match header {
        None => Ok(proven),
        Some(bytes) if bytes == proven.as_bytes() => Ok(proven),
        Some(bytes) => match checked(bytes) {
            Some(claimed) => Err(TenantError::Mismatch {
                proven: proven.to_owned(),
                claimed: claimed.to_owned(),
            }),
            None => Err(TenantError::Invalid),
        },
    }
}

/// The tenant named by the raw value of the [`TENANT_HEADER`] header when
/// no authentication layer read the request first (a service driven
/// in-process): absent is [`DEFAULT_TENANT`].
///
/// # Errors
/// [`BudgetError::InvalidTenant`] for a value that is not 1 to
/// [`MAX_TENANT_BYTES`] printable ASCII characters, the empty one included.
pub fn parse(header: Option<&[u8]>) -> Result<&str, BudgetError> {
    trusted(header, Some(DEFAULT_TENANT)).map_err(|_| BudgetError::InvalidTenant)
}

/// Checks a tenant id: 1 to [`MAX_TENANT_BYTES`] printable ASCII characters.
///
/// # Errors
/// [`BudgetError::InvalidTenant`].
pub fn validate(tenant: &str) -> Result<(), BudgetError> {
    checked(tenant.as_bytes())
        .map(drop)
        .ok_or(BudgetError::InvalidTenant)
}

/// `bytes` as a tenant id, if they are one.
fn checked(bytes: &[u8]) -> Option<&str> {
    let printable = bytes.iter().all(u8::is_ascii_graphic);
    if bytes.is_empty() || bytes.len() > MAX_TENANT_BYTES || !printable {
        return None;
    }
    // Printable ASCII is UTF-8.
    std::str::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_is_the_default_and_empty_or_garbage_is_refused() {
        assert_eq!(parse(None), Ok(DEFAULT_TENANT));
        assert_eq!(parse(Some(b"acme")), Ok("acme"));
        let long = [b'a'; MAX_TENANT_BYTES + 1];
        for bad in [&b""[..], b"a b", b"\xff", b"caf\xc3\xa9", &long] {
            assert_eq!(parse(Some(bad)), Err(BudgetError::InvalidTenant), "{bad:?}");
        }
        assert_eq!(parse(Some(&long[1..])).map(str::len), Ok(MAX_TENANT_BYTES));
    }

    #[test]
    fn a_trusted_header_needs_a_default_when_absent() {
        assert_eq!(trusted(None, Some("shared")), Ok("shared"));
        assert_eq!(trusted(None, None), Err(TenantError::Required));
        assert_eq!(trusted(Some(b"acme"), None), Ok("acme"));
        assert_eq!(
            trusted(Some(b""), Some("shared")),
            Err(TenantError::Invalid)
        );
    }

    #[test]
    fn a_proven_tenant_may_be_repeated_but_not_contradicted() {
        assert_eq!(proven("acme", None), Ok("acme"));
        assert_eq!(proven("acme", Some(b"acme")), Ok("acme"));
        assert_eq!(
            proven("acme", Some(b"globex")),
            Err(TenantError::Mismatch {
                proven: "acme".into(),
                claimed: "globex".into()
            })
        );
        assert_eq!(proven("acme", Some(b"")), Err(TenantError::Invalid));
        assert_eq!(
            proven("acme", Some(b"acme ")).unwrap_err().code(),
            codes::INVALID_TENANT
        );
    }

    #[test]
    fn every_refusal_starts_with_its_code() {
        for error in [
            TenantError::Invalid,
            TenantError::Required,
            TenantError::Unauthenticated,
            TenantError::Mismatch {
                proven: "a".into(),
                claimed: "b".into(),
            },
            TenantError::NotMapped,
        ] {
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("{}: ", error.code())),
                "{message}"
            );
            assert!(codes::ALL.contains(&error.code()));
        }
    }
}
