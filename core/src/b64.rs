//! Base64 (standard alphabet, padded) for the whole crate, and the serde
//! helpers that carry bytes in traces as base64 strings, not arrays.
//!
//! Both directions are `base64-simd`'s (vector code picked at run time,
//! the same text on every machine): a write's data is most of what the FS
//! proxy parses, and a read's most of what it writes (docs/perf.md). What
//! is accepted, the bytes it decodes to and the text written are exactly
//! `base64`'s `STANDARD` engine's (property-tested below): padding
//! required, the bits the padding leaves over zero. `base64-simd` says only
//! that a text is wrong, while the protocol answers with the reason, so a
//! rejected text is decoded again by `base64`, which gives it: rejections
//! are rare, and that keeps every message the same.

use base64::engine::general_purpose::STANDARD;
use base64::{DecodeError, Engine as _};
use serde::{Deserialize, Deserializer, Serializer};

/// The bytes of the standard base64 `text`, or why it is not base64 (the
/// `base64` crate's error, which answers show).
pub fn decode(text: impl AsRef<[u8]>) -> Result<Vec<u8>, DecodeError> {
    let text = text.as_ref();
    let mut bytes = Vec::new();
    match base64_simd::STANDARD.decode_append(text, &mut bytes) {
        Ok(()) => Ok(bytes),
        // Only the reference can say why, in the words answers give.
        Err(_) => STANDARD.decode(text),
    }
}

/// `bytes` as standard base64, padded.
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

/// `bytes` as standard base64, padded, appended to `out`: a read answer's
/// data is encoded straight into the frame it leaves in.
pub fn encode_into(bytes: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(bytes, out);
}

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&encode(bytes))
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    // Through a `String` rather than decoded where the deserializer holds
    // it: serde_json places an error raised inside a visitor one column
    // earlier, and traces' error messages stay as they were.
    let text = String::deserialize(d)?;
    decode(text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Symbols, padding and a few bytes no base64 text holds: any mix of
    /// them, or symbols then padding, which is right as often as the
    /// length and the last symbol's spare bits allow.
    fn near_base64() -> impl Strategy<Value = Vec<u8>> {
        let symbol = proptest::sample::select(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".to_vec(),
        );
        let byte = prop_oneof![
            40 => symbol.clone(),
            6 => Just(b'='),
            1 => proptest::sample::select(b"-_ \n\r.\0\x7f".to_vec()),
            1 => Just(0xc3u8),
            1 => any::<u8>(),
        ];
        prop_oneof![
            proptest::collection::vec(byte, 0..80),
            (proptest::collection::vec(symbol, 0..80), 0usize..4).prop_map(|(mut text, pad)| {
                text.extend(std::iter::repeat_n(b'=', pad));
                text
            }),
        ]
    }

    /// A valid text with its last symbol before the padding moved to any
    /// other, setting the bits the padding leaves over (or not).
    fn last_symbol_changed() -> impl Strategy<Value = Vec<u8>> {
        (proptest::collection::vec(any::<u8>(), 1..60), 0u8..64).prop_map(|(data, v)| {
            let mut text = STANDARD.encode(data).into_bytes();
            let end = text.iter().rposition(|&b| b != b'=').unwrap_or(0);
            text[end] = STANDARD.encode([v << 2]).as_bytes()[0];
            text
        })
    }

    fn agrees(text: &[u8]) -> Result<(), TestCaseError> {
        let ours = decode(text);
        let reference = STANDARD.decode(text);
        // `base64-simd` alone, so a text it refused wrongly would not pass
        // for right by way of the reference's second look.
        let simd = base64_simd::STANDARD.decode_to_vec(text).ok();
        prop_assert_eq!(&simd, &reference.as_ref().ok().cloned(), "text {:?}", String::from_utf8_lossy(text));
        prop_assert_eq!(&ours, &reference, "text {:?}", String::from_utf8_lossy(text));
        // The message too, which the protocol passes on.
        if let (Err(ours), Err(reference)) = (ours, reference) {
            prop_assert_eq!(ours.to_string(), reference.to_string());
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn decodes_what_the_reference_encodes(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let text = STANDARD.encode(&data);
            prop_assert_eq!(decode(&text), Ok(data));
        }

        #[test]
        fn accepts_and_rejects_what_the_reference_does(text in near_base64()) {
            agrees(&text)?;
        }

        #[test]
        fn rejects_spare_bits_as_the_reference_does(text in last_symbol_changed()) {
            agrees(&text)?;
        }

        /// Long texts take the vector loop; one byte changed anywhere in
        /// them, or the end cut or padded, is found there too.
        #[test]
        fn long_texts_agree_with_the_reference(
            data in proptest::collection::vec(any::<u8>(), 0..400),
            at in any::<prop::sample::Index>(),
            to in prop_oneof![Just(b'='), Just(b'-'), Just(b'_'), Just(b' '), Just(0x80u8), any::<u8>()],
            cut in 0usize..4,
            pad in 0usize..3,
        ) {
            let mut text = STANDARD.encode(&data).into_bytes();
            if !text.is_empty() {
                let i = at.index(text.len());
                text[i] = to;
            }
            text.truncate(text.len() - cut.min(text.len()));
            text.extend(std::iter::repeat_n(b'=', pad));
            agrees(&text)?;
        }

        #[test]
        fn encodes_what_the_reference_encodes(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let expected = STANDARD.encode(&data);
            prop_assert_eq!(&encode(&data), &expected);
            let mut out = b"??".to_vec();
            encode_into(&data, &mut out);
            prop_assert_eq!(&out[..2], b"??", "what was there is kept");
            prop_assert_eq!(&out[2..], expected.as_bytes());
        }

        #[test]
        fn arbitrary_bytes_agree_with_the_reference(text in proptest::collection::vec(any::<u8>(), 0..64)) {
            agrees(&text)?;
        }
    }

    #[test]
    fn encoding_covers_the_alphabet() {
        let every: Vec<u8> = (0..=255).collect();
        assert_eq!(encode(&every), STANDARD.encode(&every));
        let mut out = Vec::new();
        encode_into(&every, &mut out);
        assert_eq!(out, STANDARD.encode(&every).as_bytes());
    }

    #[test]
    fn edge_texts_agree_with_the_reference() {
        for text in [
            "",
            "=",
            "==",
            "===",
            "====",
            "A",
            "AA",
            "AAA",
            "AA=",
            "A===",
            "AA==",
            "AB==",
            "AAA=",
            "AAB=",
            "AAAA",
            "AAAA=",
            "AAAA==",
            "AAAA====",
            "AA==AAAA",
            "AAA=AAAA",
            "=AAA",
            "AA=A",
            "aGk=",
            "aGk",
            "aGVsbG8=",
            "aGVsbG8",
            "aGVsbG9=",
            "aGVsbG8h",
            "aGVs bG8=",
            "aGVs\nbG8=",
            "aGVs_G8=",
            "aGVs-G8=",
        ] {
            agrees(text.as_bytes()).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        }
    }
}
