//! Writes a record in the stored schema straight from the core's types.
//!
//! Building the generated message first would copy every string of the
//! record (a dozen allocations for a record of four events) on every save,
//! only to encode and drop them. The fields are written here instead, in
//! field-number order and with proto3's rules for defaults, so the bytes are
//! exactly those prost writes for the same message:
//! `codec::tests::the_writer_agrees_with_the_generated_message` checks it.
//!
//! A nested message is preceded by its length. Rather than measure each
//! message before writing it (which walked every event twice, and made
//! encoding slower than the MessagePack it replaced), a message is written
//! after room for a two-byte length (lengths up to 16 383 bytes: an event
//! with its reason takes 100 to 250), and moved when its length needs
//! another size.

use super::pb;
use crate::budget::activity::{ActivityRecord, Event, Policy, Reservation};
use crate::budget::hint::{Hint, IgnoredHints};

/// Appends the fields of `record` to `out`.
pub(super) fn record(record: &ActivityRecord, out: &mut Vec<u8>) {
    record.fields(&mut Out(out));
}

/// Protobuf's wire types that the schema uses.
const VARINT: u32 = 0;
const LENGTH_DELIMITED: u32 = 2;

/// The room left for a nested message's length: two bytes of varint.
const LENGTH_ROOM: usize = 2;

/// The buffer fields are appended to.
struct Out<'a>(&'a mut Vec<u8>);

impl Out<'_> {
    /// A field's key: its number and wire type.
    fn key(&mut self, tag: u32, wire_type: u32) {
        put_varint(self.0, u64::from(tag << 3 | wire_type));
    }

    /// A varint field, written even when zero.
    fn varint(&mut self, tag: u32, value: u64) {
        self.key(tag, VARINT);
        put_varint(self.0, value);
    }

    /// A length-delimited field of raw bytes, written even when empty.
    fn delimited(&mut self, tag: u32, bytes: &[u8]) {
        self.key(tag, LENGTH_DELIMITED);
        put_varint(self.0, bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// A nested message, written even when it has no field set.
    fn message<M: Fields>(&mut self, tag: u32, message: &M) {
        self.key(tag, LENGTH_DELIMITED);
        let at = self.0.len();
        self.0.extend_from_slice(&[0; LENGTH_ROOM]);
        message.fields(self);
        let end = self.0.len();
        let body = at + LENGTH_ROOM;
        let mut prefix = [0; 10];
        let used = varint_into(&mut prefix, (end - body) as u64);
        // Moved back for a message under 128 bytes (a policy, a hint), or
        // forward for one over 16 383.
        if used < LENGTH_ROOM {
            self.0.copy_within(body..end, at + used);
            self.0.truncate(end - (LENGTH_ROOM - used));
        } else if used > LENGTH_ROOM {
            self.0.resize(end + used - LENGTH_ROOM, 0);
            self.0.copy_within(body..end, at + used);
        }
        self.0[at..at + used].copy_from_slice(&prefix[..used]);
    }

    /// An unsigned number, left out when zero (proto3's implicit presence).
    fn uint(&mut self, tag: u32, value: u64) {
        if value != 0 {
            self.varint(tag, value);
        }
    }

    /// An `int64`, left out when zero. A negative one takes ten bytes, as
    /// protobuf writes it (two's complement, as an unsigned number).
    fn int(&mut self, tag: u32, value: i64) {
        if value != 0 {
            self.varint(tag, value as u64);
        }
    }

    /// An enum's number, left out when 0 (unspecified).
    fn enumeration(&mut self, tag: u32, value: i32) {
        self.int(tag, i64::from(value));
    }

    /// A `bool`, left out when false.
    fn flag(&mut self, tag: u32, value: bool) {
        if value {
            self.varint(tag, 1);
        }
    }

    /// A `string`, left out when empty.
    fn string(&mut self, tag: u32, value: &str) {
        if !value.is_empty() {
            self.delimited(tag, value.as_bytes());
        }
    }

    /// An `optional int64`: written whenever it is set.
    fn optional_int(&mut self, tag: u32, value: Option<i64>) {
        if let Some(value) = value {
            self.varint(tag, value as u64);
        }
    }

    /// An `optional uint32`: written whenever it is set.
    fn optional_uint(&mut self, tag: u32, value: Option<u32>) {
        if let Some(value) = value {
            self.varint(tag, u64::from(value));
        }
    }

    /// An `optional string`: written whenever it is set, even empty.
    fn optional_string(&mut self, tag: u32, value: Option<&str>) {
        if let Some(value) = value {
            self.delimited(tag, value.as_bytes());
        }
    }
}

/// Appends `value` as a varint, in one copy. Most are one byte (every key,
/// flag, enum and attempt number), pushed alone.
fn put_varint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
        return;
    }
    let mut bytes = [0; 10];
    let used = varint_into(&mut bytes, value);
    out.extend_from_slice(&bytes[..used]);
}

/// Writes `value` as a varint at the start of `bytes`; returns its length.
fn varint_into(bytes: &mut [u8; 10], mut value: u64) -> usize {
    let mut used = 0;
    while value >= 0x80 {
        bytes[used] = (value as u8) | 0x80;
        value >>= 7;
        used += 1;
    }
    bytes[used] = value as u8;
    used + 1
}

/// A type written as one message of the stored schema. The field numbers
/// are those of `proto/retrybudget/store/v1/record.proto`.
trait Fields {
    fn fields(&self, out: &mut Out<'_>);
}

impl Fields for ActivityRecord {
    fn fields(&self, out: &mut Out<'_>) {
        out.string(1, &self.tenant);
        out.string(2, &self.activity_id);
        out.string(3, &self.workflow_id);
        out.message(4, &self.policy);
        out.int(5, self.started_at_ms);
        out.uint(6, u64::from(self.attempts));
        out.enumeration(7, pb::Status::from(self.status).into());
        out.optional_string(8, self.closed_code.as_deref());
        out.optional_int(9, self.closed_at_ms);
        if let Some(reservation) = &self.reservation {
            out.message(10, reservation);
        }
        for event in &self.events {
            out.message(11, &**event);
        }
    }
}

impl Fields for Policy {
    fn fields(&self, out: &mut Out<'_>) {
        out.uint(1, u64::from(self.max_attempts));
        out.uint(2, self.deadline_seconds);
        out.optional_uint(3, self.base);
        out.optional_uint(4, self.cap);
    }
}

impl Fields for Reservation {
    fn fields(&self, out: &mut Out<'_>) {
        out.uint(1, u64::from(self.attempt));
        out.int(2, self.not_before_ms);
        out.flag(3, self.booked);
    }
}

impl Fields for Event {
    fn fields(&self, out: &mut Out<'_>) {
        out.enumeration(1, pb::EventKind::from(self.kind).into());
        out.uint(2, u64::from(self.attempt));
        out.enumeration(3, pb::ErrorClass::from(self.class).into());
        out.int(4, self.occurred_at_ms);
        out.flag(5, self.occurred_at_stamped);
        out.uint(6, self.elapsed_ms);
        out.uint(7, self.backoff_ms);
        out.uint(8, u64::from(self.delay_seconds));
        out.uint(9, self.delay_ms);
        out.optional_int(10, self.not_before_ms);
        out.enumeration(11, pb::Action::from(self.action).into());
        out.string(12, &self.code);
        out.string(13, &self.reason);
        out.flag(14, self.token_taken);
        out.optional_string(15, self.defer_reason.as_deref());
        out.optional_string(16, self.rule.as_deref());
        if let Some(hint) = &self.hint {
            out.message(17, hint);
        }
        out.int(18, self.recorded_at_ms);
        out.flag(19, self.slot_booked);
        out.optional_string(20, self.dependency.as_deref());
    }
}

impl Fields for Hint {
    fn fields(&self, out: &mut Out<'_>) {
        out.uint(1, self.delay_ms);
        out.enumeration(2, pb::HintSource::from(self.source).into());
        out.flag(3, self.capped);
        out.flag(4, self.do_not_retry);
        if !self.ignored.is_empty() {
            out.message(5, &self.ignored);
        }
    }
}

impl Fields for IgnoredHints {
    fn fields(&self, out: &mut Out<'_>) {
        out.flag(1, self.retry_after);
        out.flag(2, self.date);
        out.flag(3, self.retry_info);
    }
}
