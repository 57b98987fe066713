//! The classifier and its operator rules. Rules are drawn from a vocabulary
//! of valid tokens mixed with arbitrary text, so that both accepted and
//! refused rule sets are common. Checks:
//! - `RuleSet::new` refuses or accepts, never panics;
//! - a rule written to TOML and read back is the same rule (the `Selector`
//!   deserializer reads scalars and lists as written);
//! - every failure gets a class and a rule of the set, the same every time.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use retry_budget::budget::classify::{
    Failure, NetworkFailure, Reach, RuleSet, RuleSpec, Safety, Selector, SelectorItem,
};

/// Tokens that make valid rules, and near misses.
const VOCABULARY: &[&str] = &[
    "transient",
    "permanent",
    "unknown",
    "Transient",
    "r1",
    "r2",
    "payments_manual",
    "grpc_unavailable_transient",
    "Bad-Name",
    "",
    "500-599",
    "5xx",
    "4XX",
    "6xx",
    "429",
    " 500 - 503 ",
    "599-500",
    "600",
    "UNAVAILABLE",
    "internal",
    "OK",
    "14",
    "17",
    "connection_reset",
    "tls",
    "dns",
    "timeout",
    "other",
    "read_only",
    "non_idempotent",
    "unspecified",
    "idempotent",
    "not_sent",
    "may_have_reached",
    "acme",
    "payments",
];

#[derive(Arbitrary, Debug)]
enum Text {
    Known(u8),
    Any(String),
}

impl Text {
    fn get(self) -> String {
        match self {
            Self::Known(i) => VOCABULARY[usize::from(i) % VOCABULARY.len()].to_owned(),
            Self::Any(s) => s,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Item {
    Number(i64),
    Text(Text),
}

#[derive(Arbitrary, Debug)]
struct Condition {
    items: Vec<Item>,
    /// Write a one-item list as a scalar.
    scalar: bool,
}

#[derive(Arbitrary, Debug)]
struct Spec {
    name: Text,
    class: Text,
    http_status: Option<Condition>,
    grpc_code: Option<Condition>,
    network: Option<Condition>,
    safety: Option<Condition>,
    reached: Option<Condition>,
    tenant: Option<Condition>,
}

#[derive(Arbitrary, Debug)]
struct Raw {
    http_status: Option<u16>,
    grpc_code: Option<i32>,
    network: Option<u8>,
    safety: u8,
    reached: u8,
    tenant: Text,
}

#[derive(Arbitrary, Debug)]
struct Input {
    specs: Vec<Spec>,
    failures: Vec<Raw>,
}

/// The selector, and its TOML value as an operator would write it.
fn condition(c: Option<Condition>) -> (Option<Selector>, Option<toml::Value>) {
    let Some(c) = c else { return (None, None) };
    let items: Vec<SelectorItem> = c
        .items
        .into_iter()
        .map(|item| match item {
            Item::Number(n) => SelectorItem::Number(n),
            Item::Text(t) => SelectorItem::Text(t.get()),
        })
        .collect();
    let value = |item: &SelectorItem| match item {
        SelectorItem::Number(n) => toml::Value::Integer(*n),
        SelectorItem::Text(t) => toml::Value::String(t.clone()),
    };
    let toml = match items.as_slice() {
        [one] if c.scalar => value(one),
        all => toml::Value::Array(all.iter().map(value).collect()),
    };
    (Some(Selector(items)), Some(toml))
}

fn pick<T: Copy>(all: &[T], index: u8) -> T {
    all[usize::from(index) % all.len()]
}

fuzz_target!(|input: Input| {
    let mut specs = Vec::new();
    for s in input.specs {
        let (name, class) = (s.name.get(), s.class.get());
        let mut table = toml::Table::new();
        table.insert("name".into(), toml::Value::String(name.clone()));
        table.insert("class".into(), toml::Value::String(class.clone()));
        let mut field = |key: &str, c| {
            let (selector, value) = condition(c);
            if let Some(value) = value {
                table.insert(key.into(), value);
            }
            selector
        };
        let spec = RuleSpec {
            http_status: field("http_status", s.http_status),
            grpc_code: field("grpc_code", s.grpc_code),
            network: field("network", s.network),
            safety: field("safety", s.safety),
            reached: field("reached", s.reached),
            tenant: field("tenant", s.tenant),
            name,
            class,
        };
        let text = toml::to_string(&table).expect("a table of strings, integers and arrays");
        let read: RuleSpec = toml::from_str(&text).expect("a rule written as TOML reads back");
        assert_eq!(read, spec, "{text}");
        specs.push(spec);
    }
    let mut sets = vec![RuleSet::default()];
    if let Ok(rules) = RuleSet::new(specs) {
        sets.push(rules);
    }
    for raw in input.failures {
        let tenant = raw.tenant.get();
        let failure = Failure {
            http_status: raw.http_status,
            grpc_code: raw.grpc_code,
            network: raw.network.map(|n| pick(&NetworkFailure::ALL, n)),
            safety: pick(&Safety::ALL, raw.safety),
            reached: pick(&Reach::ALL, raw.reached),
            tenant: &tenant,
        };
        for rules in &sets {
            let got = rules.classify(&failure);
            assert!(rules.rule_names().any(|name| name == got.rule));
            assert_eq!(got, rules.classify(&failure));
        }
    }
});
