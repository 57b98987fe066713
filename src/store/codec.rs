//! How an activity record is written down, in the embedded store and in
//! PostgreSQL: one format byte, then the record.
//!
//! - `0x02`: protobuf, the message `retrybudget.store.v1.ActivityRecord` of
//!   `proto/retrybudget/store/v1/record.proto`. Fields are found by number,
//!   so a later release may add a field or an enum value and this one still
//!   reads what it writes, skipping what it does not know (an enum value it
//!   does not know is refused: it cannot be represented). The rule for
//!   changing the schema is protobuf's: **add fields with new numbers;
//!   never renumber, retype or reuse one**. `stored_format_is_stable` below
//!   fails when a change alters what is written.
//!
//! The format byte tells a future format apart: a release that changes more
//! than protobuf allows writes a new byte and keeps reading this one.
//! (`0x01`, MessagePack by position, and JSON were written by development
//! builds only and are not read.)
//!
//! Both directions go through the generated message ([`encode_into`],
//! [`decode`]); `schema` converts it to and from the core's types.

mod schema;

use prost::Message;

use crate::budget::activity::{ActivityKey, ActivityRecord};
use crate::budget::token::PaceRecord;

/// The generated types of `retrybudget.store.v1`: the stored schema, which
/// never leaves the store.
mod pb {
    #![allow(missing_docs, dead_code)]
    include!(concat!(env!("OUT_DIR"), "/retrybudget.store.v1.rs"));
}

/// The format byte of protobuf records (schema `retrybudget.store.v1`).
const PROTOBUF_V1: u8 = 0x02;

/// Why stored bytes are not a record this release can read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// No bytes at all.
    #[error("empty record")]
    Empty,
    /// A format byte this release does not know.
    #[error("unknown record format 0x{0:02x}")]
    UnknownFormat(u8),
    /// The bytes after the format byte are not a protobuf message of the
    /// schema.
    #[error("malformed record: {0}")]
    Malformed(#[from] prost::DecodeError),
    /// A field every record has is missing.
    #[error("malformed record: {0} is missing")]
    Missing(&'static str),
    /// An enum value this release does not know (written by a later one).
    #[error("malformed record: {field} has the unknown value {value}")]
    UnknownValue {
        /// Which field.
        field: &'static str,
        /// The number stored.
        value: i32,
    },
}

/// A dependency's pace, as the stores keep it: protobuf
/// `retrybudget.store.v1.DependencyPace`, without a format byte (the
/// message's own fields carry its versions).
pub fn encode_pace(pace: &PaceRecord) -> Vec<u8> {
    pb::DependencyPace::from(pace).encode_to_vec()
}

/// A pace back from its bytes.
///
/// # Errors
/// [`DecodeError`] when the bytes are not a pace.
pub fn decode_pace(bytes: &[u8]) -> Result<PaceRecord, DecodeError> {
    let stored = pb::DependencyPace::decode(bytes)?;
    Ok(stored.into())
}

/// A buffer's room for one record: a few attempts' events (about 150 bytes
/// each) fit without the buffer growing while it is written.
pub const RECORD_CAPACITY: usize = 1024;

/// The field number of `ActivityRecord.events`, the record's last field.
const EVENTS_FIELD: u32 = 11;

/// Appends `record` to `out`, format byte first, and gives back its key
/// (what a store indexes it by). The record is consumed: a save has no
/// further use for it, and its strings move into the message instead of
/// being copied (a caller that keeps the record encodes a clone).
///
/// The events, the last field, are appended one by one after the rest:
/// the same bytes as encoding the whole message (protobuf writes fields in
/// number order), with each event's length reckoned once instead of twice
/// and no vector of converted events built.
pub fn encode_into(record: ActivityRecord, out: &mut Vec<u8>) -> ActivityKey {
    out.push(PROTOBUF_V1);
    let (message, events) = schema::split(record);
    message.encode(out).expect("a Vec grows as needed");
    for event in events {
        prost::encoding::message::encode(EVENTS_FIELD, &pb::Event::from(event), out);
    }
    ActivityKey {
        tenant: message.tenant,
        activity_id: message.activity_id,
    }
}

/// Reads a record written by [`encode_into`].
///
/// # Errors
/// What is wrong with the bytes.
pub fn decode(bytes: &[u8]) -> Result<ActivityRecord, DecodeError> {
    match bytes.split_first() {
        Some((&PROTOBUF_V1, message)) => pb::ActivityRecord::decode(message)?.try_into(),
        Some((&other, _)) => Err(DecodeError::UnknownFormat(other)),
        None => Err(DecodeError::Empty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::activity::{
        ActivityKey, Defaults, DraftOrReplay, Policy, Report, Status, draft_or_replay,
        record_success,
    };
    use crate::budget::hint::RawHints;
    use crate::budget::{Admission, ErrorClass};

    /// A gate that gives one answer.
    struct Answering(Admission);

    impl crate::budget::TokenGate for Answering {
        fn take(&mut self, _ask: &crate::budget::token::Ask<'_>) -> crate::budget::token::Answer {
            self.0.into()
        }

        fn observe(&mut self, _observed: crate::budget::token::Observed) {}
    }

    /// A record with every kind of field filled: decisions with and without
    /// hints and rules, a deferral with a booked slot, then a success.
    fn sample() -> ActivityRecord {
        let key = ActivityKey {
            tenant: "acme".into(),
            activity_id: "charge-card:42".into(),
        };
        let defaults = Defaults {
            policy: Policy {
                max_attempts: 5,
                deadline_seconds: 3600,
                base: Some(2),
                cap: Some(60),
            },
            max_hint_ms: 600_000,
        };
        let at = 1_800_000_000_000;
        let mut record = None;
        // Attempt 3 is deferred with a booked slot.
        for (attempt, now, defer) in [(1, at, false), (2, at + 2000, false), (3, at + 9000, true)] {
            let report = Report {
                attempt,
                class: ErrorClass::Transient,
                rule: (attempt == 2).then_some("http-503"),
                hints: (attempt == 3).then_some(RawHints {
                    retry_after: "120",
                    date: "yesterday",
                    grpc_retry_pushback_ms: Some(1500),
                    retry_info_delay: None,
                }),
                policy: None,
                occurred_at_ms: Some(now - 100),
                workflow_id: "wf-7",
                dependency: "",
            };
            match draft_or_replay(record.take(), &key, &report, &defaults, now).expect("valid") {
                DraftOrReplay::Fresh(mut draft) => {
                    let admission = if defer {
                        Admission::Deferred {
                            wait: std::time::Duration::from_millis(500),
                            reason: "bucket_empty",
                            waiting_since_ms: Some(now),
                        }
                    } else {
                        Admission::Granted
                    };
                    draft.take_token(Answering(admission), now);
                    record = Some(draft.finish().0);
                }
                DraftOrReplay::Replay(_) => unreachable!(),
            }
        }
        record_success(record.expect("planned"), Some(at + 9900), at + 9950).expect("open")
    }

    fn encoded(record: &ActivityRecord) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode_into(record.clone(), &mut bytes);
        bytes
    }

    #[test]
    fn records_round_trip() {
        let record = sample();
        assert_eq!(record.status, Status::Closed);
        let bytes = encoded(&record);
        assert_eq!(bytes[0], PROTOBUF_V1);
        assert_eq!(decode(&bytes).unwrap(), record);

        // A parked record with a pending reservation and no events.
        let mut parked = sample();
        parked.status = Status::Parked;
        parked.closed_code = None;
        parked.closed_at_ms = None;
        parked.deferral = Some(crate::budget::activity::Deferral {
            attempt: 4,
            not_before_ms: -5,
            waiting_since_ms: Some(-7),
        });
        parked.events.clear();
        parked.policy.base = None;
        assert_eq!(decode(&encoded(&parked)).unwrap(), parked);
    }

    /// The generated message of `record`, built the slow way: what the
    /// writer must agree with.
    #[test]
    fn rare_fields_round_trip() {
        let mut record = sample();
        // Negative numbers and empty optional strings take the rare paths.
        record.started_at_ms = -1;
        record.closed_code = Some(String::new());
        std::sync::Arc::make_mut(&mut record.events[0]).dependency = Some("payments-api".into());
        // A message whose length takes three bytes of varint.
        let mut long = sample();
        std::sync::Arc::make_mut(&mut long.events[0]).reason = "x".repeat(20_000);
        for record in [record, long] {
            assert_eq!(decode(&encoded(&record)).unwrap(), record);
        }
    }

    /// A later release adds fields (to the record and to an event); this
    /// one skips them and reads the rest.
    #[test]
    fn fields_of_a_later_release_are_skipped() {
        let record = sample();
        let mut stored = pb::ActivityRecord::decode(&encoded(&record)[1..]).unwrap();
        let events = std::mem::take(&mut stored.events);
        let mut bytes = vec![PROTOBUF_V1];
        stored.encode(&mut bytes).unwrap();
        for (i, event) in events.iter().enumerate() {
            let mut body = event.encode_to_vec();
            if i == 1 {
                // Field 40 of an event: a string.
                prost::encoding::string::encode(40, &"later".to_owned(), &mut body);
            }
            prost::encoding::bytes::encode(11, &body, &mut bytes);
        }
        // Field 99 of the record: a number; field 100: a nested message.
        prost::encoding::uint64::encode(99, &7, &mut bytes);
        prost::encoding::bytes::encode(100, &vec![0x08, 0x01], &mut bytes);
        assert_eq!(decode(&bytes).unwrap(), record);
    }

    #[test]
    fn bad_bytes_are_refused() {
        let refused = |bytes: &[u8]| decode(bytes).unwrap_err().to_string();
        assert_eq!(refused(b""), "empty record");
        assert_eq!(refused(b"\x07abc"), "unknown record format 0x07");
        // A MessagePack record of the development builds.
        assert_eq!(refused(b"\x01\x9b\xa4acme"), "unknown record format 0x01");
        assert!(refused(b"\x02\x0a\x05ab").starts_with("malformed record"));
        // No policy, then an unknown status (a later release's enum value).
        assert_eq!(
            refused(b"\x02\x0a\x01a"),
            "malformed record: policy is missing"
        );
        let mut later = pb::ActivityRecord::decode(&encoded(&sample())[1..]).unwrap();
        later.status = 9;
        let mut bytes = vec![PROTOBUF_V1];
        later.encode(&mut bytes).unwrap();
        assert_eq!(
            refused(&bytes),
            "malformed record: status has the unknown value 9"
        );
    }

    /// The bytes of `sample()` as this version writes them. If this fails,
    /// a change altered how records are written: follow the rule in the
    /// module's documentation, and update the bytes only for an addition
    /// that old records still decode under (check with the old bytes before
    /// replacing them).
    #[test]
    fn stored_format_is_stable() {
        let hex: String = encoded(&sample())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, FIXTURE, "the stored format changed");
        // The events appended one by one are the whole message's encoding.
        let bytes = encoded(&sample());
        let whole = pb::ActivityRecord::decode(&bytes[1..]).unwrap();
        assert_eq!(whole.encode_to_vec(), bytes[1..]);
        let old = (0..FIXTURE.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FIXTURE[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>();
        assert_eq!(decode(&old).unwrap(), sample());
    }

    /// A record written before `Event.slot_booked` (field 19) existed,
    /// when a deferral that booked a slot said `token_taken`: it reads as
    /// the booking it was, and nothing else changes.
    #[test]
    fn a_booked_deferral_of_an_earlier_release_reads_as_a_booking() {
        let old = (0..FIXTURE_BEFORE_SLOT_BOOKED.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FIXTURE_BEFORE_SLOT_BOOKED[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>();
        let read = decode(&old).unwrap();
        let mut expected = sample();
        let deferral = std::sync::Arc::make_mut(&mut expected.events[2]);
        assert_eq!(deferral.code, "deferred");
        assert!(deferral.payment.place().is_some());
        // That release's words for the same deferral.
        deferral.reason = "retry capacity is exhausted (bucket_empty); a slot is booked for \
                           this activity 119.900 s from now: report attempt 3 again then"
            .to_owned();
        assert_eq!(read, expected);
        // Its granted retries still say they took their token.
        assert!(read.events[0].payment.is_token() && read.events[1].payment.is_token());
    }

    /// A record of the release before places in line: its deferral booked
    /// a slot; it reads as a place taken when the deferral was recorded,
    /// and the pending reservation as one taken at its slot.
    #[test]
    fn a_booked_slot_of_an_earlier_release_reads_as_a_place_in_line() {
        let old = (0..FIXTURE_BEFORE_LINES.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FIXTURE_BEFORE_LINES[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>();
        let read = decode(&old).unwrap();
        let expected = sample();
        assert_eq!(read.events.len(), expected.events.len());
        let deferral = &read.events[2];
        assert_eq!(deferral.code, "deferred");
        assert_eq!(
            deferral.payment,
            crate::budget::token::Payment::Turn {
                since_ms: deferral.recorded_at_ms
            }
        );
        assert!(read.events[0].payment.is_token() && read.events[1].payment.is_token());
        assert_eq!(read.events[3], expected.events[3]);
    }

    /// The bytes of `sample()` as the release before field 19 wrote them.
    const FIXTURE_BEFORE_SLOT_BOOKED: &str = concat!(
        "020a0461636d65120e6368617267652d636172643a34321a0477662d372209080510901c1802203c289c9ff1",
        "c2b13430023803420973756363656564656448deedf1c2b1345a8301080110011801209c9ff1c2b13438e80b",
        "400148e80b5084abf1c2b1345801620e7363686564756c655f72657472796a49617474656d70742031206f66",
        "2035206661696c6564207472616e7369656e746c793b206261636b6f66662031353132206d73202831207329",
        "2066726f6d206f636375727265645f61747001900180a0f1c2b1345a910108011002180120ecaef1c2b13430",
        "d00f388419400348841950f0c7f1c2b1345801620e7363686564756c655f72657472796a49617474656d7074",
        "2032206f662035206661696c6564207472616e7369656e746c793b206261636b6f66662033323034206d7320",
        "28332073292066726f6d206f636375727265645f61747001820108687474702d3530339001d0aff1c2b1345a",
        "cd0108011003180120c4e5f1c2b13430a84638c923407848c0a90750848ff9c2b13458066208646566657272",
        "65646a7e72657472792063617061636974792069732065786861757374656420286275636b65745f656d7074",
        "79293b206120736c6f7420697320626f6f6b656420666f722074686973206163746976697479203131392e39",
        "303020732066726f6d206e6f773a207265706f727420617474656d7074203320616761696e207468656e7001",
        "7a0c6275636b65745f656d7074798a010608c0a90710019001a8e6f1c2b1345a370802100320acedf1c2b134",
        "30904e62097375636365656465646a14616e20617474656d7074207375636365656465649001deedf1c2b134",
    );

    /// The bytes of `sample()` as the release before places in line
    /// (fields 21 and 22, `Reservation.waiting_since_ms`) wrote them.
    const FIXTURE_BEFORE_LINES: &str = concat!(
        "020a0461636d65120e6368617267652d636172643a34321a0477662d372209080510901c1802203c289c9ff1",
        "c2b13430023803420973756363656564656448deedf1c2b1345a8301080110011801209c9ff1c2b13438e80b",
        "400148e80b5084abf1c2b1345801620e7363686564756c655f72657472796a49617474656d70742031206f66",
        "2035206661696c6564207472616e7369656e746c793b206261636b6f66662031353132206d73202831207329",
        "2066726f6d206f636375727265645f61747001900180a0f1c2b1345a910108011002180120ecaef1c2b13430",
        "d00f388419400348841950f0c7f1c2b1345801620e7363686564756c655f72657472796a49617474656d7074",
        "2032206f662035206661696c6564207472616e7369656e746c793b206261636b6f66662033323034206d7320",
        "28332073292066726f6d206f636375727265645f61747001820108687474702d3530339001d0aff1c2b1345a",
        "fe0108011003180120c4e5f1c2b13430a84638c923407848c0a90750848ff9c2b13458066208646566657272",
        "65646aad0172657472792063617061636974792069732065786861757374656420286275636b65745f656d70",
        "7479293b206120736c6f7420697320626f6f6b656420666f7220746869732061637469766974793b20746865",
        "207265747279277320706c616e6e65642073746172742c203132302e3030302073206166746572206f636375",
        "727265645f61742c206973206c617465723a207265706f727420617474656d7074203320616761696e207468",
        "656e7a0c6275636b65745f656d7074798a010608c0a90710019001a8e6f1c2b1349801015a370802100320ac",
        "edf1c2b13430904e62097375636365656465646a14616e20617474656d7074207375636365656465649001de",
        "edf1c2b134",
    );

    const FIXTURE: &str = concat!(
        "020a0461636d65120e6368617267652d636172643a34321a0477662d372209080510901c1802203c289c9ff1",
        "c2b13430023803420973756363656564656448deedf1c2b1345a8301080110011801209c9ff1c2b13438e80b",
        "400148e80b5084abf1c2b1345801620e7363686564756c655f72657472796a49617474656d70742031206f66",
        "2035206661696c6564207472616e7369656e746c793b206261636b6f66662031353132206d73202831207329",
        "2066726f6d206f636375727265645f61747001900180a0f1c2b1345a910108011002180120ecaef1c2b13430",
        "d00f388419400348841950f0c7f1c2b1345801620e7363686564756c655f72657472796a49617474656d7074",
        "2032206f662035206661696c6564207472616e7369656e746c793b206261636b6f66662033323034206d7320",
        "28332073292066726f6d206f636375727265645f61747001820108687474702d3530339001d0aff1c2b1345a",
        "fb0108011003180120c4e5f1c2b13430a84638c923407848c0a90750848ff9c2b13458066208646566657272",
        "65646aa20172657472792063617061636974792069732065786861757374656420286275636b65745f656d70",
        "7479293b20697420746f6f6b206120706c61636520696e206c696e653b20746865207265747279277320706c",
        "616e6e65642073746172742c203132302e3030302073206166746572206f636375727265645f61742c206973",
        "206c617465723a207265706f727420617474656d7074203320616761696e207468656e7a0c6275636b65745f",
        "656d7074798a010608c0a90710019001a8e6f1c2b134980101a801a8e6f1c2b1345a370802100320acedf1c2",
        "b13430904e62097375636365656465646a14616e20617474656d7074207375636365656465649001deedf1c2",
        "b134",
    );
}
