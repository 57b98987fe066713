//! The tenants the bucket tracks: a fixed-size table, so memory is bounded
//! however many tenant ids clients invent.
//!
//! A tenant is either *backlogged* (its next free slot lies in the future:
//! it holds a share of the refill right now) or *idle*. The fair-share
//! arithmetic needs one number from this table, the summed weight of the
//! backlogged tenants, and needs it on every admission. So backlogged
//! tenants sit in an indexed min-heap keyed by their next slot: as time
//! passes, the ones whose slot has come are popped (O(log n) each) and their
//! weight leaves the sum.
//!
//! # Why evicting an idle tenant loses nothing
//! An idle tenant's state is exactly a new tenant's state: no slot booked
//! ahead, so it is admitted at once when it comes back. Idle tenants sit in
//! a doubly linked list in the order they went idle, and the table evicts
//! the one idle the longest when it needs room. Only its counter for
//! metrics is lost.
//!
//! # Past the bound
//! When every tracked tenant is backlogged and a new one arrives, it is not
//! tracked on its own: all such tenants share one *overflow* entry, with the
//! default weight. They keep a share together (never none), but not one
//! each. The bound is a configuration value (`max_tenants`); the overflow
//! entry is index 0 and is never evicted.
//!
//! Everything is allocated up front: a known tenant costs no allocation, a
//! new one costs its name.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;

/// The name of the entry shared by tenants past the bound. It has a space,
/// which no valid tenant id has, so it can never be taken for a real one.
pub const OVERFLOW_TENANT: &str = "untracked tenants";

/// "No index": not in the heap, or the end of the idle list.
const NONE: u32 = u32::MAX;

/// The overflow entry's index.
pub(super) const OVERFLOW: u32 = 0;

/// One tracked tenant.
#[derive(Debug)]
pub(super) struct TenantSlot {
    /// The tenant id, shared with the index and with permits (no copy).
    pub name: Arc<str>,
    /// Its weight: its share of the refill is proportional to it.
    pub weight: u32,
    /// Nanoseconds since the epoch of its next free slot. At or before
    /// `now`, the tenant is idle.
    pub next: i64,
    /// Bumped when the entry is reused for another tenant, so a grant
    /// taken for the old one does not touch the new one.
    pub generation: u32,
    /// Nanoseconds since the epoch of the next turn in its queue of refused
    /// requests (see `fair`).
    pub refused_until: i64,
    /// Tokens granted or booked, less tokens returned (for metrics).
    pub tokens: u64,
    /// Tokens asked for since the demand was last read (see `fair`).
    pub asked: u64,
    /// Of those, the ones that could not be granted at once (deferred or
    /// refused): the tenant wanted more than it got.
    pub held_back: u64,
    /// Position in the backlog heap, or `NONE` when idle.
    heap_pos: u32,
    /// Previous entry in the idle list.
    prev: u32,
    /// Next entry in the idle list.
    next_idle: u32,
}

/// The table: entries, their index by name, the backlog heap and the idle
/// list.
#[derive(Debug)]
pub(super) struct Tenants {
    /// Every entry; index 0 is the overflow entry.
    slots: Vec<TenantSlot>,
    /// Tracked tenant ids to their entry (the overflow entry is not here).
    /// foldhash, as the activity locks: every token looks its tenant up
    /// here, and the table is bounded whatever ids clients send, so a fast
    /// seeded hash is enough.
    index: HashMap<Arc<str>, u32, RandomState>,
    /// Backlogged entries, a min-heap on `next`.
    heap: Vec<u32>,
    /// Summed weight of the entries in `heap`.
    backlogged_weight: u64,
    /// The entry idle the longest: evicted first.
    idle_head: u32,
    /// The entry idle the shortest.
    idle_tail: u32,
    /// Most entries besides the overflow one.
    max_tenants: usize,
}

impl Tenants {
    /// An empty table for at most `max_tenants` tenants, plus the overflow
    /// entry with `overflow_weight`. Allocates everything it will need.
    pub fn new(max_tenants: usize, overflow_weight: u32) -> Self {
        let mut slots = Vec::with_capacity(max_tenants + 1);
        slots.push(TenantSlot::new(
            Arc::from(OVERFLOW_TENANT),
            overflow_weight,
            0,
        ));
        Self {
            slots,
            index: HashMap::with_capacity_and_hasher(max_tenants, RandomState::default()),
            heap: Vec::with_capacity(max_tenants + 1),
            backlogged_weight: 0,
            idle_head: NONE,
            idle_tail: NONE,
            max_tenants,
        }
    }

    /// The entry at `i`.
    pub fn get(&self, i: u32) -> &TenantSlot {
        &self.slots[i as usize]
    }

    /// The entry at `i`, to change its counters (never `next`: use
    /// [`Tenants::set_next`]).
    pub fn get_mut(&mut self, i: u32) -> &mut TenantSlot {
        &mut self.slots[i as usize]
    }

    /// The entry of `name`, if it is tracked.
    pub fn find(&self, name: &str) -> Option<u32> {
        self.index.get(name).copied()
    }

    /// Summed weight of the backlogged tenants.
    pub fn backlogged_weight(&self) -> u64 {
        self.backlogged_weight
    }

    /// Tracked tenants (the overflow entry not counted).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Every entry, the overflow one first.
    pub fn iter(&self) -> impl Iterator<Item = &TenantSlot> {
        self.slots.iter()
    }

    /// Moves the tenants whose slot has come (`next <= now`) from the
    /// backlog to the idle list.
    pub fn expire(&mut self, now: i64) {
        while let Some(&top) = self.heap.first() {
            if self.slots[top as usize].next > now {
                break;
            }
            self.heap_remove(top);
            self.idle_push(top);
        }
    }

    /// The entry of `name`, tracking it if it is new (evicting the tenant
    /// idle the longest when the table is full), or the overflow entry when
    /// every tracked tenant is backlogged. `weight` gives a new tenant's
    /// weight. Call [`Tenants::expire`] first, so the idle list is current.
    pub fn lookup(&mut self, name: &str, weight: impl FnOnce(&str) -> u32) -> u32 {
        if let Some(&i) = self.index.get(name) {
            if self.slots[i as usize].heap_pos == NONE {
                // Used again: it is now the most recently idle.
                self.idle_unlink(i);
                self.idle_push(i);
            }
            return i;
        }
        let name: Arc<str> = Arc::from(name);
        let weight = weight(&name);
        let i = if self.slots.len() <= self.max_tenants {
            let i = self.slots.len() as u32;
            self.slots.push(TenantSlot::new(name.clone(), weight, 0));
            i
        } else if self.idle_head != NONE {
            let i = self.idle_head;
            self.idle_unlink(i);
            let slot = &mut self.slots[i as usize];
            self.index.remove(&slot.name);
            let generation = slot.generation.wrapping_add(1);
            *slot = TenantSlot::new(name.clone(), weight, generation);
            i
        } else {
            return OVERFLOW;
        };
        self.index.insert(name, i);
        self.idle_push(i);
        i
    }

    /// Sets the next free slot of entry `i`, moving it between the backlog
    /// and the idle list as `next` is after `now` or not.
    pub fn set_next(&mut self, i: u32, next: i64, now: i64) {
        let backlogged = self.slots[i as usize].heap_pos != NONE;
        self.slots[i as usize].next = next;
        match (backlogged, next > now) {
            (true, true) => {
                let pos = self.slots[i as usize].heap_pos;
                self.sift_up(pos);
                let pos = self.slots[i as usize].heap_pos;
                self.sift_down(pos);
            }
            (true, false) => {
                self.heap_remove(i);
                self.idle_push(i);
            }
            (false, true) => {
                self.idle_unlink(i);
                self.heap_push(i);
            }
            (false, false) => {}
        }
    }

    /// Gives every entry the weight `weight` says (the overflow entry
    /// `overflow_weight`), keeping the backlogged weight exact.
    pub fn reweigh(&mut self, weight: impl Fn(&str) -> u32, overflow_weight: u32) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let new = if i == OVERFLOW as usize {
                overflow_weight
            } else {
                weight(&slot.name)
            };
            if slot.heap_pos != NONE {
                self.backlogged_weight =
                    self.backlogged_weight - u64::from(slot.weight) + u64::from(new);
            }
            slot.weight = new;
        }
    }

    /// Stretches every slot and refused turn still ahead of `now` by
    /// `num / den`. The map is increasing, so the heap keeps its order and
    /// no tenant changes between backlogged and idle.
    pub fn rescale_ahead(&mut self, now: i64, num: i64, den: i64) {
        let scale = |t: i64| {
            if t <= now {
                return t;
            }
            let ahead = i128::from(t - now) * i128::from(num) / i128::from(den.max(1));
            // Kept at least 1 ahead, so a backlogged tenant stays so.
            now.saturating_add(ahead.clamp(1, i128::from(i64::MAX / 4)) as i64)
        };
        for slot in &mut self.slots {
            slot.next = scale(slot.next);
            slot.refused_until = scale(slot.refused_until);
        }
    }

    /// Hands each entry's `asked` and `held_back` counts, when it asked, to
    /// `each`, and resets them.
    pub fn take_asked(&mut self, mut each: impl FnMut(&str, u64, u64)) {
        for slot in &mut self.slots {
            if slot.asked > 0 {
                each(&slot.name, slot.asked, slot.held_back);
                slot.asked = 0;
                slot.held_back = 0;
            }
        }
    }

    fn heap_push(&mut self, i: u32) {
        let pos = self.heap.len() as u32;
        self.heap.push(i);
        self.slots[i as usize].heap_pos = pos;
        self.backlogged_weight += u64::from(self.slots[i as usize].weight);
        self.sift_up(pos);
    }

    fn heap_remove(&mut self, i: u32) {
        let pos = self.slots[i as usize].heap_pos;
        let last = self.heap.len() as u32 - 1;
        self.swap(pos, last);
        self.heap.pop();
        self.slots[i as usize].heap_pos = NONE;
        self.backlogged_weight -= u64::from(self.slots[i as usize].weight);
        if pos < last {
            let moved = self.heap[pos as usize];
            self.sift_up(pos);
            let pos = self.slots[moved as usize].heap_pos;
            self.sift_down(pos);
        }
    }

    fn key(&self, pos: u32) -> i64 {
        self.slots[self.heap[pos as usize] as usize].next
    }

    fn swap(&mut self, a: u32, b: u32) {
        self.heap.swap(a as usize, b as usize);
        let (ia, ib) = (self.heap[a as usize], self.heap[b as usize]);
        self.slots[ia as usize].heap_pos = a;
        self.slots[ib as usize].heap_pos = b;
    }

    fn sift_up(&mut self, mut pos: u32) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.key(parent) <= self.key(pos) {
                break;
            }
            self.swap(parent, pos);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: u32) {
        let len = self.heap.len() as u32;
        loop {
            let (left, right) = (2 * pos + 1, 2 * pos + 2);
            let mut least = pos;
            if left < len && self.key(left) < self.key(least) {
                least = left;
            }
            if right < len && self.key(right) < self.key(least) {
                least = right;
            }
            if least == pos {
                break;
            }
            self.swap(pos, least);
            pos = least;
        }
    }

    /// Appends entry `i` to the idle list (the overflow entry never joins:
    /// it is never evicted).
    fn idle_push(&mut self, i: u32) {
        if i == OVERFLOW {
            return;
        }
        self.slots[i as usize].prev = self.idle_tail;
        self.slots[i as usize].next_idle = NONE;
        match self.idle_tail {
            NONE => self.idle_head = i,
            tail => self.slots[tail as usize].next_idle = i,
        }
        self.idle_tail = i;
    }

    /// Takes entry `i` out of the idle list, if it is there.
    fn idle_unlink(&mut self, i: u32) {
        if i == OVERFLOW {
            return;
        }
        let (prev, next) = {
            let t = &self.slots[i as usize];
            (t.prev, t.next_idle)
        };
        if prev == NONE && self.idle_head != i {
            return; // not in the list
        }
        match prev {
            NONE => self.idle_head = next,
            p => self.slots[p as usize].next_idle = next,
        }
        match next {
            NONE => self.idle_tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        self.slots[i as usize].prev = NONE;
        self.slots[i as usize].next_idle = NONE;
    }
}

impl TenantSlot {
    fn new(name: Arc<str>, weight: u32, generation: u32) -> Self {
        Self {
            name,
            weight,
            next: i64::MIN,
            generation,
            refused_until: i64::MIN,
            tokens: 0,
            asked: 0,
            held_back: 0,
            heap_pos: NONE,
            prev: NONE,
            next_idle: NONE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backlogged(t: &Tenants) -> Vec<&str> {
        let mut names: Vec<&str> = t.heap.iter().map(|&i| &*t.slots[i as usize].name).collect();
        names.sort_unstable();
        names
    }

    fn check_heap(t: &Tenants) {
        for (pos, &i) in t.heap.iter().enumerate() {
            assert_eq!(t.slots[i as usize].heap_pos as usize, pos);
            if pos > 0 {
                assert!(t.key(((pos - 1) / 2) as u32) <= t.key(pos as u32));
            }
        }
        let sum: u64 = t
            .heap
            .iter()
            .map(|&i| u64::from(t.slots[i as usize].weight))
            .sum();
        assert_eq!(sum, t.backlogged_weight);
    }

    #[test]
    fn expiry_pops_tenants_in_slot_order_and_keeps_the_weight_sum() {
        let mut t = Tenants::new(8, 1);
        for (k, name) in ["a", "b", "c", "d"].iter().enumerate() {
            let i = t.lookup(name, |_| k as u32 + 1);
            t.set_next(i, 100 - 10 * k as i64, 0);
            check_heap(&t);
        }
        assert_eq!(t.backlogged_weight(), 1 + 2 + 3 + 4);
        t.expire(75);
        assert_eq!(backlogged(&t), ["a", "b", "c"]);
        assert_eq!(t.backlogged_weight(), 6);
        let b = t.lookup("b", |_| 0);
        t.set_next(b, 200, 75);
        check_heap(&t);
        t.expire(150);
        assert_eq!(backlogged(&t), ["b"]);
        check_heap(&t);
    }

    #[test]
    fn a_full_table_evicts_the_tenant_idle_longest() {
        let mut t = Tenants::new(2, 1);
        let a = t.lookup("a", |_| 1);
        let b = t.lookup("b", |_| 1);
        // Touching "a" makes "b" the one idle the longest.
        assert_eq!(t.lookup("a", |_| 1), a);
        let c = t.lookup("c", |_| 1);
        assert_eq!(c, b, "b's entry is reused");
        assert_eq!(t.get(c).generation, 1);
        assert!(!t.index.contains_key("b"));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn past_the_bound_backlogged_tenants_are_kept_and_newcomers_share_the_overflow() {
        let mut t = Tenants::new(2, 1);
        for name in ["a", "b"] {
            let i = t.lookup(name, |_| 1);
            t.set_next(i, 10, 0);
        }
        assert_eq!(t.lookup("c", |_| 1), OVERFLOW);
        assert_eq!(t.lookup("d", |_| 1), OVERFLOW);
        assert_eq!(t.get(OVERFLOW).name.as_ref(), OVERFLOW_TENANT);
        t.expire(10);
        assert_ne!(t.lookup("c", |_| 1), OVERFLOW, "room again once idle");
    }

    #[test]
    fn returning_a_tenant_to_idle_puts_it_back_in_the_list() {
        let mut t = Tenants::new(1, 1);
        let a = t.lookup("a", |_| 1);
        t.set_next(a, 10, 0);
        t.set_next(a, 5, 5);
        assert_eq!(t.backlogged_weight(), 0);
        assert_eq!(t.lookup("b", |_| 1), a, "a is idle, so it is evicted");
    }
}
