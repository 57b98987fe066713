//! API keys: the file of `tenant:sha256-hex-of-key` lines the server checks
//! bearer keys against, and the keys `retry-budget keys add` makes.
//!
//! The server keeps digests, never keys: a copy of the file, a backup or a
//! log line of it gives nobody a key. A presented key is hashed and
//! compared with every digest in constant time (`subtle`), so the time an
//! answer takes says nothing about how close a guess came. Several keys of
//! one tenant may be listed at once, which is how a key is rotated: add
//! the new one, move the clients, remove the old one, SIGHUP between steps.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::budget::tenant;
use crate::setting::ConfigError;

/// What every key `retry-budget keys add` makes starts with, so that a key
/// leaked into a repository or a log is recognised by secret scanners and
/// by people.
pub const API_KEY_PREFIX: &str = "rb_";

/// Random bytes in a key: 256 bits, beyond any guessing.
const KEY_BYTES: usize = 32;

/// The keys a server accepts, as digests, each with its tenant.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    entries: Vec<KeyEntry>,
}

/// One line of the keys file.
#[derive(Debug, Clone)]
struct KeyEntry {
    /// Whose key it is; shared by the tenant's lines and by every request
    /// the key authenticates (no copy per request).
    tenant: Arc<str>,
    /// SHA-256 of the key.
    digest: [u8; 32],
    /// Its line in the file, for `keys list`.
    line: usize,
}

/// The keys file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeysFileError {
    /// It cannot be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A line is not `tenant:sha256-hex`.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
}

impl KeysFileError {
    /// The configuration error a bad keys file at `path` is.
    pub fn into_config_error(self, path: &Path) -> ConfigError {
        match self {
            Self::Io(source) => ConfigError::Unreadable {
                path: path.to_owned(),
                source,
            },
            Self::Line { .. } => ConfigError::Invalid {
                path: path.to_owned(),
                message: self.to_string(),
            },
        }
    }
}

impl KeySet {
    /// The keys of the file at `path`.
    ///
    /// # Errors
    /// [`KeysFileError`] when it cannot be read or a line is bad.
    pub fn load(path: &Path) -> Result<Self, KeysFileError> {
        Self::parse(&std::fs::read_to_string(path)?)
    }

    /// The keys of a file's text: one `tenant:sha256-hex-of-key` a line;
    /// `#` starts a comment line; blank lines are skipped.
    ///
    /// # Errors
    /// [`KeysFileError::Line`] naming the first bad line: not
    /// `tenant:digest`, a tenant that is not a tenant id, a digest that is
    /// not 64 hex digits, or a digest already listed (one key, one tenant).
    pub fn parse(text: &str) -> Result<Self, KeysFileError> {
        let mut entries: Vec<KeyEntry> = Vec::new();
        let mut tenants: HashMap<&str, Arc<str>> = HashMap::new();
        let mut seen: HashMap<[u8; 32], usize> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let bad = |message: String| KeysFileError::Line { line, message };
            let (name, hex) = content
                .rsplit_once(':')
                .ok_or_else(|| bad("expected tenant:sha256-hex-of-key".to_owned()))?;
            tenant::validate(name).map_err(|_| {
                bad(format!(
                    "{name:?} is not a tenant id (1 to 128 printable ASCII characters)"
                ))
            })?;
            let digest = decode_digest(hex)
                .ok_or_else(|| bad("the digest must be 64 hex digits (SHA-256)".to_owned()))?;
            if let Some(first) = seen.insert(digest, line) {
                return Err(bad(format!("the same digest is already on line {first}")));
            }
            let tenant = tenants.entry(name).or_insert_with(|| Arc::from(name));
            entries.push(KeyEntry {
                tenant: Arc::clone(tenant),
                digest,
                line,
            });
        }
        Ok(Self { entries })
    }

    /// The tenant whose key `key` is, if any. Every digest is compared, in
    /// constant time, whether or not one matched before.
    pub fn tenant(&self, key: &[u8]) -> Option<&Arc<str>> {
        let digest: [u8; 32] = Sha256::digest(key).into();
        // No branch on a comparison: the index is selected in constant
        // time, and only the final (found or not) answer branches.
        let mut found = u64::MAX;
        for (index, entry) in (0u64..).zip(&self.entries) {
            found.conditional_assign(&index, entry.digest.ct_eq(&digest));
        }
        usize::try_from(found)
            .ok()
            .and_then(|index| self.entries.get(index))
            .map(|entry| &entry.tenant)
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none (every request is then refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many tenants have a key.
    pub fn tenant_count(&self) -> usize {
        let mut names: Vec<&str> = self.entries.iter().map(|e| &*e.tenant).collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    }

    /// Each key's line, tenant and the first 8 hex digits of its digest:
    /// enough to tell keys apart, never a key.
    pub fn listing(&self) -> Vec<(usize, &str, String)> {
        self.entries
            .iter()
            .map(|e| (e.line, &*e.tenant, hex(&e.digest[..4])))
            .collect()
    }
}

/// The SHA-256 of `key` in lowercase hex: what the keys file holds.
pub fn key_digest(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

/// A new key from the operating system's random source:
/// [`API_KEY_PREFIX`] and 32 random bytes in base64url.
///
/// # Errors
/// The OS's error when it has no random source.
pub fn new_api_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::fill(&mut bytes)?;
    let mut key = String::from(API_KEY_PREFIX);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(bytes, &mut key);
    Ok(key)
}

/// Appends `tenant`'s new key's digest to the keys file at `path`, creating
/// it readable by its owner only when absent. The file is checked first,
/// so a key is never appended to a file the server would refuse.
///
/// # Errors
/// [`KeysFileError`]: the file cannot be read or written, has a bad line,
/// or `tenant` is not a tenant id.
pub fn append_key(path: &Path, tenant: &str, key: &str) -> Result<(), KeysFileError> {
    tenant::validate(tenant).map_err(|_| KeysFileError::Line {
        line: 0,
        message: format!("{tenant:?} is not a tenant id (1 to 128 printable ASCII characters)"),
    })?;
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error.into()),
    };
    KeySet::parse(&existing)?;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    let separator = if existing.is_empty() || existing.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    // One write: a server reading the file meanwhile sees the line whole
    // or not at all.
    file.write_all(format!("{separator}{tenant}:{}\n", key_digest(key)).as_bytes())?;
    file.sync_all()?;
    Ok(())
}

fn decode_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (out, pair) in digest.iter_mut().zip(bytes.chunks_exact(2)) {
        let high = char::from(pair[0]).to_digit(16)?;
        let low = char::from(pair[1]).to_digit(16)?;
        *out = u8::try_from(high << 4 | low).ok()?;
    }
    Some(digest)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_their_own_tenant_only() {
        let a1 = new_api_key().unwrap();
        let a2 = new_api_key().unwrap();
        let b = new_api_key().unwrap();
        assert!(a1.starts_with(API_KEY_PREFIX) && a1.len() == 3 + 43, "{a1}");
        assert_ne!(a1, a2);
        let text = format!(
            "# rotated 2026-01\n\nacme:{}\n  acme:{}  \nglobex:{}\n",
            key_digest(&a1),
            key_digest(&a2).to_uppercase(),
            key_digest(&b)
        );
        let keys = KeySet::parse(&text).unwrap();
        assert_eq!((keys.len(), keys.tenant_count()), (3, 2));
        assert_eq!(keys.tenant(a1.as_bytes()).map(|t| &**t), Some("acme"));
        assert_eq!(keys.tenant(a2.as_bytes()).map(|t| &**t), Some("acme"));
        assert_eq!(keys.tenant(b.as_bytes()).map(|t| &**t), Some("globex"));
        assert!(keys.tenant(b"rb_guess").is_none());
        assert!(
            keys.tenant(key_digest(&a1).as_bytes()).is_none(),
            "the digest is not a key"
        );
        let listing = keys.listing();
        assert_eq!(listing[0].0, 3);
        assert_eq!(listing[0].2, key_digest(&a1)[..8]);
    }

    #[test]
    fn a_bad_line_is_named() {
        let good = key_digest("k");
        for (text, line, what) in [
            ("acme\n".to_owned(), 1, "tenant:sha256"),
            (format!("# c\nac me:{good}\n"), 2, "not a tenant id"),
            ("acme:abc\n".to_owned(), 1, "64 hex"),
            (format!("acme:{}zz\n", &good[..62]), 1, "64 hex"),
            (format!("a:{good}\n\nb:{good}\n"), 3, "line 1"),
        ] {
            match KeySet::parse(&text) {
                Err(KeysFileError::Line { line: l, message }) => {
                    assert_eq!(l, line, "{text}: {message}");
                    assert!(message.contains(what), "{text}: {message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn appending_creates_a_private_file_and_keeps_it_valid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        append_key(&path, "acme", "rb_one").unwrap();
        std::fs::write(&path, std::fs::read_to_string(&path).unwrap().trim_end()).unwrap();
        append_key(&path, "globex", "rb_two").unwrap();
        let keys = KeySet::load(&path).unwrap();
        assert_eq!(keys.tenant(b"rb_one").map(|t| &**t), Some("acme"));
        assert_eq!(keys.tenant(b"rb_two").map(|t| &**t), Some("globex"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(append_key(&path, "a b", "rb_three").is_err());
        std::fs::write(&path, "garbage\n").unwrap();
        assert!(matches!(
            append_key(&path, "acme", "rb_four"),
            Err(KeysFileError::Line { line: 1, .. })
        ));
    }
}
