//! [`ReportLimiter`]: how many traffic reports a second each tenant may
//! send, so a flood of reports is refused with advice instead of costing
//! the lock of every dependency. Pure: time is a parameter.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Nanoseconds of the bucket's clock.
type Nanos = i64;

/// Each tenant's meter of reports: a token bucket holding one second of
/// its rate, the same arithmetic as the retry bucket's meter.
#[derive(Debug)]
pub struct ReportLimiter {
    /// Reports a second each tenant may send.
    per_second: f64,
    /// When each tenant's refill will have paid for every report taken.
    meters: HashMap<Arc<str>, Nanos>,
    /// Most tenants tracked; past it, the full meters are forgotten (a
    /// full meter is the same as none).
    max_tenants: usize,
}

impl ReportLimiter {
    /// A limiter of `per_second` reports for each of up to `max_tenants`.
    pub fn new(per_second: f64, max_tenants: usize) -> Self {
        Self {
            per_second,
            meters: HashMap::new(),
            max_tenants: max_tenants.max(1),
        }
    }

    /// A new rate (a reload).
    pub fn set_rate(&mut self, per_second: f64) {
        self.per_second = per_second;
    }

    /// The rate, reports a second.
    pub fn rate(&self) -> f64 {
        self.per_second
    }

    /// Takes one report of `tenant`'s, or says when the next is accepted.
    ///
    /// # Errors
    /// The wait until `tenant` may report again.
    pub fn admit(&mut self, tenant: &str, now: Duration) -> Result<(), Duration> {
        let now = i64::try_from(now.as_nanos()).unwrap_or(i64::MAX / 4);
        let interval = (1e9 / self.per_second.max(1e-3)) as Nanos;
        let burst = 1_000_000_000i64.max(interval);
        if !self.meters.contains_key(tenant) && self.meters.len() >= self.max_tenants {
            self.meters.retain(|_, meter| *meter > now - burst);
        }
        if !self.meters.contains_key(tenant) {
            if self.meters.len() >= self.max_tenants {
                // Every tracked tenant is busy: the newcomer is let through
                // unmetered rather than refused for others' sake.
                return Ok(());
            }
            self.meters.insert(Arc::from(tenant), now - burst);
        }
        let Some(meter) = self.meters.get_mut(tenant) else {
            return Ok(());
        };
        let start = (*meter).max(now - burst);
        if start + interval > now {
            return Err(Duration::from_nanos((start + interval - now) as u64));
        }
        *meter = start + interval;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_a_second_of_reports_then_its_rate_and_others_are_untouched() {
        let mut r = ReportLimiter::new(10.0, 100);
        let t0 = Duration::from_secs(5);
        for _ in 0..10 {
            r.admit("a", t0).unwrap();
        }
        let wait = r.admit("a", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        r.admit("b", t0).unwrap();
        r.admit("a", t0 + wait).unwrap();
    }
}
