//! How the embedded store lays its keys out in fjall, so that the records
//! of a tenant sort together and the purge index sorts by time:
//!
//! - `activities`: [`activity`] key -> the record, encoded by
//!   [`codec`](crate::store::codec) (a format byte, then protobuf);
//! - `purge_index`: [`purge`] key (purgeable time, then the activity key)
//!   -> nothing, so the retention sweep finds expired records without
//!   scanning them all;
//! - `paces`: a dependency's name -> its pace (`codec::encode_pace`);
//! - `meta`: [`COUNT`] -> how many activities are kept (a `u64`, big
//!   endian), kept by the writer in the batch that changes it.

use crate::budget::activity::ActivityKey;

/// The `meta` key of the number of activities kept.
pub const COUNT: &[u8] = b"count";

/// `(tenant, activity_id)` as one key: the tenant's length (two bytes, big
/// endian), the tenant, the id. The length prefix keeps any byte in either
/// part unambiguous.
pub fn activity(tenant: &str, activity_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + tenant.len() + activity_id.len());
    activity_into(tenant, activity_id, &mut key);
    key
}

fn activity_into(tenant: &str, activity_id: &str, key: &mut Vec<u8>) {
    // Tenants are validated to far fewer than 65,536 bytes at the edge; the
    // saturation only keeps a malformed one from wrapping into another's.
    let len = u16::try_from(tenant.len()).unwrap_or(u16::MAX);
    key.extend_from_slice(&len.to_be_bytes());
    key.extend_from_slice(tenant.as_bytes());
    key.extend_from_slice(activity_id.as_bytes());
}

/// The activity key back from its bytes; `None` if they are not one.
pub fn parse_activity(key: &[u8]) -> Option<ActivityKey> {
    let (len, rest) = key.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_be_bytes(*len));
    if rest.len() < len {
        return None;
    }
    let (tenant, id) = rest.split_at(len);
    Some(ActivityKey {
        tenant: String::from_utf8(tenant.to_vec()).ok()?,
        activity_id: String::from_utf8(id.to_vec()).ok()?,
    })
}

/// A purge index key: `at` (milliseconds, ordered as signed), then the
/// activity key.
pub fn purge(at: i64, tenant: &str, activity_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(10 + tenant.len() + activity_id.len());
    key.extend_from_slice(&ordered(at));
    activity_into(tenant, activity_id, &mut key);
    key
}

/// The first purge index key at `at` or later.
pub fn purge_from(at: i64) -> [u8; 8] {
    ordered(at)
}

/// The activity key part of a purge index key.
pub fn activity_of_purge(key: &[u8]) -> Option<&[u8]> {
    key.get(8..)
}

/// `at` as bytes that sort as the signed number does.
fn ordered(at: i64) -> [u8; 8] {
    ((at as u64) ^ (1 << 63)).to_be_bytes()
}

/// A count as `meta` keeps it.
pub fn count_bytes(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// A count back from `meta`; a value of another length counts as none.
pub fn parse_count(bytes: &[u8]) -> u64 {
    bytes.try_into().map(u64::from_be_bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_activity_key_reads_back_whatever_its_parts_hold() {
        for (tenant, id) in [("a", "b"), ("", "x"), ("t\0/", "\0id"), ("tenant", "")] {
            let key = parse_activity(&activity(tenant, id)).unwrap();
            assert_eq!(
                (key.tenant.as_str(), key.activity_id.as_str()),
                (tenant, id)
            );
        }
        // "ab"+"c" and "a"+"bc" are different activities.
        assert_ne!(activity("ab", "c"), activity("a", "bc"));
    }

    #[test]
    fn purge_keys_sort_by_time_negative_ones_first() {
        let mut keys = [-5i64, 0, 3, i64::MIN, i64::MAX, -1]
            .map(|at| purge(at, "t", "a"))
            .to_vec();
        keys.sort();
        let times: Vec<i64> = keys
            .iter()
            .map(|k| (u64::from_be_bytes(k[..8].try_into().unwrap()) ^ (1 << 63)) as i64)
            .collect();
        assert_eq!(times, [i64::MIN, -5, -1, 0, 3, i64::MAX]);
        assert!(purge(3, "t", "a").as_slice() >= purge_from(3).as_slice());
        assert!(purge(2, "zz", "zz").as_slice() < purge_from(3).as_slice());
        assert_eq!(
            activity_of_purge(&purge(9, "t", "a")),
            Some(&activity("t", "a")[..])
        );
    }
}
