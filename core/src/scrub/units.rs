//! Text read as *units*, each decoding to a few bytes: a byte as it is, a
//! percent escape (`%2F`, `%2f`), or a JSON escape preceded by any run of
//! backslashes (`\u0073`, `\\u0073`, `\/`, `\n`; a `\uD83D\uDE00` pair is
//! one character). A secret is matched on the decoded bytes, so a copy
//! that is escaped in part, in full, in either case, or escaped again
//! inside JSON held in a string, is one span of the text.

use std::ops::Range;

/// Longest UTF-8 encoding of a character.
pub const MAX_UNIT_BYTES: usize = 4;

/// The unit of `text` starting at `i` (`i < text.len()`): the bytes it
/// decodes to (in `out`, its length returned) and where it ends.
pub fn next(text: &[u8], i: usize, out: &mut [u8; MAX_UNIT_BYTES]) -> (usize, usize) {
    match text[i] {
        b'%' => {
            if let (Some(&h), Some(&l)) = (text.get(i + 1), text.get(i + 2)) {
                if let (Some(h), Some(l)) = (hex_val(h), hex_val(l)) {
                    out[0] = (h << 4) | l;
                    return (1, i + 3);
                }
            }
            out[0] = b'%';
            (1, i + 1)
        }
        b'\\' => backslash(text, i, out),
        b => {
            out[0] = b;
            (1, i + 1)
        }
    }
}

/// A run of backslashes and what follows it.
fn backslash(text: &[u8], i: usize, out: &mut [u8; MAX_UNIT_BYTES]) -> (usize, usize) {
    let mut j = i;
    while j < text.len() && text[j] == b'\\' {
        j += 1;
    }
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
        return (1, j + 1);
    }
    if let Some((code, end)) = u_escape(text, j) {
        let c = match code {
            0xD800..=0xDBFF => low_surrogate(text, end)
                .and_then(|(low, end2)| {
                    let c = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    char::from_u32(c).map(|c| (c, end2))
                })
                .map_or((None, end), |(c, e)| (Some(c), e)),
            _ => (char::from_u32(code), end),
        };
        if let (Some(c), end) = c {
            let n = c.encode_utf8(&mut [0; MAX_UNIT_BYTES]).len();
            c.encode_utf8(&mut out[..]);
            return (n, end);
        }
    }
    // A run before anything else (or a lone surrogate): a backslash.
    out[0] = b'\\';
    (1, j)
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

/// A `\…\uDC00`-range escape at `at` (after any run of backslashes).
fn low_surrogate(text: &[u8], at: usize) -> Option<(u32, usize)> {
    let mut j = at;
    while j < text.len() && text[j] == b'\\' {
        j += 1;
    }
    if j == at {
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

/// Spans of `text` whose decoded units `found` reports a match in. `found`
/// is fed each decoded byte and returns the lengths (in decoded bytes) of
/// the patterns ending there; `max_len` bounds them. Linear in the text,
/// memory `max_len` offsets.
pub fn spans(
    text: &[u8],
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
        let (n, end) = next(text, i, &mut buf);
        for &b in &buf[..n] {
            starts[count % max_len] = i;
            count += 1;
            lens.clear();
            found(b, &mut lens);
            for &len in &lens {
                if len > 0 && len <= max_len && len <= count {
                    out.push(starts[(count - len) % max_len]..end);
                }
            }
        }
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; MAX_UNIT_BYTES];
        let mut i = 0;
        while i < text.len() {
            let (n, end) = next(text, i, &mut buf);
            out.extend_from_slice(&buf[..n]);
            i = end;
        }
        out
    }

    #[test]
    fn units_decode_every_escape() {
        assert_eq!(decode(br"a%2Fb%2fc%zz%"), b"a/b/c%zz%");
        assert_eq!(decode(br"\u0073\\u0073\\\/\n\t\x"), b"ss/\n\t\\x");
        assert_eq!(decode(br"\ud83d\ude00"), "😀".as_bytes());
        assert_eq!(decode(br"\\ud83d\\ude00"), "😀".as_bytes());
        assert_eq!(decode(br"\ud83dx"), b"\\ud83dx");
        assert_eq!(decode(br"\u00e9"), "é".as_bytes());
        assert_eq!(decode(b"\\"), b"\\");
    }
}
