//! Who asks: the tenant a request names, read the same way by the token
//! layer (which charges its share) and by the gRPC edge (which keys its
//! activities), through the one parser here.

use super::error::BudgetError;

/// The request header that names the tenant.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// The longest tenant id, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;
/// The tenant of requests that name none.
pub const DEFAULT_TENANT: &str = "default";

/// The tenant named by the raw value of the [`TENANT_HEADER`] header: an
/// absent or empty one is [`DEFAULT_TENANT`].
///
/// # Errors
/// [`BudgetError::InvalidTenant`] for a value that is not 1 to
/// [`MAX_TENANT_BYTES`] printable ASCII characters.
pub fn parse(header: Option<&[u8]>) -> Result<&str, BudgetError> {
    match header {
        None | Some(b"") => Ok(DEFAULT_TENANT),
        Some(bytes) => {
            let tenant = std::str::from_utf8(bytes).map_err(|_| BudgetError::InvalidTenant)?;
            validate(tenant)?;
            Ok(tenant)
        }
    }
}

/// Checks a tenant id: 1 to [`MAX_TENANT_BYTES`] printable ASCII characters.
///
/// # Errors
/// [`BudgetError::InvalidTenant`].
pub fn validate(tenant: &str) -> Result<(), BudgetError> {
    let printable = tenant.bytes().all(|b| b.is_ascii_graphic());
    if tenant.is_empty() || tenant.len() > MAX_TENANT_BYTES || !printable {
        return Err(BudgetError::InvalidTenant);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_or_empty_is_the_default_and_garbage_is_refused() {
        assert_eq!(parse(None), Ok(DEFAULT_TENANT));
        assert_eq!(parse(Some(b"")), Ok(DEFAULT_TENANT));
        assert_eq!(parse(Some(b"acme")), Ok("acme"));
        let long = [b'a'; MAX_TENANT_BYTES + 1];
        for bad in [&b"a b"[..], b"\xff", b"caf\xc3\xa9", &long] {
            assert_eq!(parse(Some(bad)), Err(BudgetError::InvalidTenant), "{bad:?}");
        }
    }
}
