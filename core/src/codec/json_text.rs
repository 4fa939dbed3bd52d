//! JSON text written exactly as `serde_json::to_writer` writes it (compact,
//! strings escaped alike, an object's members in `Map` order), with the
//! runs of a string that need no escape skipped eight bytes at a time and
//! copied whole. serde_json looks each byte up in its escape table; the
//! answers and forwarded requests that carry pages of text or kilobytes of
//! base64 spent most of their encoding there.

use serde_json::{Map, Value};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether any byte of `x` is zero.
const fn has_zero(x: u64) -> bool {
    x.wrapping_sub(ONES) & !x & HIGH != 0
}

/// Whether any of the eight bytes must be escaped: a control character
/// (below 0x20), `"` or `\`. Exact (no false positives): a byte of 0x80 or
/// above has its high bit cleared by `!x` and cannot borrow.
const fn needs_escape(x: u64) -> bool {
    x.wrapping_sub(0x20 * ONES) & !x & HIGH != 0
        || has_zero(x ^ (b'"' as u64 * ONES))
        || has_zero(x ^ (b'\\' as u64 * ONES))
}

/// The bytes [`needs_escape`] finds, for one byte at a time.
static ESCAPED: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// serde_json's short escapes; other control characters are `\u00XX`.
const fn short_escape(b: u8) -> Option<u8> {
    Some(match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x0c => b'f',
        b'\n' => b'n',
        b'\r' => b'r',
        b'\t' => b't',
        _ => return None,
    })
}

/// `s` as a JSON string, quotes included.
pub fn string(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push(b'"');
    // `b[start..i]` is the run not yet copied.
    let (mut start, mut i) = (0, 0);
    while i < b.len() {
        if let Some(word) = b.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            if !needs_escape(u64::from_le_bytes(w)) {
                i += 8;
                continue;
            }
        }
        let c = b[i];
        i += 1;
        if !ESCAPED[usize::from(c)] {
            continue;
        }
        out.extend_from_slice(&b[start..i - 1]);
        start = i;
        escape(out, c);
    }
    out.extend_from_slice(&b[start..]);
    out.push(b'"');
}

/// The escape of `c`, a byte [`needs_escape`] finds.
fn escape(out: &mut Vec<u8>, c: u8) {
    match short_escape(c) {
        Some(e) => out.extend_from_slice(&[b'\\', e]),
        None => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(c >> 4)],
                HEX[usize::from(c & 15)],
            ]);
        }
    }
}

/// An optional string: `null` for none.
pub fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// Any value.
pub fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => match n.as_u64() {
            Some(u) => out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes()),
            // A number always serializes.
            None => {
                let _ = serde_json::to_writer(&mut *out, n);
            }
        },
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                value(out, item);
            }
            out.push(b']');
        }
        Value::Object(m) => map(out, m),
    }
}

/// An object.
pub fn map(out: &mut Vec<u8>, m: &Map<String, Value>) {
    out.push(b'{');
    for (k, (key, v)) in m.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        string(out, key);
        out.push(b':');
        value(out, v);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        // Long runs of plain text with the characters that need escaping,
        // and multi-byte ones, at any offset from a word's start.
        proptest::collection::vec(
            prop_oneof![
                8 => proptest::char::range(' ', '~'),
                2 => proptest::char::range('\0', '\u{1f}'),
                1 => Just('"'),
                1 => Just('\\'),
                1 => Just('\u{7f}'),
                1 => any::<char>(),
            ],
            0..80,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(text(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn a_string_is_written_as_serde_json_writes_it(s in text()) {
            let mut out = b"prefix".to_vec();
            string(&mut out, &s);
            let mut want = b"prefix".to_vec();
            serde_json::to_writer(&mut want, &s).unwrap();
            prop_assert_eq!(out, want);
        }

        #[test]
        fn a_value_is_written_as_serde_json_writes_it(v in json()) {
            let mut out = Vec::new();
            value(&mut out, &v);
            prop_assert_eq!(out, serde_json::to_vec(&v).unwrap());
        }
    }

    #[test]
    fn every_byte_escapes_as_serde_json_escapes_it() {
        // Each character at each offset within a word, between plain runs.
        for c in (0u8..0x80).map(char::from).chain(['é', '\u{2028}', '😀']) {
            for at in 0..17 {
                let s: String = "a".repeat(at) + &c.to_string() + &"b".repeat(9);
                let mut out = Vec::new();
                string(&mut out, &s);
                assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{c:?} at {at}");
            }
        }
    }

    #[test]
    fn no_value_and_none_write_null() {
        let mut out = Vec::new();
        opt_string(&mut out, None);
        value(&mut out, &Value::Null);
        assert_eq!(out, b"nullnull");
    }
}
