//! The `stored-next-action` scenario: durable reports over activities a
//! store already holds, spread uniformly over all of them, so that reads hit
//! old rows wherever they are rather than the few the run just wrote.
//!
//! The activities are the preloaded ones (`pre-00000000` on, see
//! [`crate::preload`]), each at attempt 1 when preloaded. The generator
//! keeps each one's next attempt in memory (4 bytes an activity: 40 MB for
//! ten million) and, between runs against the same store, in
//! `--attempts-file`, so a later run goes on where the last one stopped.
//!
//! An activity being reported is taken out of the draw until its answer
//! comes (its slot holds 0), so two requests in flight never report the
//! same attempt: every answer must be a fresh decision, as in the durable
//! scenario. An activity refused as unavailable goes back at the same
//! attempt; one whose report failed otherwise stays out (its state is
//! unknown), as does one that reached the policy's last attempt.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::scenario::GENEROUS_MAX_ATTEMPTS;

/// Draws before a request gives up on finding a free activity (all taken
/// or retired: only possible with fewer activities than requests in flight).
const DRAWS: u32 = 1000;

/// The next attempt of every stored activity, shared by the virtual clients.
pub struct Stored {
    /// Activity `i`'s next attempt to report; 0 while one is in flight or
    /// after it was retired.
    next: Box<[AtomicU32]>,
    /// Where the attempts are kept between runs, if anywhere.
    file: Option<PathBuf>,
    /// Attempts reported, summed, and reports, for the mean attempt: how
    /// long the records read and written have grown.
    attempts_sum: AtomicU64,
    reports: AtomicU64,
    /// Activities retired in this run (a failed report).
    retired: AtomicU64,
}

/// An activity taken out of the draw while its report is in flight.
pub struct Claim {
    /// Its index: the activity is `pre-{index:08}`.
    pub index: usize,
    /// The attempt to report.
    pub attempt: u32,
}

impl Stored {
    /// `activities` activities, at the attempts `file` holds if it exists,
    /// else each at attempt 2 (the one after the preloaded first failure).
    ///
    /// # Errors
    /// When `file` cannot be read, or holds another number of activities.
    pub fn load(activities: u64, file: Option<&Path>) -> io::Result<Self> {
        let n = usize::try_from(activities)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many activities"))?;
        let next: Box<[AtomicU32]> = match file.map(fs::read) {
            Some(Ok(bytes)) => {
                if bytes.len() != n * 4 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} holds {} activities, not {n}",
                            file.map_or_else(String::new, |f| f.display().to_string()),
                            bytes.len() / 4
                        ),
                    ));
                }
                bytes
                    .chunks_exact(4)
                    .map(|b| AtomicU32::new(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect()
            }
            Some(Err(e)) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => (0..n).map(|_| AtomicU32::new(2)).collect(),
        };
        Ok(Self {
            next,
            file: file.map(Path::to_path_buf),
            attempts_sum: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            retired: AtomicU64::new(0),
        })
    }

    /// Takes a uniformly random activity that is free, drawing with `rng`.
    pub fn claim(&self, rng: &mut Rng) -> Option<Claim> {
        let n = self.next.len() as u64;
        if n == 0 {
            return None;
        }
        for _ in 0..DRAWS {
            let index = usize::try_from(rng.below(n)).ok()?;
            let attempt = self.next[index].swap(0, Ordering::AcqRel);
            if attempt == 0 {
                continue;
            }
            if attempt >= GENEROUS_MAX_ATTEMPTS {
                // The policy's last attempt closes the activity: retired.
                continue;
            }
            self.attempts_sum
                .fetch_add(u64::from(attempt), Ordering::Relaxed);
            self.reports.fetch_add(1, Ordering::Relaxed);
            return Some(Claim { index, attempt });
        }
        None
    }

    /// Puts a claimed activity back: at its next attempt when the report
    /// was decided, at the same one when the server refused it as
    /// unavailable (nothing acknowledged: asking again is safe, and a
    /// replay, should the refused save have landed, counts as an error),
    /// retired otherwise.
    pub fn release(&self, claim: Claim, outcome: &Result<(), String>) {
        match outcome {
            Ok(()) => self.next[claim.index].store(claim.attempt + 1, Ordering::Release),
            Err(key) if key == "Unavailable" => {
                self.next[claim.index].store(claim.attempt, Ordering::Release);
            }
            Err(_) => {
                self.retired.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Writes the attempts to the file, if there is one.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn save(&self) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut bytes = Vec::with_capacity(self.next.len() * 4);
        for next in &self.next {
            bytes.extend_from_slice(&next.load(Ordering::Acquire).to_le_bytes());
        }
        let partial = file.with_extension("partial");
        fs::write(&partial, bytes)?;
        fs::rename(partial, file)
    }

    /// What the run's report adds: the activities, the mean attempt
    /// reported, the activities retired.
    pub fn write_into(&self, report: &mut Value) {
        let reports = self.reports.load(Ordering::Relaxed);
        report["stored_activities"] = json!(self.next.len());
        report["mean_attempt"] =
            json!(self.attempts_sum.load(Ordering::Relaxed) as f64 / reports.max(1) as f64);
        report["retired"] = json!(self.retired.load(Ordering::Relaxed));
    }
}

/// xorshift64*: a uniform enough draw of activities, one a virtual client,
/// with no shared state.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (any value; 0 is mapped away).
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that neighbouring seeds diverge.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    /// A number in `0..n` (`n` > 0); the bias of the multiply-shift is
    /// below one in four billion for ten million activities.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((u128::from(x) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_activity_is_not_drawn_again_until_released() {
        let stored = Stored::load(2, None).unwrap();
        let mut rng = Rng::new(7);
        let a = stored.claim(&mut rng).unwrap();
        let b = stored.claim(&mut rng).unwrap();
        assert_ne!(a.index, b.index);
        assert_eq!((a.attempt, b.attempt), (2, 2));
        assert!(stored.claim(&mut rng).is_none());
        let index = a.index;
        stored.release(a, &Ok(()));
        let again = stored.claim(&mut rng).unwrap();
        assert_eq!((again.index, again.attempt), (index, 3));
        // A refusal as unavailable puts it back at the same attempt; any
        // other failure retires it.
        let b_index = b.index;
        stored.release(b, &Err("Unavailable".into()));
        let b = stored.claim(&mut rng).unwrap();
        assert_eq!((b.index, b.attempt), (b_index, 2));
        stored.release(b, &Err("unexpected_replay".into()));
        stored.release(again, &Err("Internal".into()));
        assert!(stored.claim(&mut rng).is_none());
    }

    #[test]
    fn attempts_survive_a_save_and_a_load() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("attempts");
        let stored = Stored::load(3, Some(&file)).unwrap();
        let mut rng = Rng::new(1);
        let claim = stored.claim(&mut rng).unwrap();
        let index = claim.index;
        stored.release(claim, &Ok(()));
        stored.save().unwrap();
        let loaded = Stored::load(3, Some(&file)).unwrap();
        let attempts: Vec<u32> = loaded
            .next
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        let mut expected = vec![2, 2, 2];
        expected[index] = 3;
        assert_eq!(attempts, expected);
        assert!(Stored::load(4, Some(&file)).is_err());
    }

    #[test]
    fn draws_cover_the_range_evenly() {
        let mut rng = Rng::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[usize::try_from(rng.below(10)).unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
