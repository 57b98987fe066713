//! Identities a service mesh proves, and the pattern that maps them to
//! tenants.
//!
//! # The pattern
//! `auth.identity_pattern` is the identity with the tenant's place marked
//! `{tenant}` and any other varying part `*`, e.g.
//! `spiffe://cluster.local/ns/{tenant}/sa/*` (Istio: the tenant is the
//! caller's namespace) or `*.{tenant}.serviceaccount.identity.linkerd.cluster.local`
//! (Linkerd's identity names). The rest is compared literally.
//! A placeholder matches one or more characters up to the first occurrence
//! of the character that follows it in the pattern (to the end when it is
//! last), and never a `/`: so `{tenant}` is one path segment or one DNS
//! label, never more, and a caller cannot put a `/` in its tenant to
//! borrow another's. The tenant matched must be a valid tenant id. No
//! regular expression: nothing to get subtly wrong, and matching is one
//! pass without backtracking.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::budget::tenant;

/// A compiled `auth.identity_pattern`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityPattern {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Compared as is.
    Literal(String),
    /// The tenant id.
    Tenant,
    /// Anything, within the placeholders' bounds.
    Any,
}

/// An `auth.identity_pattern` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// `{tenant}` appears not exactly once.
    #[error("must contain {{tenant}} exactly once")]
    TenantPlaceholder,
    /// Two placeholders touch: where one ends would be a guess.
    #[error("two placeholders ({{tenant}}, *) must be separated by a literal character")]
    Adjacent,
    /// A brace that does not open `{tenant}`.
    #[error("a brace other than in {{tenant}}")]
    Brace,
}

impl IdentityPattern {
    /// Compiles `text`.
    ///
    /// # Errors
    /// [`PatternError`].
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let placeholder = if let Some(after) = rest.strip_prefix("{tenant}") {
                rest = after;
                Part::Tenant
            } else if c == '*' {
                rest = &rest[1..];
                Part::Any
            } else if c == '{' || c == '}' {
                return Err(PatternError::Brace);
            } else {
                literal.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            } else if matches!(parts.last(), Some(Part::Tenant | Part::Any)) {
                return Err(PatternError::Adjacent);
            }
            parts.push(placeholder);
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if parts.iter().filter(|p| **p == Part::Tenant).count() != 1 {
            return Err(PatternError::TenantPlaceholder);
        }
        Ok(Self { parts })
    }

    /// The tenant `identity` names, if it matches the pattern and the
    /// matched part is a tenant id.
    pub fn tenant<'a>(&self, identity: &'a str) -> Option<&'a str> {
        let mut rest = identity;
        let mut found = None;
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(text) => rest = rest.strip_prefix(text.as_str())?,
                Part::Tenant | Part::Any => {
                    // Up to the next literal's first character, never
                    // across a '/'.
                    let end = match self.parts.get(i + 1) {
                        Some(Part::Literal(next)) => {
                            let stop = next.chars().next()?;
                            rest.find(stop)?
                        }
                        _ => rest.len(),
                    };
                    let matched = &rest[..end];
                    if matched.is_empty() || matched.contains('/') {
                        return None;
                    }
                    if *part == Part::Tenant {
                        found = Some(matched);
                    }
                    rest = &rest[end..];
                }
            }
        }
        let tenant = found.filter(|_| rest.is_empty())?;
        tenant::validate(tenant).ok().map(|()| tenant)
    }
}

/// The SPIFFE ID of a certificate (DER): its one `spiffe://` URI SAN.
/// `None` for a certificate that cannot be parsed, has none, or has several
/// (an X.509 SVID has exactly one).
pub fn spiffe_id(der: &[u8]) -> Option<String> {
    let (_, certificate) = X509Certificate::from_der(der).ok()?;
    let names = certificate.subject_alternative_name().ok()??;
    let mut ids = names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some(*uri),
            _ => None,
        });
    let id = ids.next()?;
    ids.next().is_none().then(|| id.to_owned())
}

/// The client's URI (its SPIFFE ID) in an Envoy `x-forwarded-client-cert`
/// value, as Istio's sidecars set it: the `URI=` of the last element, the
/// one the sidecar added for the connection it verified (elements before
/// it came from further away, and are whatever the caller sent). `None`
/// when that element has no URI, or several, or when a quote is left open:
/// a caller's value ending inside quotes would otherwise swallow the
/// sidecar's element into its own.
pub fn xfcc_uri(value: &str) -> Option<&str> {
    let element = split_outside_quotes(value, ',')?.last()?;
    let mut uris = split_outside_quotes(element, ';')?.filter_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        key.trim().eq_ignore_ascii_case("uri").then(|| {
            let value = value.trim();
            value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value)
        })
    });
    let uri = uris.next()?;
    (uris.next().is_none() && !uri.is_empty()).then_some(uri)
}

/// `text` split at each `separator` outside double quotes (Envoy quotes
/// values that hold `,`, `;` or `=`, such as a certificate's subject);
/// `None` when a quote is not closed.
fn split_outside_quotes(text: &str, separator: char) -> Option<impl Iterator<Item = &str>> {
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    let mut pieces = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&text[start..]);
    (!quoted).then(|| pieces.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> IdentityPattern {
        IdentityPattern::parse(text).unwrap()
    }

    #[test]
    fn istio_identities_map_by_namespace() {
        let p = pattern("spiffe://cluster.local/ns/{tenant}/sa/*");
        assert_eq!(
            p.tenant("spiffe://cluster.local/ns/acme/sa/worker"),
            Some("acme")
        );
        assert_eq!(
            p.tenant("spiffe://cluster.local/ns/acme/sa/my.worker"),
            Some("acme")
        );
        for other in [
            "spiffe://cluster.local/ns/acme/sa/",
            "spiffe://cluster.local/ns/acme/sa/worker/extra",
            "spiffe://cluster.local/ns//sa/worker",
            "spiffe://evil.org/ns/acme/sa/worker",
            "spiffe://cluster.local/ns/acme",
            "spiffe://cluster.local.evil/ns/acme/sa/worker",
            "xspiffe://cluster.local/ns/acme/sa/worker",
        ] {
            assert_eq!(p.tenant(other), None, "{other}");
        }
    }

    #[test]
    fn linkerd_identities_map_by_label() {
        let p = pattern("*.{tenant}.serviceaccount.identity.linkerd.cluster.local");
        assert_eq!(
            p.tenant("worker.acme.serviceaccount.identity.linkerd.cluster.local"),
            Some("acme")
        );
        assert_eq!(
            p.tenant("worker.acme.serviceaccount.identity.linkerd.cluster.local.evil"),
            None
        );
        assert_eq!(
            p.tenant(".acme.serviceaccount.identity.linkerd.cluster.local"),
            None
        );
    }

    #[test]
    fn a_tenant_at_the_end_is_one_segment_and_a_valid_id() {
        let p = pattern("spiffe://example.org/tenant/{tenant}");
        assert_eq!(p.tenant("spiffe://example.org/tenant/acme"), Some("acme"));
        assert_eq!(p.tenant("spiffe://example.org/tenant/acme/x"), None);
        assert_eq!(p.tenant("spiffe://example.org/tenant/a%20b"), Some("a%20b"));
        assert_eq!(p.tenant("spiffe://example.org/tenant/a b"), None);
        let long = format!("spiffe://example.org/tenant/{}", "a".repeat(129));
        assert_eq!(p.tenant(&long), None);
    }

    #[test]
    fn malformed_patterns_are_refused() {
        assert_eq!(
            IdentityPattern::parse("spiffe://td/ns/*"),
            Err(PatternError::TenantPlaceholder)
        );
        assert_eq!(
            IdentityPattern::parse("{tenant}/{tenant}"),
            Err(PatternError::TenantPlaceholder)
        );
        assert_eq!(
            IdentityPattern::parse("ns/{tenant}*"),
            Err(PatternError::Adjacent)
        );
        assert_eq!(
            IdentityPattern::parse("ns/{tenants}"),
            Err(PatternError::Brace)
        );
    }

    #[test]
    fn the_last_xfcc_element_is_the_verified_client() {
        let istio = "By=spiffe://cluster.local/ns/rb/sa/retry-budget;\
                     Hash=abc;Subject=\"\";URI=spiffe://cluster.local/ns/acme/sa/worker";
        assert_eq!(
            xfcc_uri(istio),
            Some("spiffe://cluster.local/ns/acme/sa/worker")
        );
        let forwarded = "URI=spiffe://cluster.local/ns/forged/sa/x,\
                         By=spiffe://b;Subject=\"CN=a,O=b;c\";URI=\"spiffe://cluster.local/ns/acme/sa/w\"";
        assert_eq!(
            xfcc_uri(forwarded),
            Some("spiffe://cluster.local/ns/acme/sa/w")
        );
        assert_eq!(xfcc_uri("By=spiffe://b;Hash=abc"), None);
        assert_eq!(xfcc_uri("URI=spiffe://a;URI=spiffe://b"), None);
        assert_eq!(xfcc_uri(""), None);
    }

    #[test]
    fn a_callers_open_quote_cannot_swallow_the_sidecars_element() {
        // The caller sent the part before the comma; the sidecar appended
        // the rest (quotes in pairs).
        for caller in [
            "URI=spiffe://cluster.local/ns/victim/sa/x;Subject=\"",
            "URI=spiffe://cluster.local/ns/victim/sa/x;Subject=\"\\",
        ] {
            let value = format!(
                "{caller},By=spiffe://cluster.local/ns/rb/sa/rb;Subject=\"\";\
                 URI=spiffe://cluster.local/ns/attacker/sa/w"
            );
            assert_eq!(xfcc_uri(&value), None, "{value}");
        }
    }

    #[test]
    fn a_certificate_names_its_one_spiffe_id() {
        let cert = |uris: &[&str]| {
            let mut params =
                rcgen::CertificateParams::new(vec!["worker.local".to_owned()]).unwrap();
            for uri in uris {
                params
                    .subject_alt_names
                    .push(rcgen::SanType::URI((*uri).try_into().unwrap()));
            }
            let key = rcgen::KeyPair::generate().unwrap();
            params.self_signed(&key).unwrap().der().to_vec()
        };
        assert_eq!(
            spiffe_id(&cert(&["spiffe://cluster.local/ns/acme/sa/worker"])).as_deref(),
            Some("spiffe://cluster.local/ns/acme/sa/worker")
        );
        assert_eq!(
            spiffe_id(&cert(&["https://example.org/", "spiffe://td/ns/a/sa/b"])).as_deref(),
            Some("spiffe://td/ns/a/sa/b")
        );
        assert_eq!(spiffe_id(&cert(&[])), None);
        assert_eq!(spiffe_id(&cert(&["spiffe://td/a", "spiffe://td/b"])), None);
        assert_eq!(spiffe_id(b"not a certificate"), None);
    }
}
