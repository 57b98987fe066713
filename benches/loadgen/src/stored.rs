//! The `stored-next-action` scenario: durable reports spread uniformly over the activities a
//! store already holds (the preloaded `pre-00000000` on, each at attempt 1), so reads hit old
//! rows wherever they are. Each activity's next attempt is kept in memory (4 bytes: 40 MB for
//! ten million) and, from run to run, in `--attempts-file`.
//!
//! An activity being reported is out of the draw until its answer comes (its slot holds 0),
//! so no two requests report the same attempt: every answer must be a fresh decision. One
//! refused as unavailable goes back at the same attempt; one whose report failed otherwise
//! stays out (its state unknown), as does one at the policy's last attempt.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::scenario::GENEROUS_MAX_ATTEMPTS;

/// Draws before a request gives up on a free activity (fewer activities than in flight).
const DRAWS: u32 = 1000;

pub struct Stored {
    /// Activity `i`'s next attempt; 0 while one is in flight or once retired.
    next: Box<[AtomicU32]>,
    file: Option<PathBuf>,
    /// Attempts reported, summed, and reports: how long the records have grown.
    attempts_sum: AtomicU64,
    reports: AtomicU64,
}

/// An activity out of the draw while its report is in flight.
pub struct Claim {
    pub index: usize,
    pub attempt: u32,
}

impl Stored {
    /// `activities` activities at the attempts `file` holds, else each at attempt 2.
    pub fn load(activities: u64, file: Option<&Path>) -> io::Result<Self> {
        let n = usize::try_from(activities).map_err(|_| io::Error::other("too many activities"))?;
        let next = match file.map(fs::read) {
            Some(Ok(bytes)) if bytes.len() == n * 4 => bytes
                .chunks_exact(4)
                .map(|b| AtomicU32::new(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            Some(Ok(bytes)) => {
                return Err(io::Error::other(format!(
                    "the attempts file holds {}, not {n}",
                    bytes.len() / 4
                )));
            }
            Some(Err(e)) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => (0..n).map(|_| AtomicU32::new(2)).collect(),
        };
        let file = file.map(Path::to_path_buf);
        let (attempts_sum, reports) = (AtomicU64::new(0), AtomicU64::new(0));
        Ok(Self {
            next,
            file,
            attempts_sum,
            reports,
        })
    }

    /// Takes a uniformly random free activity.
    pub fn claim(&self, rng: &mut Rng) -> Option<Claim> {
        let n = self.next.len() as u64;
        if n == 0 {
            return None;
        }
        for _ in 0..DRAWS {
            let index = usize::try_from(rng.below(n)).ok()?;
            let attempt = self.next[index].swap(0, Ordering::AcqRel);
            // Taken, or retired (the policy's last attempt closed it).
            if attempt == 0 || attempt >= GENEROUS_MAX_ATTEMPTS {
                continue;
            }
            self.attempts_sum
                .fetch_add(u64::from(attempt), Ordering::Relaxed);
            self.reports.fetch_add(1, Ordering::Relaxed);
            return Some(Claim { index, attempt });
        }
        None
    }

    /// Puts a claimed activity back: at its next attempt when the report was decided, at the
    /// same one when refused as unavailable (nothing acknowledged; a replay, should the
    /// refused save have landed, counts as an error), retired otherwise (counted in the
    /// report's errors).
    pub fn release(&self, claim: Claim, outcome: &Result<(), String>) {
        match outcome {
            Ok(()) => self.next[claim.index].store(claim.attempt + 1, Ordering::Release),
            Err(key) if key == "Unavailable" => {
                self.next[claim.index].store(claim.attempt, Ordering::Release)
            }
            Err(_) => {}
        }
    }

    /// Writes the attempts to the file, if there is one.
    pub fn save(&self) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let bytes: Vec<u8> = self
            .next
            .iter()
            .flat_map(|a| a.load(Ordering::Acquire).to_le_bytes())
            .collect();
        let partial = file.with_extension("partial");
        fs::write(&partial, bytes)?;
        fs::rename(partial, file)
    }

    /// The activities and the mean attempt reported.
    pub fn write_into(&self, report: &mut Value) {
        let reports = self.reports.load(Ordering::Relaxed).max(1) as f64;
        report["stored_activities"] = json!(self.next.len());
        report["mean_attempt"] = json!(self.attempts_sum.load(Ordering::Relaxed) as f64 / reports);
    }
}

/// xorshift64*: a uniform enough draw, one generator a virtual client.
pub struct Rng(u64);

impl Rng {
    /// Seeded through splitmix64, so that neighbouring seeds diverge.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    /// A number in `0..n` (`n` > 0); the multiply-shift's bias is below one in four billion
    /// for ten million activities.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((u128::from(self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_activity_is_out_of_the_draw_until_released() {
        let stored = Stored::load(2, None).unwrap();
        let mut rng = Rng::new(7);
        let (a, b) = (
            stored.claim(&mut rng).unwrap(),
            stored.claim(&mut rng).unwrap(),
        );
        assert_ne!(a.index, b.index);
        assert_eq!((a.attempt, b.attempt), (2, 2));
        assert!(stored.claim(&mut rng).is_none());
        let (a_index, b_index) = (a.index, b.index);
        stored.release(a, &Ok(()));
        let a = stored.claim(&mut rng).unwrap();
        assert_eq!((a.index, a.attempt), (a_index, 3));
        // Refused as unavailable: back at the same attempt; any other failure retires it.
        stored.release(b, &Err("Unavailable".into()));
        let b = stored.claim(&mut rng).unwrap();
        assert_eq!((b.index, b.attempt), (b_index, 2));
        stored.release(b, &Err("unexpected_replay".into()));
        stored.release(a, &Err("Internal".into()));
        assert!(stored.claim(&mut rng).is_none());
    }

    #[test]
    fn draws_cover_the_range_evenly() {
        let (mut rng, mut counts) = (Rng::new(42), [0u32; 10]);
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
