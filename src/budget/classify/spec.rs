//! An operator's rule as written in the configuration file
//! (`[[classification.rules]]`): [`RuleSpec`], its [`Selector`] values, how
//! they are read from TOML (one value or a list), and the [`RuleError`] a
//! rule that cannot be used is refused with. Nothing here is checked: that
//! happens once, when the rule set is built, so every mistake is reported
//! with the rule's name.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};

/// One operator rule from the configuration file
/// (`[[classification.rules]]`). Every condition that is given must hold;
/// a list matches any of its items. See `docs/classification.md`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The stable snake_case name returned with every decision the rule
    /// makes; unique, and not a default rule's name.
    pub name: String,
    /// The class given: `transient`, `permanent` or `unknown`.
    pub class: String,
    /// HTTP statuses: `503`, `"500-599"`, `"5xx"`, or a list of them.
    pub http_status: Option<Selector>,
    /// gRPC codes by name (`"UNAVAILABLE"`) or number (`14`), or a list.
    pub grpc_code: Option<Selector>,
    /// Network failures by name (`"connection_reset"`), or a list.
    pub network: Option<Selector>,
    /// Safeties by name (`"non_idempotent"`), or a list.
    pub safety: Option<Selector>,
    /// Effective reaches by name (`"not_sent"`), or a list.
    pub reached: Option<Selector>,
    /// Tenants the rule is limited to, or a list.
    pub tenant: Option<Selector>,
}

/// A rule's condition values as written: one value or a list. Checked by
/// [`RuleSet::new`](super::RuleSet::new), so a mistake is reported with the
/// rule's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(pub Vec<SelectorItem>);

/// One value of a [`Selector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectorItem {
    /// A number: a status or a gRPC code.
    Number(i64),
    /// A string: a range, a name or a tenant.
    Text(String),
}

impl fmt::Display for SelectorItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

/// A configured rule that cannot be used. The service refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A rule without a name.
    #[error("classification rule #{index}: the name is empty")]
    EmptyName {
        /// The rule's 1-based position among the overrides.
        index: usize,
    },
    /// A name that is not snake_case or is too long.
    #[error(
        "classification rule {name:?}: the name must be 1 to {MAX_NAME_BYTES} bytes of a-z, 0-9 and _, starting with a letter"
    )]
    InvalidName {
        /// The name as configured.
        name: String,
    },
    /// Two overrides with one name.
    #[error("classification rule {name:?}: the name is used by an earlier rule")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// An override named like a default rule.
    #[error("classification rule {name:?}: the name belongs to a default rule")]
    ReservedName {
        /// The name.
        name: String,
    },
    /// A rule without conditions, which would classify every failure.
    #[error(
        "classification rule {name:?}: no condition; set at least one of http_status, grpc_code, network, safety, reached, tenant"
    )]
    EmptyMatch {
        /// The rule.
        name: String,
    },
    /// A condition given as an empty list, which matches nothing.
    #[error("classification rule {name:?}: {field} is an empty list, which matches nothing")]
    EmptyList {
        /// The rule.
        name: String,
        /// The condition.
        field: &'static str,
    },
    /// A value the condition does not know.
    #[error("classification rule {name:?}: {field} {value} is not {expected}")]
    BadValue {
        /// The rule.
        name: String,
        /// The condition (or `class`).
        field: &'static str,
        /// The value as configured.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
}

/// The longest rule name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SelectorVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for SelectorItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ItemVisitor)
    }
}

/// Reads one number or string.
struct ItemVisitor;

impl Visitor<'_> for ItemVisitor {
    type Value = SelectorItem;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or a string")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(SelectorItem::Number(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i64::try_from(v)
            .map(SelectorItem::Number)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(SelectorItem::Text(v.to_owned()))
    }
}

/// Reads one value or a list of them.
struct SelectorVisitor;

impl<'de> Visitor<'de> for SelectorVisitor {
    type Value = Selector;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, a string, or a list of them")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        ItemVisitor.visit_i64(v).map(|item| Selector(vec![item]))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        ItemVisitor.visit_u64(v).map(|item| Selector(vec![item]))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        ItemVisitor.visit_str(v).map(|item| Selector(vec![item]))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element::<SelectorItem>()? {
            items.push(item);
        }
        Ok(Selector(items))
    }
}

#[cfg(test)]
mod tests {
    use super::super::RuleSet;
    use super::super::fixtures::{Config, h};
    use super::*;

    #[test]
    fn rules_may_be_written_inline() {
        let config: Config = toml::from_str(
            "[classification]\nrules = [{ name = \"x\", http_status = \"4xx\", class = \"unknown\" }]",
        )
        .expect("inline form");
        let rules = RuleSet::new(config.classification.rules).expect("valid");
        assert_eq!(rules.classify(&h(404)).rule, "x");
    }

    #[test]
    fn selectors_read_one_value_or_a_list() {
        let read = |toml: &str| toml::from_str::<RuleSpec>(toml);
        let one = read("name = \"a\"\nclass = \"unknown\"\nhttp_status = 502").expect("number");
        assert_eq!(
            one.http_status,
            Some(Selector(vec![SelectorItem::Number(502)]))
        );
        let many =
            read("name = \"a\"\nclass = \"unknown\"\ngrpc_code = [\"ABORTED\", 4]").expect("list");
        assert_eq!(
            many.grpc_code,
            Some(Selector(vec![
                SelectorItem::Text("ABORTED".into()),
                SelectorItem::Number(4)
            ]))
        );
        assert!(read("name = \"a\"\nclass = \"unknown\"\nhttp_status = true").is_err());
        let typo =
            read("name = \"a\"\nclass = \"unknown\"\nhttp = 502").expect_err("unknown field");
        assert!(typo.to_string().contains("unknown field `http`"), "{typo}");
    }
}
