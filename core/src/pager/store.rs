//! One fd's content and its indexes, built in one linear pass as bytes
//! stream in.
//!
//! The content is stored once: UTF-8 text as its bytes, or, for input that
//! is not UTF-8 or holds a character XML 1.0 cannot carry, the original
//! bytes (the fd's text is then their base64, generated on demand, which
//! is ASCII: one byte per character). Beside it, for text, two indexes of
//! `u32` byte offsets: where each line starts and where each page starts.
//! So any page or line range is found by indexing, never by rescanning,
//! and a document holds `1 + 4/avg_line_bytes + 4/page_bytes` bytes per
//! byte wrapped (a base64 fd: exactly 1).

use crate::b64;
use std::ops::Range;

/// Largest document: offsets are `u32`, which halves the index.
pub const MAX_DOCUMENT_BYTES: u64 = u32::MAX as u64;

/// How the fd's text relates to the bytes wrapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The text is the bytes, which are UTF-8 that XML can carry.
    Utf8,
    /// The text is the base64 of the bytes.
    Base64,
}

/// Bytes of one index entry (a `u32` offset).
pub const INDEX_ENTRY_BYTES: u64 = 4;
/// When the content grows near the limit, it leaves this fraction (1/N)
/// of the room left to the indexes.
pub const INDEX_ROOM_SHARE: usize = 8;
/// Entries an index grows by at least, so small documents do not grow one
/// entry at a time.
pub const MIN_INDEX_GROWTH: usize = 4;

/// Room for one more entry in `v`, growing it by doubling but by at most
/// half of the `room` bytes left (the rest is the content's and the other
/// index's); false when not even one more entry fits.
fn reserve_entry(v: &mut Vec<u32>, room: u64) -> bool {
    if v.len() < v.capacity() {
        return true;
    }
    let entries = usize::try_from(room / INDEX_ENTRY_BYTES).unwrap_or(usize::MAX);
    if entries == 0 {
        return false;
    }
    v.reserve_exact(v.len().max(MIN_INDEX_GROWTH).min(entries / 2).max(1));
    true
}

#[derive(Clone, Copy)]
enum Index {
    Lines,
    Pages,
}

enum Scan {
    Done,
    NotXml,
    /// An index would pass the limit.
    Full,
}

/// The builder ran out of room: `held` bytes would pass `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow {
    pub limit: u64,
}

/// Streams bytes into a [`Document`]: validation, line and page indexes
/// in the same pass, each byte looked at once.
#[derive(Debug)]
pub struct Builder {
    page_size: u64,
    data: Vec<u8>,
    base64: bool,
    /// Bytes of `data` validated and indexed; the rest is an incomplete
    /// UTF-8 sequence waiting for its next chunk.
    done: usize,
    chars: u64,
    line_starts: Vec<u32>,
    page_starts: Vec<u32>,
    page_start_char: u64,
    /// Just after the last `\n` of the current page's window: (char, byte).
    last_nl: Option<(u64, u32)>,
}

impl Builder {
    /// `page_size` in characters, at least 1.
    pub fn new(page_size: u64) -> Self {
        Builder {
            page_size: page_size.max(1),
            data: Vec::new(),
            base64: false,
            done: 0,
            chars: 0,
            line_starts: Vec::new(),
            page_starts: Vec::new(),
            page_start_char: 0,
            last_nl: None,
        }
    }

    /// Bytes held now: what the content and the indexes have allocated
    /// (their capacity, not their length), never less than the finished
    /// document holds. An empty builder holds nothing.
    pub fn held(&self) -> u64 {
        self.data.capacity() as u64
            + INDEX_ENTRY_BYTES * (self.line_starts.capacity() + self.page_starts.capacity()) as u64
    }

    /// Bytes wrapped so far.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Add `chunk`, holding at most `limit` bytes in all. On overflow the
    /// builder is spent: drop it.
    pub fn push(&mut self, chunk: &[u8], limit: u64) -> Result<(), Overflow> {
        let limit = limit.min(MAX_DOCUMENT_BYTES);
        let over = Overflow { limit };
        if chunk.is_empty() {
            return Ok(());
        }
        // Grow by doubling, but leave the indexes a share of what the limit
        // leaves, and refuse before allocating what would not fit. Each
        // growth copies the content (old and new are both allocated
        // meanwhile), so near the limit it takes most of the room at once.
        let (len, cap) = (self.data.len(), self.data.capacity());
        if len + chunk.len() > cap {
            let room = usize::try_from(limit.saturating_sub(self.held())).unwrap_or(usize::MAX);
            if chunk.len() > room.saturating_add(cap - len) {
                return Err(over);
            }
            self.data.reserve_exact(chunk.len().max(len.min(room - room / INDEX_ROOM_SHARE)));
        }
        self.data.extend_from_slice(chunk);
        if !self.base64 {
            if len == 0 {
                // Line 1 and page 1 start at 0.
                if !self.reserve_index(Index::Lines, limit) || !self.reserve_index(Index::Pages, limit) {
                    return Err(over);
                }
                self.line_starts.push(0);
                self.page_starts.push(0);
            }
            if !self.index(limit) {
                return Err(over);
            }
        }
        if self.held() > limit {
            return Err(over);
        }
        Ok(())
    }

    /// Room for one more entry in an index, growing it by doubling within
    /// what `limit` leaves; false when not even one more fits.
    fn reserve_index(&mut self, which: Index, limit: u64) -> bool {
        let held = self.held();
        let v = match which {
            Index::Lines => &mut self.line_starts,
            Index::Pages => &mut self.page_starts,
        };
        reserve_entry(v, limit.saturating_sub(held))
    }

    /// Index what can be validated of `data[done..]`; false when the
    /// indexes would pass `limit`.
    fn index(&mut self, limit: u64) -> bool {
        let (valid, broken) = match std::str::from_utf8(&self.data[self.done..]) {
            Ok(s) => (s.len(), false),
            Err(e) => (e.valid_up_to(), e.error_len().is_some()),
        };
        let end = self.done + valid;
        match self.scan(self.done, end, limit) {
            Scan::Full => return false,
            Scan::NotXml => self.switch_to_base64(),
            Scan::Done if broken => self.switch_to_base64(),
            Scan::Done => self.done = end,
        }
        true
    }

    /// Index the valid UTF-8 in `data[from..to]`, each index growing
    /// within what `limit` leaves.
    fn scan(&mut self, from: usize, to: usize, limit: u64) -> Scan {
        let Builder {
            page_size,
            data,
            chars: chars_done,
            line_starts,
            page_starts,
            page_start_char,
            last_nl,
            ..
        } = self;
        let p = *page_size;
        let mut chars = *chars_done;
        let room = |ls: &Vec<u32>, ps: &Vec<u32>| {
            let held = data.capacity() as u64 + INDEX_ENTRY_BYTES * (ls.capacity() + ps.capacity()) as u64;
            limit.saturating_sub(held)
        };
        let data = &data[..to];
        let mut i = from;
        while i < to {
            // Printable ASCII needs no look but the count: skip it eight
            // bytes at a time while no page boundary falls inside.
            let left = *page_start_char + p - chars;
            if left >= 8 && i + 8 <= to {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                if plain(u64::from_le_bytes(w)) {
                    i += 8;
                    chars += 8;
                    continue;
                }
            }
            let b = data[i];
            i += 1;
            if b >= 0x20 {
                if b & 0xC0 == 0x80 {
                    continue;
                }
                // U+FFFE and U+FFFF: EF BF BE / EF BF BF.
                if b == 0xEF && data.get(i) == Some(&0xBF) && matches!(data.get(i + 1), Some(0xBE | 0xBF)) {
                    return Scan::NotXml;
                }
            } else if b != b'\n' && b != b'\t' && b != b'\r' {
                return Scan::NotXml;
            }
            // A character starts at byte i - 1 and has index `chars`.
            if chars == *page_start_char + p {
                let r = room(line_starts, page_starts);
                if !reserve_entry(page_starts, r) {
                    return Scan::Full;
                }
                let (c, at) = last_nl.take().unwrap_or((chars, (i - 1) as u32));
                page_starts.push(at);
                *page_start_char = c;
            }
            chars += 1;
            if b == b'\n' {
                let r = room(line_starts, page_starts);
                if !reserve_entry(line_starts, r) {
                    return Scan::Full;
                }
                *last_nl = Some((chars, i as u32));
                line_starts.push(i as u32);
            }
        }
        *chars_done = chars;
        Scan::Done
    }

    fn switch_to_base64(&mut self) {
        self.base64 = true;
        self.line_starts = Vec::new();
        self.page_starts = Vec::new();
        self.last_nl = None;
    }

    /// Characters of the text so far (for a base64 fd, of its base64).
    pub fn chars(&self) -> u64 {
        if self.base64 || self.done < self.data.len() {
            base64_len(self.data.len() as u64)
        } else {
            self.chars
        }
    }

    pub fn finish(mut self) -> Document {
        if self.done < self.data.len() {
            // Ends in the middle of a UTF-8 sequence.
            self.switch_to_base64();
        }
        self.data.shrink_to_fit();
        let n = self.data.len() as u64;
        if self.base64 {
            return Document {
                data: self.data,
                encoding: Encoding::Base64,
                page_size: self.page_size,
                chars: base64_len(n),
                line_starts: Vec::new(),
                page_starts: Vec::new(),
            };
        }
        // Lines start at 0 (pushed with the first byte) and after every
        // `\n` that something follows.
        if n > 0 && self.line_starts.last().is_some_and(|&s| u64::from(s) == n) {
            self.line_starts.pop();
        }
        if n == 0 {
            self.page_starts = vec![0];
        }
        self.line_starts.shrink_to_fit();
        self.page_starts.shrink_to_fit();
        Document {
            data: self.data,
            encoding: Encoding::Utf8,
            page_size: self.page_size,
            chars: self.chars,
            line_starts: self.line_starts,
            page_starts: self.page_starts,
        }
    }
}

/// Are all eight bytes of `w` in 0x20..0x80 (printable ASCII, DEL)?
pub(super) fn plain(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte below 0x20 borrows into its high bit; a byte at or above 0x80
    // has it set already.
    (w.wrapping_sub(ONES * 0x20) | w) & HIGH == 0
}

/// Characters of the base64 of `n` bytes.
pub fn base64_len(n: u64) -> u64 {
    n.div_ceil(3) * 4
}

/// One fd's content, indexed.
#[derive(Debug)]
pub struct Document {
    data: Vec<u8>,
    encoding: Encoding,
    page_size: u64,
    chars: u64,
    line_starts: Vec<u32>,
    page_starts: Vec<u32>,
}

/// What a page is, for its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageInfo {
    /// Offsets into the text (bytes of UTF-8; characters of base64).
    pub span: Range<u64>,
    pub continued: bool,
    pub truncated: bool,
    /// First and last line (1-based); `(0, 0)` for empty content.
    pub lines: (u64, u64),
}

impl Document {
    pub fn from_bytes(bytes: &[u8], page_size: u64) -> Document {
        let mut b = Builder::new(page_size);
        // A document of more than `MAX_DOCUMENT_BYTES` cannot be built;
        // callers hold far less.
        let _ = b.push(bytes, MAX_DOCUMENT_BYTES);
        b.finish()
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Characters of the text.
    pub fn chars(&self) -> u64 {
        self.chars
    }

    /// Bytes of the text (equal to `chars` for base64).
    pub fn text_len(&self) -> u64 {
        match self.encoding {
            Encoding::Utf8 => self.data.len() as u64,
            Encoding::Base64 => self.chars,
        }
    }

    /// The bytes wrapped.
    pub fn raw(&self) -> &[u8] {
        &self.data
    }

    /// Bytes this document holds: what its content and indexes have
    /// allocated.
    pub fn held(&self) -> u64 {
        self.data.capacity() as u64
            + INDEX_ENTRY_BYTES * (self.line_starts.capacity() + self.page_starts.capacity()) as u64
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    pub fn total_lines(&self) -> u64 {
        match self.encoding {
            Encoding::Utf8 => self.line_starts.len() as u64,
            Encoding::Base64 => u64::from(self.chars > 0),
        }
    }

    /// Pages `read` serves: at least 1 (empty content is one empty page).
    pub fn pages(&self) -> u64 {
        match self.encoding {
            Encoding::Utf8 => self.page_starts.len() as u64,
            Encoding::Base64 => self.chars.div_ceil(self.page_size).max(1),
        }
    }

    /// Page `p` (1-based), if it exists.
    pub fn page(&self, p: u64) -> Option<PageInfo> {
        if p == 0 || p > self.pages() {
            return None;
        }
        let last = p == self.pages();
        match self.encoding {
            Encoding::Base64 => {
                let start = (p - 1) * self.page_size;
                let end = if last { self.chars } else { p * self.page_size };
                let lines = if self.chars == 0 { (0, 0) } else { (1, 1) };
                Some(PageInfo { span: start..end, continued: p > 1, truncated: !last, lines })
            }
            Encoding::Utf8 => {
                let i = (p - 1) as usize;
                let start = u64::from(self.page_starts[i]);
                let end = match self.page_starts.get(i + 1) {
                    Some(&e) => u64::from(e),
                    None => self.data.len() as u64,
                };
                let continued = start > 0 && self.data[start as usize - 1] != b'\n';
                let truncated = !last && self.data[end as usize - 1] != b'\n';
                let lines = if start == end { (0, 0) } else { (self.line_of(start), self.line_of(end - 1)) };
                Some(PageInfo { span: start..end, continued, truncated, lines })
            }
        }
    }

    /// The 1-based line holding text byte `at`.
    fn line_of(&self, at: u64) -> u64 {
        self.line_starts.partition_point(|&s| u64::from(s) <= at) as u64
    }

    /// Lines `a..=b` with their endings, if `1 <= a <= b <= total_lines`.
    pub fn lines(&self, a: u64, b: u64) -> Option<Range<u64>> {
        if a == 0 || a > b || b > self.total_lines() {
            return None;
        }
        match self.encoding {
            Encoding::Base64 => Some(0..self.chars),
            Encoding::Utf8 => {
                let start = u64::from(self.line_starts[(a - 1) as usize]);
                let end = match self.line_starts.get(b as usize) {
                    Some(&e) => u64::from(e),
                    None => self.data.len() as u64,
                };
                Some(start..end)
            }
        }
    }

    /// The whole text.
    pub fn all(&self) -> Range<u64> {
        0..self.text_len()
    }

    /// Is `at` a place a piece of text may start or end (a character
    /// boundary within the text)?
    pub fn is_boundary(&self, at: u64) -> bool {
        match self.encoding {
            Encoding::Base64 => at <= self.chars,
            Encoding::Utf8 => match self.data.get(at as usize) {
                Some(&b) => b & 0xC0 != 0x80,
                None => at == self.data.len() as u64,
            },
        }
    }

    /// The UTF-8 text of `span` (for a UTF-8 document only).
    pub fn utf8(&self, span: Range<u64>) -> Option<&str> {
        match self.encoding {
            Encoding::Utf8 => self
                .data
                .get(span.start as usize..span.end as usize)
                .and_then(|b| std::str::from_utf8(b).ok()),
            Encoding::Base64 => None,
        }
    }

    /// The base64 text of `span` (characters of the base64 text).
    pub fn base64(&self, span: Range<u64>) -> String {
        let end = span.end.min(self.chars);
        let start = span.start.min(end);
        let g0 = start / 4;
        let g1 = end.div_ceil(4);
        let raw_end = (g1 * 3).min(self.data.len() as u64);
        let enc = b64::encode(&self.data[(g0 * 3) as usize..raw_end as usize]);
        let from = (start - g0 * 4) as usize;
        let to = (end - g0 * 4) as usize;
        enc.get(from..to).unwrap_or_default().to_owned()
    }

    /// The text of `span`, as a string (base64 or UTF-8).
    pub fn text(&self, span: Range<u64>) -> String {
        match self.encoding {
            Encoding::Utf8 => self.utf8(span).unwrap_or_default().to_owned(),
            Encoding::Base64 => self.base64(span),
        }
    }

    /// The bytes `span` stands for when written to a file: the text for
    /// UTF-8; for base64, the decoded bytes of every 4-character group
    /// that starts inside `span`, so the pages' bytes concatenate back to
    /// the bytes wrapped.
    pub fn bytes_of(&self, span: Range<u64>) -> &[u8] {
        match self.encoding {
            Encoding::Utf8 => &self.data[span.start as usize..span.end as usize],
            Encoding::Base64 => {
                let n = self.data.len() as u64;
                let from = (span.start.div_ceil(4) * 3).min(n);
                let to = (span.end.div_ceil(4) * 3).min(n).max(from);
                &self.data[from as usize..to as usize]
            }
        }
    }

    /// Line starts (byte offsets) of a UTF-8 document, for search.
    pub(crate) fn line_starts(&self) -> &[u32] {
        &self.line_starts
    }
}

/// Lines of `bytes` by the pager's rule: split after each `\n`, a trailing
/// newline starts no new line.
pub fn count_lines(bytes: &[u8]) -> u64 {
    let nl = bytes.iter().filter(|&&b| b == b'\n').count() as u64;
    nl + u64::from(bytes.last().is_some_and(|&b| b != b'\n'))
}
