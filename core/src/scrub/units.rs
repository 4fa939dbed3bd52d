//! Text read as *units*, each decoding to a few bytes: a byte as it is, a
//! percent escape (`%2F`, `%2f`), or a JSON escape preceded by any run of
//! backslashes (`\u0073`, `\\u0073`, `\/`, `\n`; a `\uD83D\uDE00` pair is
//! one character), each as a [`Reading`] has it. A secret is matched on
//! the decoded bytes, so a copy that is escaped in part, in full, in
//! either case, or escaped again inside JSON held in a string, is one span
//! of the text.

use std::ops::Range;

/// Longest UTF-8 encoding of a character.
pub const MAX_UNIT_BYTES: usize = 4;

/// Deepest JSON nesting read exactly ([`Backslashes::Depth`]): a secret
/// held in a string of JSON held in a string of JSON held in a string…
/// four deep.
pub const MAX_JSON_DEPTH: u8 = 4;

/// How a run of backslashes is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backslashes {
    /// A run before an escape is that escape, however deep, and a run
    /// before anything else one backslash: finds copies escaped in part at
    /// one depth and in part at another.
    AnyDepth,
    /// JSON string text `d` deep (1: the body of `"a\\b"`; 2: that JSON
    /// inside a string): a literal backslash is 2^d backslashes, an
    /// escape's own 2^(d-1), a quote's 2^d - 1. Finds the backslashes a
    /// secret holds, which [`Backslashes::AnyDepth`] swallows into the
    /// escape after them.
    Depth(u8),
}

/// How the text is decoded. No one reading finds every copy: at depth 1
/// `\\n` is a backslash and `n` (a Windows path's `C:\new`), at depth 2 a
/// newline; in JSON, a secret's own `%00` is three characters, not a
/// percent escape. So the decoded pass runs each reading the secrets need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Whether `%XX` is an escape.
    pub percent: bool,
    pub backslashes: Backslashes,
}

impl Reading {
    /// Percent escapes and JSON escapes at any depth: enough for every
    /// secret without `\`, `"` or `%`.
    pub const ANY: Reading = Reading { percent: true, backslashes: Backslashes::AnyDepth };

    /// The readings secrets need: `depths` when one holds `\` or `"`
    /// (which read otherwise at each JSON depth), `literal_percent` when
    /// one holds `%` (which JSON leaves as it is).
    pub fn needed(depths: bool, literal_percent: bool) -> impl Iterator<Item = Reading> {
        let rules = std::iter::once(Backslashes::AnyDepth)
            .chain((1..=MAX_JSON_DEPTH).map(Backslashes::Depth).filter(move |_| depths));
        [true, false]
            .into_iter()
            .filter(move |&percent| percent || literal_percent)
            .flat_map(move |percent| rules.clone().map(move |backslashes| Reading { percent, backslashes }))
    }

    /// How many backslashes an escape's own backslash is, if fixed.
    fn escape_run(self) -> Option<usize> {
        match self.backslashes {
            Backslashes::AnyDepth => None,
            Backslashes::Depth(d) => Some(1 << (d.clamp(1, MAX_JSON_DEPTH) - 1)),
        }
    }
}

/// What one unit decodes to: `lead` backslashes, then `out[..n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub lead: usize,
    pub n: usize,
    /// Where the unit ends in the text.
    pub end: usize,
}

/// The unit of `text` starting at `i` (`i < text.len()`) as `reading`
/// reads it; its bytes after the leading backslashes go in `out`.
pub fn next(text: &[u8], i: usize, reading: Reading, out: &mut [u8; MAX_UNIT_BYTES]) -> Unit {
    let one = |b: u8, out: &mut [u8; MAX_UNIT_BYTES], end| {
        out[0] = b;
        Unit { lead: 0, n: 1, end }
    };
    match text[i] {
        b'%' if reading.percent => {
            if let (Some(&h), Some(&l)) = (text.get(i + 1), text.get(i + 2)) {
                if let (Some(h), Some(l)) = (hex_val(h), hex_val(l)) {
                    return one((h << 4) | l, out, i + 3);
                }
            }
            one(b'%', out, i + 1)
        }
        b'\\' => backslash(text, i, reading, out),
        b => one(b, out, i + 1),
    }
}

/// A run of backslashes and what follows it.
fn backslash(text: &[u8], i: usize, reading: Reading, out: &mut [u8; MAX_UNIT_BYTES]) -> Unit {
    let mut j = i;
    while j < text.len() && text[j] == b'\\' {
        j += 1;
    }
    let run = j - i;
    let Some(esc) = reading.escape_run() else {
        if let Some((n, end)) = escape(text, j, reading, out) {
            return Unit { lead: 0, n, end };
        }
        // A run before anything else (or a lone surrogate): a backslash.
        out[0] = b'\\';
        return Unit { lead: 0, n: 1, end: j };
    };
    let literal = 2 * esc;
    // A quote is escaped again at each depth, its escape's backslashes
    // with it: 2^d - 1 of them.
    if text.get(j) == Some(&b'"') && (run + 1).is_multiple_of(literal) {
        out[0] = b'"';
        return Unit { lead: (run + 1) / literal - 1, n: 1, end: j + 1 };
    }
    if run >= esc && (run - esc).is_multiple_of(literal) {
        if let Some((n, end)) = escape(text, j, reading, out) {
            return Unit { lead: (run - esc) / literal, n, end };
        }
    }
    // Backslashes that escape nothing here: as many as the run holds at
    // this depth (at least one, so no run vanishes).
    Unit { lead: run.div_ceil(literal), n: 0, end: j }
}

/// The escaped character at `j`, just past a run: its bytes and where it
/// ends.
fn escape(text: &[u8], j: usize, reading: Reading, out: &mut [u8; MAX_UNIT_BYTES]) -> Option<(usize, usize)> {
    let simple = match text.get(j) {
        Some(b'"') => Some(b'"'),
        Some(b'/') => Some(b'/'),
        Some(b'b') => Some(8),
        Some(b'f') => Some(12),
        Some(b'n') => Some(b'\n'),
        Some(b'r') => Some(b'\r'),
        Some(b't') => Some(b'\t'),
        _ => None,
    };
    if let Some(b) = simple {
        out[0] = b;
        return Some((1, j + 1));
    }
    let (code, end) = u_escape(text, j)?;
    let (c, end) = match code {
        0xD800..=0xDBFF => {
            let (low, end2) = low_surrogate(text, end, reading)?;
            (char::from_u32(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00))?, end2)
        }
        _ => (char::from_u32(code)?, end),
    };
    Some((c.encode_utf8(out).len(), end))
}

/// `u` and four hex digits at `j`: the code and where they end.
fn u_escape(text: &[u8], j: usize) -> Option<(u32, usize)> {
    if text.get(j) != Some(&b'u') {
        return None;
    }
    let digits = text.get(j + 1..j + 5)?;
    let mut code = 0u32;
    for &d in digits {
        code = (code << 4) | u32::from(hex_val(d)?);
    }
    Some((code, j + 5))
}

/// A `\…\uDC00`-range escape at `at`, after the run `reading` asks for.
fn low_surrogate(text: &[u8], at: usize, reading: Reading) -> Option<(u32, usize)> {
    let mut j = at;
    while j < text.len() && text[j] == b'\\' {
        j += 1;
    }
    let fits = match reading.escape_run() {
        None => j > at,
        Some(esc) => j - at == esc,
    };
    if !fits {
        return None;
    }
    u_escape(text, j).filter(|(c, _)| (0xDC00..=0xDFFF).contains(c))
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Whether `text` holds anything a unit decodes (else every unit is its
/// byte, and the literal search already saw it all).
pub fn has_escapes(text: &[u8]) -> bool {
    memchr::memchr2(b'%', b'\\', text).is_some()
}

/// Spans of `text` whose units, as `reading` decodes them, `found`
/// reports a match in. `found` is fed each decoded byte and returns the
/// lengths (in decoded bytes) of the patterns ending there; `max_len`
/// bounds them. Linear in the text, memory `max_len` offsets.
pub fn spans(
    text: &[u8],
    reading: Reading,
    max_len: usize,
    mut found: impl FnMut(u8, &mut Vec<usize>),
    out: &mut Vec<Range<usize>>,
) {
    if max_len == 0 {
        return;
    }
    // Where the unit that produced each of the last `max_len` decoded
    // bytes starts, as a ring.
    let mut starts = vec![0usize; max_len];
    let mut count = 0usize;
    let mut lens = Vec::new();
    let mut buf = [0u8; MAX_UNIT_BYTES];
    let mut i = 0;
    while i < text.len() {
        let unit = next(text, i, reading, &mut buf);
        for b in std::iter::repeat_n(b'\\', unit.lead).chain(buf[..unit.n].iter().copied()) {
            starts[count % max_len] = i;
            count += 1;
            lens.clear();
            found(b, &mut lens);
            for &len in &lens {
                if len > 0 && len <= max_len && len <= count {
                    super::push_merged(out, starts[(count - len) % max_len]..unit.end);
                }
            }
        }
        i = unit.end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(text: &[u8], reading: Reading) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; MAX_UNIT_BYTES];
        let mut i = 0;
        while i < text.len() {
            let unit = next(text, i, reading, &mut buf);
            out.extend(std::iter::repeat_n(b'\\', unit.lead));
            out.extend_from_slice(&buf[..unit.n]);
            i = unit.end;
        }
        out
    }

    #[test]
    fn units_decode_every_escape() {
        let any = |t: &[u8]| decode(t, Reading::ANY);
        let json_only = Reading { percent: false, backslashes: Backslashes::AnyDepth };
        assert_eq!(decode(br"%00\u0025", json_only), b"%00%");
        assert_eq!(any(br"a%2Fb%2fc%zz%"), b"a/b/c%zz%");
        assert_eq!(any(br"\u0073\\u0073\\\/\n\t\x"), b"ss/\n\t\\x");
        assert_eq!(any(br"\ud83d\ude00"), "😀".as_bytes());
        assert_eq!(any(br"\\ud83d\\ude00"), "😀".as_bytes());
        assert_eq!(any(br"\ud83dx"), b"\\ud83dx");
        assert_eq!(any(br"\u00e9"), "é".as_bytes());
        assert_eq!(any(b"\\"), b"\\");
    }

    fn depth(d: u8) -> Reading {
        Reading { percent: true, backslashes: Backslashes::Depth(d) }
    }

    #[test]
    fn each_depth_reads_its_own_backslashes() {
        // `C:\new` as JSON, one and two deep.
        assert_eq!(decode(br"C:\\new", depth(1)), br"C:\new");
        assert_eq!(decode(br"C:\\\\new", depth(2)), br"C:\new");
        assert_eq!(decode(br"C:\\new", depth(2)), b"C:\new");
        // A backslash, then an escaped `/`, three deep: 8 + 4 backslashes.
        let three = [b"\\".repeat(12), b"u002f".to_vec()].concat();
        assert_eq!(decode(&three, depth(3)), br"\/");
        assert_eq!(decode(&three, Reading::ANY), b"/");
        // A surrogate pair's halves each after the depth's own run.
        assert_eq!(decode(br"\\ud83d\\ude00", depth(2)), "😀".as_bytes());
        assert_eq!(decode(br"\\ud83d\ude00", depth(2)), br"\ud83d\ude00");
        // A quote's escape is escaped again at each depth.
        assert_eq!(decode(br#"a\\\"b"#, depth(2)), br#"a"b"#);
        assert_eq!(decode(br#"a\\\\\\\"b"#, depth(2)), br#"a\"b"#);
        // A run that escapes nothing is never lost.
        assert_eq!(decode(br"a\b", depth(3)), br"a\b");
    }
}
