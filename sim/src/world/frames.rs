//! Frames on the simulated pipes: written by the clients, split out of
//! what a machine sends for the checkers (independently of the core's
//! decoder).

use airlock_core::codec::frame::HEADER_LEN;

/// What a machine sent, split into frames as it arrives.
#[derive(Debug, Default)]
pub(super) struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// The frames `data` completes: the bytes holding them, whole frames
    /// for the first `usize` of them (read with [`payloads`]). A delivery
    /// of whole frames (the usual one) is split where it lies, not copied;
    /// only a partial frame is kept.
    pub(super) fn push(&mut self, data: Vec<u8>) -> (Vec<u8>, usize) {
        let bytes = if self.buf.is_empty() {
            data
        } else {
            self.buf.extend_from_slice(&data);
            std::mem::take(&mut self.buf)
        };
        let whole = payloads(&bytes).map(|p| HEADER_LEN + p.len()).sum();
        self.buf.extend_from_slice(&bytes[whole..]);
        (bytes, whole)
    }
}

/// The payloads of the frames at the start of `bytes`, up to the first
/// that is not whole.
pub(super) fn payloads(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let (head, tail) = rest.split_first_chunk::<HEADER_LEN>()?;
        let (payload, next) = tail.split_at_checked(u32::from_be_bytes(*head) as usize)?;
        rest = next;
        Some(payload)
    })
}

/// `payload` behind its length: in place, within the room a request's
/// buffer is written with, rather than copied into a buffer of its own.
pub(super) fn frame(mut payload: Vec<u8>) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    payload.splice(..0, len);
    payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// However a stream of frames is cut into deliveries, the payloads
        /// come out whole, once each and in order, and a cut frame waits
        /// for its rest.
        #[test]
        fn any_cut_gives_the_payloads_in_order(
            payloads_in in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..12),
            cuts in proptest::collection::vec(0usize..200, 0..12),
        ) {
            let stream: Vec<u8> = payloads_in.iter().flat_map(|p| frame(p.clone())).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            let (mut frames, mut out, mut from) = (Frames::default(), Vec::new(), 0);
            for to in cuts {
                let (bytes, whole) = frames.push(stream[from..to].to_vec());
                prop_assert!(whole <= bytes.len());
                out.extend(payloads(&bytes[..whole]).map(<[u8]>::to_vec));
                from = to;
            }
            prop_assert_eq!(out, payloads_in);
            prop_assert!(frames.buf.is_empty());
        }
    }

    #[test]
    fn a_frame_is_its_length_then_its_payload() {
        assert_eq!(frame(b"abc".to_vec()), b"\0\0\0\x03abc");
        assert_eq!(frame(Vec::new()), [0, 0, 0, 0]);
        // A cut header or payload is no frame yet.
        assert_eq!(payloads(b"\0\0\0\x03ab").count(), 0);
        assert_eq!(payloads(b"\0\0").count(), 0);
    }
}
