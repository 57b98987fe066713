//! How an activity record is written down, in the journal and in the
//! database: one format byte, then the record.
//!
//! - `0x01`: MessagePack with structs as arrays (`rmp-serde`), about a third
//!   of the JSON size and three times faster to encode or decode (see
//!   BENCHMARKS.md). Fields are found by position, so the rule for changing
//!   [`ActivityRecord`] and what it holds is the protobuf rule: **add fields
//!   only at the end of a struct, with `#[serde(default)]`; never remove,
//!   reorder or retype one; never rename an enum variant** (variants are
//!   written by name). `stored_format_is_stable` below fails when a change
//!   breaks what is already stored.
//! - `{`: JSON, as the first versions stored records; still read, never
//!   written.

use crate::budget::activity::ActivityRecord;

/// The format byte of MessagePack records.
const MSGPACK: u8 = 0x01;

/// Appends `record` to `out`, format byte first.
///
/// # Errors
/// The encoder's message; it does not fail for records the state machine
/// builds.
pub fn encode_into(record: &ActivityRecord, out: &mut Vec<u8>) -> Result<(), String> {
    out.push(MSGPACK);
    rmp_serde::encode::write(out, record).map_err(|e| e.to_string())
}

/// Reads a record written by [`encode_into`] (or a JSON record of the first
/// versions).
///
/// # Errors
/// What is wrong with the bytes.
pub fn decode(bytes: &[u8]) -> Result<ActivityRecord, String> {
    match bytes.first() {
        Some(&MSGPACK) => rmp_serde::from_slice(&bytes[1..]).map_err(|e| e.to_string()),
        Some(b'{') => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        Some(other) => Err(format!("unknown record format 0x{other:02x}")),
        None => Err("empty record".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::activity::{
        ActivityKey, Defaults, Plan, Policy, Report, Status, plan, record_success,
    };
    use crate::budget::hint::RawHints;
    use crate::budget::{Admission, ErrorClass};

    /// A record with every kind of field filled: decisions with and without
    /// hints and rules, then a success.
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
            };
            match plan(record.take(), &key, &report, &defaults, now).expect("valid") {
                Plan::Fresh(mut draft) => {
                    if draft.wants_token() {
                        let admission = if defer {
                            Admission::Deferred {
                                wait: std::time::Duration::from_millis(500),
                                reason: "bucket_empty",
                            }
                        } else {
                            Admission::Granted
                        };
                        draft.settle(admission, now);
                    }
                    record = Some(draft.finish().0);
                }
                Plan::Replay(_) => unreachable!(),
            }
        }
        record_success(record.expect("planned"), Some(at + 9900), at + 9950).expect("open")
    }

    #[test]
    fn records_round_trip() {
        let record = sample();
        assert_eq!(record.status, Status::Closed);
        let mut bytes = Vec::new();
        encode_into(&record, &mut bytes).unwrap();
        assert_eq!(bytes[0], MSGPACK);
        assert_eq!(decode(&bytes).unwrap(), record);
        let json = serde_json::to_vec(&record).unwrap();
        assert!(
            bytes.len() * 2 < json.len(),
            "{} vs {}",
            bytes.len(),
            json.len()
        );
    }

    #[test]
    fn json_records_of_the_first_versions_are_read() {
        let record = sample();
        let json = serde_json::to_vec(&record).unwrap();
        assert_eq!(decode(&json).unwrap(), record);
    }

    #[test]
    fn bad_bytes_are_refused() {
        assert_eq!(decode(b"").unwrap_err(), "empty record");
        assert_eq!(
            decode(b"\x07abc").unwrap_err(),
            "unknown record format 0x07"
        );
        assert!(decode(b"\x01\x93\x01").is_err());
        assert!(decode(b"{\"tenant\":").is_err());
    }

    /// The bytes of `sample()` as this version writes them. If this fails,
    /// a change made records already stored unreadable, or changed how
    /// they are written: follow the rule in the module's documentation, and
    /// update the bytes only for an addition that old records still decode
    /// under (check with the old bytes before replacing them).
    #[test]
    fn stored_format_is_stable() {
        let mut bytes = Vec::new();
        encode_into(&sample(), &mut bytes).unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, FIXTURE, "the stored format changed");
        let old = (0..FIXTURE.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&FIXTURE[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>();
        assert_eq!(decode(&old).unwrap(), sample());
    }

    const FIXTURE: &str = concat!(
        "019ba461636d65ae6368617267652d636172643a3432a477662d379405cd0e10023ccf000001a3185c4f9c02",
        "a6436c6f736564a9737563636565646564cf000001a3185c76dec094dc0012a84465636973696f6e01a95472",
        "616e7369656e74cf000001a3185c4f9cc200cd05e801cd05e8cf000001a3185c5584ad5363686564756c6552",
        "65747279ae7363686564756c655f7265747279d949617474656d70742031206f662035206661696c65642074",
        "72616e7369656e746c793b206261636b6f66662031353132206d732028312073292066726f6d206f63637572",
        "7265645f6174c3c0c0c0cf000001a3185c5000dc0012a84465636973696f6e02a95472616e7369656e74cf00",
        "0001a3185c576cc2cd07d0cd0c8403cd0c84cf000001a3185c63f0ad5363686564756c655265747279ae7363",
        "686564756c655f7265747279d949617474656d70742032206f662035206661696c6564207472616e7369656e",
        "746c793b206261636b6f66662033323034206d732028332073292066726f6d206f636375727265645f6174c3",
        "c0a8687474702d353033c0cf000001a3185c57d0dc0012a84465636973696f6e03a95472616e7369656e74cf",
        "000001a3185c72c4c2cd2328cd11c978ce0001d4c0cf000001a3185e4784a84465666572726564a864656665",
        "72726564d97e72657472792063617061636974792069732065786861757374656420286275636b65745f656d",
        "707479293b206120736c6f7420697320626f6f6b656420666f72207468697320616374697669747920313139",
        "2e39303020732066726f6d206e6f773a207265706f727420617474656d7074203320616761696e207468656e",
        "c3ac6275636b65745f656d707479c095ce0001d4c0b372657472795f61667465725f7365636f6e6473c2c293",
        "c2c2c2cf000001a3185c7328dc0012a75375636365737303c0cf000001a3185c76acc2cd2710000000c0c0a9",
        "737563636565646564b4616e20617474656d707420737563636565646564c2c0c0c0cf000001a3185c76de",
    );
}
