//! Length-prefixed frames: a 4-byte big-endian length, then that many bytes
//! of payload (seed 000, "JSON primary").
//!
//! The decoder is incremental: bytes may arrive one at a time or many frames
//! at once. A length prefix above the configured maximum is refused as soon
//! as its four bytes are in, before anything is allocated for it.

use std::fmt;

/// Largest payload accepted by default (seed 000 leaves it open; 1 MiB holds
/// a 4096-byte base64 chunk hundreds of times over).
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Bytes in the length prefix.
pub const HEADER_LEN: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix announced more than the configured maximum.
    Oversized { len: u64, max: usize },
    /// A skipping decoder ([`FrameDecoder::skipping`]) passed over a frame
    /// of `len` bytes, above its maximum; `head` is its first bytes (at
    /// most [`SKIP_HEAD`]), enough to read whose answer it was. The stream
    /// keeps its framing: decoding goes on after it.
    Skipped { len: u64, max: usize, head: Vec<u8> },
}

/// Bytes of a skipped frame kept for its reader.
pub const SKIP_HEAD: usize = 256;

/// A decoder whose buffer grew past this for one large frame gives the
/// memory back once the frame is out, so an idle connection that once sent
/// a big frame holds next to nothing.
const KEEP_CAPACITY: usize = 64 * 1024;

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Oversized { len, max } => {
                write!(f, "frame length {len} exceeds the maximum of {max} bytes")
            }
            FrameError::Skipped { len, max, .. } => {
                write!(f, "frame of {len} bytes exceeds the maximum of {max} bytes and was skipped")
            }
        }
    }
}

impl std::error::Error for FrameError {}

#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Bytes of `buf` before `start` are already consumed.
    start: usize,
    max: usize,
    failed: Option<FrameError>,
    /// Skip oversized frames instead of failing (see [`FrameDecoder::skipping`]).
    skips: bool,
    /// Bytes of a skipped frame still to discard.
    skip_left: u64,
}

impl FrameDecoder {
    pub fn new(max: usize) -> Self {
        FrameDecoder { buf: Vec::new(), start: 0, max, failed: None, skips: false, skip_left: 0 }
    }

    /// A decoder that passes over a frame above `max` without buffering it
    /// (reporting it once as [`FrameError::Skipped`]) and goes on with the
    /// next: for a stream whose sender is trusted to keep its framing (a
    /// nested airlock's upstream), where one oversized message must not
    /// cost the whole link.
    pub fn skipping(max: usize) -> Self {
        FrameDecoder { skips: true, ..FrameDecoder::new(max) }
    }

    /// Append received bytes. Call [`FrameDecoder::next_frame`] until it
    /// yields `Ok(None)` before pushing more, which bounds the buffer to one
    /// partial frame plus what was pushed.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        let mut bytes = bytes;
        if self.skip_left > 0 {
            let n = usize::try_from(self.skip_left).unwrap_or(usize::MAX).min(bytes.len());
            self.skip_left -= n as u64;
            bytes = &bytes[n..];
        }
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete payload, if one is buffered. After an error the
    /// decoder stays failed: the stream has lost its framing for good.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let avail = &self.buf[self.start..];
        let Some(header) = avail.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header);
        if u64::from(len) > self.max as u64 && self.skips {
            let total = HEADER_LEN + len as usize;
            let keep = SKIP_HEAD.min(len as usize);
            if avail.len() < (HEADER_LEN + keep) {
                return Ok(None);
            }
            let head = avail[HEADER_LEN..HEADER_LEN + keep].to_vec();
            let here = avail.len().min(total);
            self.skip_left = (total - here) as u64;
            self.start += here;
            self.release();
            return Err(FrameError::Skipped { len: u64::from(len), max: self.max, head });
        }
        if u64::from(len) > self.max as u64 {
            let err = FrameError::Oversized { len: u64::from(len), max: self.max };
            self.failed = Some(err.clone());
            self.buf = Vec::new();
            self.start = 0;
            return Err(err);
        }
        let len = len as usize;
        if avail.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = avail[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.start += HEADER_LEN + len;
        self.release();
        Ok(Some(payload))
    }

    /// Drop consumed bytes once nothing is left after them, and give back
    /// a large buffer's memory.
    fn release(&mut self) {
        if self.start == self.buf.len() {
            if self.buf.capacity() > KEEP_CAPACITY {
                self.buf = Vec::new();
            } else {
                self.buf.clear();
            }
            self.start = 0;
        }
    }

    /// Bytes of memory the decoder holds (its buffer's capacity).
    pub fn held(&self) -> usize {
        self.buf.capacity()
    }

    /// Whether a partial frame is buffered (EOF now would cut a frame).
    pub fn has_partial(&self) -> bool {
        self.failed.is_none() && self.start < self.buf.len()
    }

    /// Bytes held for a frame not yet complete.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Append one frame carrying `payload` to `out`.
///
/// # Panics
/// Never for payloads this crate builds; a payload over 4 GiB cannot be
/// framed and is a bug of the caller.
pub fn encode_into(payload: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(payload.len()).expect("frame payload exceeds u32::MAX");
    out.reserve(HEADER_LEN + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
}

/// What [`encode_with`] reserves before writing: room for the usual
/// answer (an error's message, a handle, a count), so that writing it does
/// not grow the vector step by step.
const ANSWER_CAPACITY: usize = 256;

/// One frame whose payload `write` appends to the buffer it is handed,
/// written in place behind the header (no copy of the payload).
pub fn encode_with(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(ANSWER_CAPACITY);
    out.extend_from_slice(&[0; HEADER_LEN]);
    write(&mut out);
    let len = u32::try_from(out.len() - HEADER_LEN).expect("frame payload exceeds u32::MAX");
    out[..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    out
}

/// One frame carrying `payload`.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    encode_into(payload, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_frame_written_in_place_is_the_frame_of_its_payload() {
        for payload in [&b""[..], b"{}", &[7u8; 70_000][..]] {
            assert_eq!(encode_with(|out| out.extend_from_slice(payload)), encode(payload));
        }
    }

    fn decode_all(dec: &mut FrameDecoder) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut frames = Vec::new();
        while let Some(f) = dec.next_frame()? {
            frames.push(f);
        }
        Ok(frames)
    }

    #[test]
    fn oversized_prefix_is_refused_before_payload_arrives() {
        let mut dec = FrameDecoder::new(16);
        dec.push(&17u32.to_be_bytes());
        assert_eq!(dec.next_frame(), Err(FrameError::Oversized { len: 17, max: 16 }));
        // Stays failed; nothing more is buffered.
        dec.push(&[0; 64]);
        assert_eq!(dec.buffered(), 0);
        assert!(dec.next_frame().is_err());
    }

    #[test]
    fn max_length_exactly_is_accepted() {
        let mut dec = FrameDecoder::new(3);
        dec.push(&encode(b"abc"));
        assert_eq!(dec.next_frame(), Ok(Some(b"abc".to_vec())));
        assert_eq!(dec.next_frame(), Ok(None));
        assert!(!dec.has_partial());
    }

    #[test]
    fn empty_payload_round_trips() {
        let mut dec = FrameDecoder::new(8);
        dec.push(&encode(b""));
        assert_eq!(dec.next_frame(), Ok(Some(Vec::new())));
    }

    #[test]
    fn partial_header_is_partial() {
        let mut dec = FrameDecoder::new(8);
        dec.push(&[0, 0]);
        assert_eq!(dec.next_frame(), Ok(None));
        assert!(dec.has_partial());
    }

    proptest! {
        #[test]
        fn round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let mut stream = Vec::new();
            for p in &payloads {
                encode_into(p, &mut stream);
            }
            let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
            dec.push(&stream);
            prop_assert_eq!(decode_all(&mut dec).unwrap(), payloads);
            prop_assert!(!dec.has_partial());
        }

        #[test]
        fn any_split_decodes_to_the_same_frames(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..12),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        ) {
            let mut stream = Vec::new();
            for p in &payloads {
                encode_into(p, &mut stream);
            }
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            points.push(0);
            points.push(stream.len());
            points.sort_unstable();
            let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            for w in points.windows(2) {
                dec.push(&stream[w[0]..w[1]]);
                got.extend(decode_all(&mut dec).unwrap());
            }
            prop_assert_eq!(got, payloads);
        }

        #[test]
        fn never_buffers_more_than_one_frame_beyond_input(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..64)) {
            let mut dec = FrameDecoder::new(256);
            for c in &chunks {
                dec.push(c);
                let _ = decode_all(&mut dec);
                prop_assert!(dec.buffered() < HEADER_LEN + 256);
            }
        }
    }
}
