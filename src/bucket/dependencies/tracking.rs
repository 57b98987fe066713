//! Which dependencies are tracked one by one: an entry made for a name
//! when the bounds allow (64 in all, 16 introduced by one tenant), an idle
//! one evicted for it, never one named in the configuration, in trouble or
//! with a line; past them, the shared entry of untracked dependencies.

use std::sync::Arc;
use std::time::Duration;

use super::entry::DependencyEntry;
use super::{Dependencies, IDLE_EVICTION_SECONDS, name_of};
use crate::bucket::pace::OVERFLOW_DEPENDENCY;

impl Dependencies {
    /// The entry `dependency` asks (the default one for an empty name, the
    /// shared one when it cannot be tracked), its pace brought up to
    /// `now`. `tenant` introduces it when it is new.
    pub(super) fn entry(&mut self, dependency: &str, tenant: &str, now: Duration) -> usize {
        let name = name_of(dependency);
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => self.insert(name, tenant, now.as_secs()),
        };
        self.entries[i].last_used = now.as_secs();
        self.repace(i, now);
        i
    }

    pub(super) fn tracked_count(&self) -> usize {
        self.entries.iter().filter(|e| e.tracked).count()
    }

    /// Tracks `name` for `tenant` if the bounds allow (evicting an idle
    /// entry if need be), else answers the shared entry.
    pub(super) fn insert(&mut self, name: &str, tenant: &str, second: u64) -> usize {
        let per_tenant = self.config.max_dependencies_per_tenant;
        let introducer: Option<Arc<str>> = (!tenant.is_empty()).then(|| Arc::from(tenant));
        // A tenant at its bound makes room among its own idle entries.
        let mine = introducer
            .as_ref()
            .map_or(0, |t| self.introduced.get(t).copied().unwrap_or(0));
        if mine >= per_tenant {
            let own_idle = self.entries.iter().position(|e| {
                e.introduced_by.as_deref() == Some(tenant)
                    && e.evictable(second, IDLE_EVICTION_SECONDS)
            });
            return match own_idle {
                Some(i) => self.replace(i, name, introducer, second),
                None => self.overflow(second),
            };
        }
        if self.tracked_count() < self.config.max_dependencies {
            let i = self.push(name, second);
            self.introduce(i, introducer);
            return i;
        }
        let idle = (0..self.entries.len())
            .filter(|&i| self.entries[i].evictable(second, IDLE_EVICTION_SECONDS))
            .min_by_key(|&i| self.entries[i].last_used);
        match idle {
            Some(i) => self.replace(i, name, introducer, second),
            None => self.overflow(second),
        }
    }

    pub(super) fn push(&mut self, name: &str, second: u64) -> usize {
        let config = self.config.pace_of(name);
        let entry = DependencyEntry::new(
            Arc::from(name),
            config,
            &self.template,
            self.global_rate,
            second,
        );
        self.entries.push(entry);
        let i = self.entries.len() - 1;
        self.index.insert(Arc::clone(&self.entries[i].name), i);
        i
    }

    /// Entry `i` evicted, its place given to `name`.
    pub(super) fn replace(
        &mut self,
        i: usize,
        name: &str,
        introducer: Option<Arc<str>>,
        second: u64,
    ) -> usize {
        let old = &self.entries[i];
        self.index.remove(&old.name);
        if let Some(by) = &old.introduced_by
            && let Some(n) = self.introduced.get_mut(by)
        {
            *n = n.saturating_sub(1);
        }
        let config = self.config.pace_of(name);
        self.entries[i] = DependencyEntry::new(
            Arc::from(name),
            config,
            &self.template,
            self.global_rate,
            second,
        );
        self.index.insert(Arc::clone(&self.entries[i].name), i);
        self.introduce(i, introducer);
        i
    }

    pub(super) fn introduce(&mut self, i: usize, introducer: Option<Arc<str>>) {
        if let Some(by) = introducer {
            *self.introduced.entry(Arc::clone(&by)).or_insert(0) += 1;
            self.entries[i].introduced_by = Some(by);
        }
    }

    /// The shared entry of untracked dependencies, made once.
    pub(super) fn overflow(&mut self, second: u64) -> usize {
        if let Some(&i) = self.index.get(OVERFLOW_DEPENDENCY) {
            return i;
        }
        let i = self.push(OVERFLOW_DEPENDENCY, second);
        self.entries[i].tracked = false;
        i
    }

    /// Tracks every dependency the operator named.
    pub(super) fn track_named(&mut self, second: u64) {
        let named: Vec<String> = self.config.named.keys().cloned().collect();
        for name in named {
            let i = match self.index.get(name.as_str()) {
                Some(&i) => i,
                None => self.push(&name, second),
            };
            self.entries[i].named = true;
        }
    }
}
