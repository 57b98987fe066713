//! [`Demand`]: what a replica publishes in its lease row, the rate of
//! tokens each tenant asked it for over the last interval, and its
//! encoding in the row.
//!
//! # Bounded
//! A row holds at most [`MAX_PUBLISHED_TENANTS`] tenants by name, the ones
//! that asked most; the others are summed into one figure with their count.
//! At 1,000 tenants and the bound of 256 a row is about 10 KB, written once
//! an interval.
//!
//! # Versioned
//! The column is protobuf (`bytea`), its schema the messages below with
//! their field numbers, as the store's records: a replica of a later
//! release reads what an earlier one wrote, and the other way round.
//! Decoding never fails the tick: a row that does not decode counts as no
//! demand (its replica's grant still counts).

use std::time::Duration;

use prost::Message;

use crate::bucket::health::Fates;

/// Most tenants a row names; the rest are summed.
pub const MAX_PUBLISHED_TENANTS: usize = 256;
/// Most tenants a row names for each dependency: with up to
/// `max_dependencies` of them, a row stays tens of KB.
pub const MAX_PUBLISHED_DEPENDENCY_TENANTS: usize = 32;

/// A replica's recent demand, in tokens a second.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Demand {
    /// Tenants by name with their rate, the largest first.
    pub tenants: Vec<(String, f64)>,
    /// Summed rate of the tenants not named.
    pub rest_rate: f64,
    /// How many tenants that sum is over.
    pub rest_tenants: u32,
    /// The named tenants that were held back here (a request deferred or
    /// refused): they want more than they get, whatever they asked. A
    /// worker waits out a deferral before asking again, so what a tenant
    /// held back asks is what it gets, not what it wants.
    pub saturated: Vec<String>,
    /// Each dependency's demand, successes and grant here (empty inside a
    /// dependency's own demand).
    pub dependencies: Vec<DependencyDemand>,
}

/// What a replica publishes of one dependency.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DependencyDemand {
    /// The dependency.
    pub name: String,
    /// Its tenants' demand here.
    pub demand: Demand,
    /// Its successes a second here, over its pace window.
    pub success_rate: f64,
    /// The rate of its budget this replica holds.
    pub granted_rate: f64,
    /// The allowance this replica's evidence argues for, retries a second.
    pub allowance: f64,
    /// Requests seen here in the evidence window: this replica's weight in
    /// the fleet's allowance.
    pub seen: u64,
    /// Each tenant's retries granted here in the window, and retries whose
    /// failure was reported here (the busiest by name).
    pub fates: Vec<(String, Fates)>,
}

impl Demand {
    /// The demand of `counts` (tokens asked per tenant, and whether any was
    /// held back) over `elapsed`, keeping the `top` largest by name.
    pub fn from_counts(
        mut counts: Vec<(String, u64, bool)>,
        elapsed: Duration,
        top: usize,
    ) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-3);
        counts.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let rest = counts.split_off(top.min(counts.len()));
        let mut saturated: Vec<String> =
            counts.iter().filter(|c| c.2).map(|c| c.0.clone()).collect();
        saturated.sort_unstable();
        Self {
            tenants: counts
                .into_iter()
                .map(|(tenant, n, _)| (tenant, n as f64 / seconds))
                .collect(),
            rest_rate: rest.iter().map(|c| c.1 as f64).sum::<f64>() / seconds,
            rest_tenants: u32::try_from(rest.len()).unwrap_or(u32::MAX),
            saturated,
            dependencies: Vec::new(),
        }
    }

    /// This demand's dependency `name`, if it has one.
    pub fn dependency(&self, name: &str) -> Option<&DependencyDemand> {
        self.dependencies.iter().find(|d| d.name == name)
    }

    /// The total rate.
    pub fn total(&self) -> f64 {
        self.tenants.iter().map(|(_, r)| r).sum::<f64>() + self.rest_rate
    }

    /// The row's bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.record().encode_to_vec()
    }

    fn record(&self) -> DemandRecord {
        DemandRecord {
            tenants: self
                .tenants
                .iter()
                .map(|(tenant, rate)| TenantRecord {
                    tenant: tenant.clone(),
                    rate: *rate,
                })
                .collect(),
            rest_rate: self.rest_rate,
            rest_tenants: self.rest_tenants,
            saturated: self.saturated.clone(),
            dependencies: self
                .dependencies
                .iter()
                .map(|d| DependencyRecord {
                    name: d.name.clone(),
                    demand: Some(d.demand.record()),
                    success_rate: d.success_rate,
                    granted_rate: d.granted_rate,
                    allowance: d.allowance,
                    seen: d.seen,
                    fates: d
                        .fates
                        .iter()
                        .map(|(tenant, f)| FatesRecord {
                            tenant: tenant.clone(),
                            granted: f.granted,
                            failed: f.failed,
                            failed_recently: f.failed_recently,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The demand in a row's bytes; `None` if they do not decode or hold
    /// rates that are not finite and at least 0. A row of a release before
    /// dependencies had budgets has none.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        Self::from_record(DemandRecord::decode(bytes).ok()?)
    }

    fn from_record(record: DemandRecord) -> Option<Self> {
        let valid = |r: f64| r.is_finite() && r >= 0.0;
        let dependencies = record
            .dependencies
            .into_iter()
            .map(|d| {
                let demand = Self::from_record(d.demand.unwrap_or_default())?;
                (valid(d.success_rate) && valid(d.granted_rate) && valid(d.allowance)).then_some(
                    DependencyDemand {
                        name: d.name,
                        demand,
                        success_rate: d.success_rate,
                        granted_rate: d.granted_rate,
                        allowance: d.allowance,
                        seen: d.seen,
                        fates: d
                            .fates
                            .into_iter()
                            .map(|f| {
                                let fates = Fates {
                                    granted: f.granted,
                                    failed: f.failed,
                                    failed_recently: f.failed_recently,
                                };
                                (f.tenant, fates)
                            })
                            .collect(),
                    },
                )
            })
            .collect::<Option<Vec<_>>>()?;
        let demand = Self {
            tenants: record
                .tenants
                .into_iter()
                .map(|t| (t.tenant, t.rate))
                .collect(),
            rest_rate: record.rest_rate,
            rest_tenants: record.rest_tenants,
            saturated: record.saturated,
            dependencies,
        };
        (valid(demand.rest_rate) && demand.tenants.iter().all(|(_, r)| valid(*r))).then_some(demand)
    }
}

/// `retrybudget.coord.v1.Demand`.
#[derive(Clone, PartialEq, Message)]
struct DemandRecord {
    #[prost(message, repeated, tag = "1")]
    tenants: Vec<TenantRecord>,
    #[prost(double, tag = "2")]
    rest_rate: f64,
    #[prost(uint32, tag = "3")]
    rest_tenants: u32,
    #[prost(string, repeated, tag = "4")]
    saturated: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    dependencies: Vec<DependencyRecord>,
}

/// `retrybudget.coord.v1.DependencyDemand`.
#[derive(Clone, PartialEq, Message)]
struct DependencyRecord {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    demand: Option<DemandRecord>,
    #[prost(double, tag = "3")]
    success_rate: f64,
    #[prost(double, tag = "4")]
    granted_rate: f64,
    /// Absent in a row of a release before the allowance from evidence:
    /// 0, which the fleet's weighted blend ignores (its `seen` is 0 too).
    #[prost(double, tag = "5")]
    allowance: f64,
    #[prost(uint64, tag = "6")]
    seen: u64,
    #[prost(message, repeated, tag = "7")]
    fates: Vec<FatesRecord>,
}

/// `retrybudget.coord.v1.TenantFates`: a tenant's retries granted and
/// failed in a replica's evidence window.
#[derive(Clone, PartialEq, Message)]
struct FatesRecord {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(uint32, tag = "2")]
    granted: u32,
    #[prost(uint32, tag = "3")]
    failed: u32,
    #[prost(uint32, tag = "4")]
    failed_recently: u32,
}

/// `retrybudget.coord.v1.TenantDemand`.
#[derive(Clone, PartialEq, Message)]
struct TenantRecord {
    #[prost(string, tag = "1")]
    tenant: String,
    #[prost(double, tag = "2")]
    rate: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_are_named_the_rest_summed_and_it_round_trips() {
        let counts = vec![
            ("a".into(), 10, false),
            ("b".into(), 30, true),
            ("c".into(), 20, false),
            ("d".into(), 2, true),
        ];
        let d = Demand::from_counts(counts, Duration::from_millis(500), 2);
        assert_eq!(d.tenants, [("b".into(), 60.0), ("c".into(), 40.0)]);
        assert_eq!((d.rest_rate, d.rest_tenants), (24.0, 2));
        assert_eq!(d.saturated, ["b"], "named tenants only");
        assert_eq!(d.total(), 124.0);
        assert_eq!(Demand::decode(&d.encode()), Some(d));
        assert_eq!(Demand::decode(b"\xff\xff"), None);
        let bad = Demand {
            rest_rate: f64::NAN,
            ..Demand::default()
        };
        assert_eq!(Demand::decode(&bad.encode()), None);
    }

    #[test]
    fn dependencies_round_trip_and_an_old_row_has_none() {
        let inner = Demand::from_counts(vec![("a".into(), 4, true)], Duration::from_secs(1), 8);
        let d = Demand {
            dependencies: vec![DependencyDemand {
                name: "payments-api".into(),
                demand: inner,
                success_rate: 32.5,
                granted_rate: 1.5,
                allowance: 12.0,
                seen: 40,
                fates: vec![(
                    "a".into(),
                    Fates {
                        granted: 10,
                        failed: 7,
                        failed_recently: 2,
                    },
                )],
            }],
            ..Demand::from_counts(vec![("a".into(), 4, true)], Duration::from_secs(1), 8)
        };
        assert_eq!(Demand::decode(&d.encode()), Some(d.clone()));
        assert_eq!(d.dependency("payments-api").unwrap().success_rate, 32.5);
        let old = Demand {
            dependencies: Vec::new(),
            ..d
        };
        assert!(
            Demand::decode(&old.encode())
                .unwrap()
                .dependencies
                .is_empty()
        );
    }
}
