//! Draws from a world's generator that are hot enough to batch.

use rand::distributions::uniform::SampleRange;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Words drawn per call to the generator.
const BLOCK: usize = 64;

/// Random bytes, as many as an `i32` drawn from `counts`: the draws of
/// `(0..rng.gen_range(counts)).map(|_| rng.gen::<u8>())`, the way the
/// worlds always drew them. The count's type is part of the draw (a
/// `usize` count takes other draws and makes other worlds), so it is
/// fixed here rather than at each caller.
pub(crate) fn bytes(rng: &mut ChaCha8Rng, counts: impl SampleRange<i32>) -> Vec<u8> {
    let n: i32 = rng.gen_range(counts);
    random_bytes(rng, n as usize)
}

/// `n` random bytes: exactly the draws of `(0..n).map(|_| rng.gen::<u8>())`
/// — each byte the low byte of one `next_u32`, so the worlds stay the same
/// — but taken a block of words at a time instead of one call per byte.
fn random_bytes(rng: &mut ChaCha8Rng, n: usize) -> Vec<u8> {
    let mut words = [0u32; BLOCK];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let chunk = &mut words[..(n - out.len()).min(BLOCK)];
        rng.fill(chunk);
        out.extend(chunk.iter().map(|&w| w as u8));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{bytes, random_bytes};
    use proptest::prelude::{prop_assert_eq, proptest};
    use rand::{Rng as _, RngCore as _, SeedableRng as _};
    use rand_chacha::ChaCha8Rng;

    proptest! {
        /// Same bytes as one `gen::<u8>()` per byte, and the generator left
        /// in the same state, from any position within its block.
        #[test]
        fn random_bytes_draws_as_one_gen_per_byte(seed: u64, skip in 0usize..40, n in 0usize..600) {
            let mut a = ChaCha8Rng::seed_from_u64(seed);
            let mut b = a.clone();
            for _ in 0..skip {
                a.next_u32();
                b.next_u32();
            }
            let want: Vec<u8> = (0..n).map(|_| a.gen::<u8>()).collect();
            prop_assert_eq!(random_bytes(&mut b, n), want);
            prop_assert_eq!(a.next_u64(), b.next_u64());
        }

        /// A count drawn as the `i32` the worlds always drew, then as many
        /// bytes, over exclusive and inclusive ranges.
        #[test]
        fn bytes_draws_an_i32_count_then_the_bytes(seed: u64, lo in 0i32..300, span in 1i32..300, inclusive: bool) {
            let mut a = ChaCha8Rng::seed_from_u64(seed);
            let mut b = a.clone();
            let (n, got): (i32, _) = if inclusive {
                (a.gen_range(lo..=lo + span), bytes(&mut b, lo..=lo + span))
            } else {
                (a.gen_range(lo..lo + span), bytes(&mut b, lo..lo + span))
            };
            let want: Vec<u8> = (0..n).map(|_| a.gen::<u8>()).collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(a.next_u64(), b.next_u64());
        }
    }
}
