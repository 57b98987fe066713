//! From an operator's [`RuleSpec`] to a rule: every check and every parse
//! of a configured value happens here, once, when the rule set is built, so
//! a mistake stops the service at start-up with the rule's name and
//! classification itself never parses.

use std::borrow::Cow;

use super::Rule;
use super::conditions::{Conditions, StatusSet};
use super::failure::{NetworkFailure, Reach, Safety};
use super::grpc;
use super::spec::{MAX_NAME_BYTES, RuleError, RuleSpec, Selector, SelectorItem};
use crate::budget::action::ErrorClass;

impl RuleSpec {
    /// Checks the spec and turns it into a rule; `index` is 1-based.
    pub(super) fn compile(self, index: usize) -> Result<Rule, RuleError> {
        let Self {
            name,
            class,
            http_status,
            grpc_code,
            network,
            safety,
            reached,
            tenant,
        } = self;
        if name.is_empty() {
            return Err(RuleError::EmptyName { index });
        }
        let snake = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !snake || name.len() > MAX_NAME_BYTES {
            return Err(RuleError::InvalidName { name });
        }
        let check = Checker { name: &name };
        let class = class.parse::<ErrorClass>().map_err(|_| {
            check.bad(
                "class",
                &SelectorItem::Text(class.clone()),
                "transient, permanent or unknown",
            )
        })?;
        let mut when = Conditions::ANY;
        if let Some(selector) = http_status {
            let mut set = StatusSet::EMPTY;
            for item in check.items("http_status", &selector)? {
                let (lo, hi) = parse_statuses(item).ok_or_else(|| {
                    check.bad(
                        "http_status",
                        item,
                        "a status 100-599, a range like \"500-599\" or a class like \"5xx\"",
                    )
                })?;
                set = set.with(lo, hi);
            }
            when.http = Some(set);
        }
        if let Some(selector) = grpc_code {
            let mut mask = 0u32;
            for item in check.items("grpc_code", &selector)? {
                let code = parse_grpc_code(item).ok_or_else(|| {
                    check.bad(
                        "grpc_code",
                        item,
                        "a google.rpc.Code name like \"UNAVAILABLE\" or a number 0-16",
                    )
                })?;
                mask |= 1 << code;
            }
            when.grpc = Some(mask);
        }
        if let Some(selector) = network {
            let mut mask = 0u16;
            for item in check.items("network", &selector)? {
                let kind = by_name(item, &NetworkFailure::ALL, |n| n.as_str()).ok_or_else(|| {
                    check.bad(
                        "network",
                        item,
                        "dns, connection_refused, connect_timeout, tls, connection_reset, connection_closed, timeout or other",
                    )
                })?;
                mask |= kind.bit();
            }
            when.network = Some(mask);
        }
        if let Some(selector) = safety {
            let mut mask = 0u8;
            for item in check.items("safety", &selector)? {
                let value = by_name(item, &Safety::ALL, |s| s.as_str()).ok_or_else(|| {
                    check.bad(
                        "safety",
                        item,
                        "unspecified, read_only, idempotent or non_idempotent",
                    )
                })?;
                mask |= value.bit();
            }
            when.safety = Some(mask);
        }
        if let Some(selector) = reached {
            let mut mask = 0u8;
            for item in check.items("reached", &selector)? {
                let value = by_name(item, &Reach::ALL, |r| r.as_str()).ok_or_else(|| {
                    check.bad("reached", item, "unknown, not_sent or may_have_reached")
                })?;
                mask |= value.bit();
            }
            when.reach = Some(mask);
        }
        let mut tenants = Vec::new();
        if let Some(selector) = tenant {
            for item in check.items("tenant", &selector)? {
                match item {
                    SelectorItem::Text(t) if !t.is_empty() => tenants.push(t.clone()),
                    _ => return Err(check.bad("tenant", item, "a non-empty tenant name")),
                }
            }
        }
        if when.is_empty() && tenants.is_empty() {
            return Err(RuleError::EmptyMatch { name });
        }
        Ok(Rule {
            name: Cow::Owned(name),
            class,
            when,
            tenants,
        })
    }
}

/// Builds errors that name the rule.
struct Checker<'a> {
    name: &'a str,
}

impl Checker<'_> {
    fn items<'s>(
        &self,
        field: &'static str,
        selector: &'s Selector,
    ) -> Result<&'s [SelectorItem], RuleError> {
        if selector.0.is_empty() {
            return Err(RuleError::EmptyList {
                name: self.name.to_owned(),
                field,
            });
        }
        Ok(&selector.0)
    }

    fn bad(&self, field: &'static str, item: &SelectorItem, expected: &'static str) -> RuleError {
        RuleError::BadValue {
            name: self.name.to_owned(),
            field,
            value: item.to_string(),
            expected,
        }
    }
}

/// `503`, `"503"`, `"500-599"` or `"5xx"` as an inclusive range within
/// 100-599.
fn parse_statuses(item: &SelectorItem) -> Option<(u16, u16)> {
    let valid = |s: u16| (100..=599).contains(&s).then_some(s);
    let status = |text: &str| text.trim().parse::<u16>().ok().and_then(valid);
    match item {
        SelectorItem::Number(n) => u16::try_from(*n).ok().and_then(valid).map(|s| (s, s)),
        SelectorItem::Text(text) => {
            let text = text.trim();
            if let [digit @ b'1'..=b'5', x, y] = text.as_bytes()
                && x.eq_ignore_ascii_case(&b'x')
                && y.eq_ignore_ascii_case(&b'x')
            {
                let lo = u16::from(digit - b'0') * 100;
                return Some((lo, lo + 99));
            }
            match text.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (status(lo)?, status(hi)?);
                    (lo <= hi).then_some((lo, hi))
                }
                None => status(text).map(|s| (s, s)),
            }
        }
    }
}

/// A `google.rpc.Code` by number or name (any case).
fn parse_grpc_code(item: &SelectorItem) -> Option<u8> {
    let number = match item {
        SelectorItem::Number(n) => *n,
        SelectorItem::Text(text) => {
            let text = text.trim();
            match grpc::NAMES
                .iter()
                .position(|name| name.eq_ignore_ascii_case(text))
            {
                Some(index) => return u8::try_from(index).ok(),
                None => text.parse().ok()?,
            }
        }
    };
    u8::try_from(number).ok().filter(|c| *c <= grpc::MAX)
}

/// The value whose name is the item's text (any case).
fn by_name<T: Copy>(item: &SelectorItem, all: &[T], name: impl Fn(T) -> &'static str) -> Option<T> {
    match item {
        SelectorItem::Text(text) => all
            .iter()
            .copied()
            .find(|value| name(*value).eq_ignore_ascii_case(text.trim())),
        SelectorItem::Number(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{Build, g};
    use super::super::{HTTP_429_TRANSIENT, RuleSet};
    use super::*;
    use NetworkFailure as N;

    fn spec(name: &str) -> RuleSpec {
        RuleSpec {
            name: name.to_owned(),
            class: "transient".to_owned(),
            http_status: None,
            grpc_code: None,
            network: None,
            safety: None,
            reached: None,
            tenant: None,
        }
    }

    fn text(values: &[&str]) -> Option<Selector> {
        Some(Selector(
            values
                .iter()
                .map(|v| SelectorItem::Text((*v).to_owned()))
                .collect(),
        ))
    }

    #[test]
    fn status_forms_are_read_as_ranges() {
        let cases: [(SelectorItem, Option<(u16, u16)>); 12] = [
            (SelectorItem::Number(503), Some((503, 503))),
            (SelectorItem::Text("503".into()), Some((503, 503))),
            (SelectorItem::Text(" 500 - 599 ".into()), Some((500, 599))),
            (SelectorItem::Text("4xx".into()), Some((400, 499))),
            (SelectorItem::Text("5XX".into()), Some((500, 599))),
            (SelectorItem::Text("6xx".into()), None),
            (SelectorItem::Text("599-500".into()), None),
            (SelectorItem::Text("500-600".into()), None),
            (SelectorItem::Text("50-99".into()), None),
            (SelectorItem::Text("5-".into()), None),
            (SelectorItem::Number(70_000), None),
            (SelectorItem::Number(-1), None),
        ];
        for (item, want) in cases {
            assert_eq!(parse_statuses(&item), want, "{item}");
        }
    }

    #[test]
    fn invalid_overrides_are_refused_naming_the_rule() {
        let cases: Vec<(Vec<RuleSpec>, &str)> = vec![
            (vec![spec("")], "classification rule #1: the name is empty"),
            (
                vec![RuleSpec {
                    http_status: text(&["500"]),
                    ..spec("Bad-Name")
                }],
                "classification rule \"Bad-Name\": the name must be",
            ),
            (
                vec![
                    RuleSpec {
                        http_status: text(&["500"]),
                        ..spec("twice")
                    },
                    RuleSpec {
                        http_status: text(&["502"]),
                        ..spec("twice")
                    },
                ],
                "classification rule \"twice\": the name is used by an earlier rule",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["429"]),
                    ..spec(HTTP_429_TRANSIENT)
                }],
                "classification rule \"http_429_transient\": the name belongs to a default rule",
            ),
            (
                vec![spec("catch_all")],
                "classification rule \"catch_all\": no condition",
            ),
            (
                vec![RuleSpec {
                    http_status: Some(Selector::default()),
                    ..spec("none")
                }],
                "classification rule \"none\": http_status is an empty list",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["600-699"]),
                    ..spec("range")
                }],
                "classification rule \"range\": http_status \"600-699\" is not a status 100-599",
            ),
            (
                vec![RuleSpec {
                    grpc_code: text(&["UNAVAIL"]),
                    ..spec("code")
                }],
                "classification rule \"code\": grpc_code \"UNAVAIL\" is not a google.rpc.Code",
            ),
            (
                vec![RuleSpec {
                    grpc_code: Some(Selector(vec![SelectorItem::Number(17)])),
                    ..spec("code")
                }],
                "classification rule \"code\": grpc_code 17 is not",
            ),
            (
                vec![RuleSpec {
                    network: text(&["refused"]),
                    ..spec("kind")
                }],
                "classification rule \"kind\": network \"refused\" is not dns,",
            ),
            (
                vec![RuleSpec {
                    safety: text(&["safe"]),
                    ..spec("safety")
                }],
                "classification rule \"safety\": safety \"safe\" is not",
            ),
            (
                vec![RuleSpec {
                    reached: text(&["sent"]),
                    ..spec("reach")
                }],
                "classification rule \"reach\": reached \"sent\" is not",
            ),
            (
                vec![RuleSpec {
                    tenant: text(&[""]),
                    ..spec("tenant")
                }],
                "classification rule \"tenant\": tenant \"\" is not a non-empty tenant name",
            ),
            (
                vec![RuleSpec {
                    http_status: text(&["500"]),
                    class: "retry".into(),
                    ..spec("class")
                }],
                "classification rule \"class\": class \"retry\" is not transient, permanent or unknown",
            ),
        ];
        for (specs, message) in cases {
            let err = RuleSet::new(specs).expect_err(message);
            assert!(err.to_string().starts_with(message), "{err}");
        }
    }

    #[test]
    fn names_of_codes_and_kinds_are_case_insensitive() {
        let rules = RuleSet::new(vec![RuleSpec {
            grpc_code: text(&["unavailable", "14", "Internal"]),
            network: text(&["Connection_Reset"]),
            ..spec("mixed_case")
        }])
        .expect("valid");
        let failure = g(13).n(N::ConnectionReset);
        assert_eq!(rules.classify(&failure).rule, "mixed_case");
    }
}
