//! Each encoding, made by an encoder of its own ([`super::oracle`]),
//! never by the scrubber's code.

use super::oracle::{encode, visible, ENCS};
use super::*;
use proptest::prelude::*;

const MARK: &[u8] = b"[REDACTED]";

#[test]
fn every_encoding_is_found() {
    let secret = "sk-Test/+=ü 42?";
    let set = SecretSet::new([secret]);
    for enc in ENCS {
        for pad in 0..3 {
            let e = encode(secret, enc, pad);
            let text = [b"<<".as_slice(), &e, b">>"].concat();
            let out = set.replace(&text, MARK);
            assert!(set.reveals(&text), "{enc:?}: {}", String::from_utf8_lossy(&text));
            assert!(!set.reveals(&out), "{enc:?}: {}", String::from_utf8_lossy(&out));
            assert!(
                out.starts_with(b"<<") && out.ends_with(b">>"),
                "{enc:?}: {}",
                String::from_utf8_lossy(&out)
            );
        }
    }
}

#[test]
fn text_without_a_secret_is_borrowed_unchanged() {
    let set = SecretSet::new(["abcdefgh"]);
    let text = br"100% \n plain \u0041 text %41";
    assert!(matches!(set.replace(text, MARK), Cow::Borrowed(_)));
    assert!(!set.reveals(text));
    assert!(SecretSet::new(Vec::<&str>::new()).is_empty());
    assert!(SecretSet::new([""]).is_empty());
}

#[test]
fn a_secret_split_by_escapes_and_mixed_encodings_is_one_span() {
    let set = SecretSet::new(["sk-abc/def"]);
    for text in [r"sk-\u0061bc\/def", r"sk-%61bc%2Fdef", r"sk-\\u0061bc\\/def", r"%73k-abc/de%66"] {
        let out = set.replace(text.as_bytes(), MARK);
        assert_eq!(&*out, MARK, "{text}");
    }
}

#[test]
fn a_secret_holding_backslashes_is_found_however_deep_json_holds_it() {
    let secret = r#"C:\new\tok"en\/x"#;
    let set = SecretSet::new([secret]);
    let (mut text, mut empty) = (secret.to_string(), String::new());
    for depth in 1..=units::MAX_JSON_DEPTH {
        text = serde_json::to_string(&text).expect("a string");
        empty = serde_json::to_string(&empty).expect("a string");
        // The quotes of each depth stay, around one marker.
        let (open, close) = empty.split_at(empty.len() / 2);
        let out = set.replace(text.as_bytes(), MARK);
        assert_eq!(&*out, &[open.as_bytes(), MARK, close.as_bytes()].concat()[..], "depth {depth}: {text}");
    }
}

#[test]
fn a_secret_holding_percent_escapes_is_found_in_json_that_escapes_the_rest() {
    let secret = "\0tok%00en%2";
    let set = SecretSet::new([secret]);
    let text = serde_json::to_string(secret).expect("a string");
    assert_eq!(&*set.replace(text.as_bytes(), MARK), &[b"\"".as_slice(), MARK, b"\""].concat()[..], "{text}");
}

proptest! {
    /// Any secret, planted in any encoding among filler that no encoding
    /// uses: nothing of it can be read afterwards, and the filler stays.
    #[test]
    fn no_planted_form_survives(
        secret in "[ -~]{4,24}",
        plants in proptest::collection::vec((0..ENCS.len(), 0u8..3, "[ .,;:!()]{0,5}"), 1..5),
    ) {
        let set = SecretSet::new([&secret]);
        let mut text = Vec::new();
        for (e, pad, filler) in &plants {
            text.extend_from_slice(filler.as_bytes());
            text.extend_from_slice(&encode(&secret, ENCS[*e], *pad));
        }
        let out = set.replace(&text, MARK);
        prop_assert!(visible(&out, secret.as_bytes(), MARK).is_none(), "{:?} in {:?}", visible(&out, secret.as_bytes(), MARK), String::from_utf8_lossy(&out));
        prop_assert!(!set.reveals(&out) || out.windows(MARK.len()).any(|w| w == MARK));
        let kept: Vec<u8> = out.iter().copied().filter(|b| b" .,;:!()".contains(b)).collect();
        let want: Vec<u8> = plants.iter().flat_map(|(_, _, f)| f.bytes()).collect();
        // Filler is never eaten, except where a span runs over a
        // character the secret's own encodings share (none here).
        prop_assert!(kept.len() >= want.len() || secret.bytes().any(|b| b" .,;:!()".contains(&b)));
    }

    /// Arbitrary bytes: no panic, the output holds no plain secret outside
    /// a marker, and text without any escape or secret is unchanged.
    #[test]
    fn arbitrary_bytes(secrets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..12), 1..4), data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let set = SecretSet::new(&secrets);
        let out = set.replace(&data, MARK);
        for s in &secrets {
            prop_assert!(!super::oracle::survives(&out, s, false, MARK));
        }
        if set.spans(&data).is_empty() {
            prop_assert_eq!(&*out, &data[..]);
        }
    }
}

proptest! {
    /// Joining matches as they come (ends in order, as an automaton
    /// reports them) keeps what merging them all at the end would, in
    /// exactly as many spans as were counted beforehand.
    #[test]
    fn spans_joined_as_found_merge_like_all_of_them(raw in proptest::collection::vec((0usize..64, 1usize..12), 0..64)) {
        let mut ends: Vec<(usize, usize)> = raw;
        ends.sort_by_key(|&(end, _)| end);
        let ranges: Vec<Range<usize>> =
            ends.iter().map(|&(end, len)| end.saturating_sub(len)..end.max(1)).collect();
        let mut joined = Vec::new();
        for r in &ranges {
            push_merged(&mut joined, r.clone());
        }
        prop_assert_eq!(joined.len(), merged_count(ranges.iter().cloned()));
        prop_assert_eq!(merge(joined), merge(ranges));
    }
}
