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

/// A payload from [`FrameDecoder::next_from`]: borrowed from the input it
/// was given when the whole frame was there, else taken from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload<'d> {
    Input(&'d [u8]),
    Buffered(Vec<u8>),
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Payload::Input(b) => b,
            Payload::Buffered(v) => v,
        }
    }
}

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
            return Err(self.fail_oversized(len));
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

    /// What [`FrameDecoder::push`] of `input` and then
    /// [`FrameDecoder::next_frame`] would give, taking from `input` only
    /// what that frame needs: a frame wholly in `input` is handed out as a
    /// slice of it, not copied, and `input` is advanced past it; a frame
    /// begun in an earlier push is completed from `input` and handed out
    /// from the buffer. So only a frame not yet complete is ever buffered,
    /// and [`FrameDecoder::buffered`] counts just its bytes. Once this
    /// gives `Ok(None)` or an error, all of `input` has been taken (as
    /// `push` would have taken it): call it until then before giving it
    /// more. Frames, errors, and what is buffered once `input` is spent
    /// are those of `push` and `next_frame` for every chunking.
    pub fn next_from<'d>(&mut self, input: &mut &'d [u8]) -> Result<Option<Payload<'d>>, FrameError> {
        if self.skips || self.failed.is_some() {
            self.push(std::mem::take(input));
            return Ok(self.next_frame()?.map(Payload::Buffered));
        }
        if self.start < self.buf.len() {
            self.complete_from(input);
            let next = self.next_frame();
            if !matches!(next, Ok(Some(_))) {
                // Incomplete, so all of `input` went into the buffer; or
                // failed, and what `push` would have buffered is gone.
                *input = &[];
            }
            return Ok(next?.map(Payload::Buffered));
        }
        let bytes: &'d [u8] = input;
        let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
            if !bytes.is_empty() {
                self.push(std::mem::take(input));
            }
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header);
        if u64::from(len) > self.max as u64 {
            *input = &[];
            return Err(self.fail_oversized(len));
        }
        let end = HEADER_LEN + len as usize;
        let Some(payload) = bytes.get(HEADER_LEN..end) else {
            self.push(std::mem::take(input));
            return Ok(None);
        };
        *input = &bytes[end..];
        Ok(Some(Payload::Input(payload)))
    }

    /// Move from `input` into the buffer what the first buffered frame
    /// still lacks: its header's missing bytes, then its payload's, and
    /// nothing for a frame above the maximum (refused as it stands).
    fn complete_from(&mut self, input: &mut &[u8]) {
        loop {
            let avail = &self.buf[self.start..];
            let want = match avail.first_chunk::<HEADER_LEN>() {
                None => HEADER_LEN - avail.len(),
                Some(header) => {
                    let len = u32::from_be_bytes(*header);
                    if u64::from(len) > self.max as u64 {
                        return;
                    }
                    (HEADER_LEN + len as usize).saturating_sub(avail.len())
                }
            };
            if want == 0 || input.is_empty() {
                return;
            }
            let (now, later) = input.split_at(want.min(input.len()));
            self.push(now);
            *input = later;
        }
    }

    /// The stream announced a frame above the maximum: fail for good and
    /// let go of what is buffered.
    fn fail_oversized(&mut self, len: u32) -> FrameError {
        let err = FrameError::Oversized { len: u64::from(len), max: self.max };
        self.failed = Some(err.clone());
        self.buf = Vec::new();
        self.start = 0;
        err
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

        /// `next_from` on any chunking gives what `push` then
        /// `next_frame` give: the same frames and errors in the same
        /// order, and the same bytes buffered once each chunk is spent;
        /// and it never buffers a frame that was whole in its chunk.
        #[test]
        fn reading_from_the_input_is_pushing_then_decoding(
            frames in proptest::collection::vec((0u32..40, any::<u8>(), any::<bool>()), 0..12),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
            max in 0usize..40,
            skipping in any::<bool>(),
            garbage in proptest::collection::vec(any::<u8>(), 0..6),
        ) {
            let mut stream = Vec::new();
            for &(len, fill, fake) in &frames {
                if fake {
                    // A header that lies about what follows.
                    stream.extend_from_slice(&(len * 1000).to_be_bytes());
                }
                encode_into(&vec![fill; len as usize], &mut stream);
            }
            stream.extend_from_slice(&garbage);
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            points.extend([0, stream.len()]);
            points.sort_unstable();
            let new = |max| if skipping { FrameDecoder::skipping(max) } else { FrameDecoder::new(max) };
            let (mut old, mut dec) = (new(max), new(max));
            for w in points.windows(2) {
                let chunk = &stream[w[0]..w[1]];
                old.push(chunk);
                let mut want = Vec::new();
                loop {
                    let next = old.next_frame();
                    let end = !matches!(next, Ok(Some(_)) | Err(FrameError::Skipped { .. }));
                    want.push(next);
                    if end {
                        break;
                    }
                }
                let mut got = Vec::new();
                let mut rest = chunk;
                loop {
                    let whole = dec.buffered() == 0;
                    let next = dec.next_from(&mut rest);
                    if let Ok(Some(Payload::Input(p))) = &next {
                        prop_assert!(whole && !skipping && p.len() <= max);
                    }
                    let next = next.map(|f| f.map(|p| p.to_vec()));
                    let end = !matches!(next, Ok(Some(_)) | Err(FrameError::Skipped { .. }));
                    got.push(next);
                    if end {
                        break;
                    }
                }
                prop_assert!(rest.is_empty());
                prop_assert_eq!(&got, &want);
                prop_assert_eq!(dec.buffered(), old.buffered());
                prop_assert_eq!(dec.has_partial(), old.has_partial());
                prop_assert!(dec.held() <= old.held().max(KEEP_CAPACITY));
            }
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
