//! The literal forms a secret takes once encoded: found by a plain
//! multi-pattern search, no decoding needed.
//!
//! - the secret as it is;
//! - UTF-16, little- and big-endian (each character as its UTF-16 code
//!   units; a secret that is not UTF-8, byte by byte);
//! - hex (matched in either case by the caller);
//! - base64, standard and URL-safe alphabets, at each of the three
//!   alignments a secret can have inside a longer encoded text: only the
//!   characters its own bits decide, so a copy embedded anywhere in a
//!   base64 stream is found.

use base64::Engine;

/// The forms matched case-sensitively, and those matched in either ASCII
/// case (hex).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forms {
    pub exact: Vec<Vec<u8>>,
    pub any_case: Vec<Vec<u8>>,
}

/// Every literal form of `secret`.
pub fn forms(secret: &[u8]) -> Forms {
    let mut exact = vec![secret.to_vec()];
    let (le, be) = utf16(secret);
    exact.push(le);
    exact.push(be);
    for align in 0..3 {
        if let Some(core) = base64_core(secret, align) {
            exact.push(core.clone());
            let url: Vec<u8> = core
                .iter()
                .map(|&c| match c {
                    b'+' => b'-',
                    b'/' => b'_',
                    c => c,
                })
                .collect();
            exact.push(url);
        }
    }
    // Mixed forms, found whole as well as decoded: one whose first
    // character is a hex digit left as it is can be swallowed by an escape
    // cut short just before it (`%B` + `65o%00…`), and the decoding pass,
    // reading that escape, then never sees the secret begin.
    for upper in [false, true] {
        exact.push(percent_component(secret, upper));
    }
    exact.push(json_slash(secret));
    exact.sort();
    exact.dedup();
    Forms { exact, any_case: vec![hex(secret)] }
}

/// `secret` as a URL component: unreserved bytes (`A-Z a-z 0-9 - . _ ~`)
/// kept, every other byte `%XX`, in upper or lower case hex.
pub fn percent_component(secret: &[u8], upper: bool) -> Vec<u8> {
    let digits: &[u8; 16] = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    let mut out = Vec::with_capacity(secret.len() * 3);
    for &b in secret {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', digits[usize::from(b >> 4)], digits[usize::from(b & 15)]]);
        }
    }
    out
}

/// `secret` with each `/` written `\/`, as JSON may.
pub fn json_slash(secret: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(secret.len() * 2);
    for &b in secret {
        if b == b'/' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// Lowercase hex of `secret`'s bytes.
pub fn hex(secret: &[u8]) -> Vec<u8> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    secret.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 15)]]).collect()
}

/// `secret` in UTF-16LE and UTF-16BE.
pub fn utf16(secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let units: Vec<u16> = match std::str::from_utf8(secret) {
        Ok(text) => text.encode_utf16().collect(),
        Err(_) => secret.iter().map(|&b| u16::from(b)).collect(),
    };
    let le = units.iter().flat_map(|u| u.to_le_bytes()).collect();
    let be = units.iter().flat_map(|u| u.to_be_bytes()).collect();
    (le, be)
}

/// The base64 characters decided by `secret`'s bits alone when it starts
/// `align` bytes (0, 1 or 2) past a 3-byte group boundary of the encoded
/// stream: those whose 6 bits lie wholly inside the secret's. `None` when
/// there are none.
pub fn base64_core(secret: &[u8], align: usize) -> Option<Vec<u8>> {
    let mut stream = vec![0u8; align];
    stream.extend_from_slice(secret);
    while !stream.len().is_multiple_of(3) {
        stream.push(0);
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(&stream).into_bytes();
    let (from_bit, to_bit) = (8 * align, 8 * (align + secret.len()));
    let first = from_bit.div_ceil(6);
    let last = to_bit / 6;
    (first < last).then(|| encoded[first..last].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_alignment_is_a_substring_of_an_embedding() {
        let secret = b"s3cr3t-v4lue";
        for align in 0..3 {
            for tail in 0..3 {
                let mut data = vec![0xA5u8; align];
                data.extend_from_slice(secret);
                data.extend(std::iter::repeat_n(0x5A, tail));
                let enc = base64::engine::general_purpose::STANDARD.encode(&data);
                let core = base64_core(secret, align).expect("a core");
                let core = String::from_utf8(core).expect("ascii");
                assert!(enc.contains(&core), "align {align} tail {tail}: {core} in {enc}");
            }
        }
    }

    #[test]
    fn the_forms_of_a_secret() {
        let f = forms(b"ab/?");
        assert!(f.exact.contains(&b"ab/?".to_vec()));
        assert!(f.exact.contains(&b"a\0b\0/\0?\0".to_vec()));
        assert!(f.exact.contains(&b"\0a\0b\0/\0?".to_vec()));
        assert_eq!(f.any_case, [b"61622f3f".to_vec()]);
        // "ab/?" is YWIvPw== at alignment 0: its decided characters.
        assert!(f.exact.contains(&b"YWIvP".to_vec()));
        assert_eq!(utf16("é".as_bytes()).0, vec![0xE9, 0x00]);
        assert_eq!(base64_core(b"a", 1), None);
    }
}
