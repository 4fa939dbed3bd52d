//! An oracle for the scrubber, for its tests, the fuzz target and the
//! simulator: each encoding made by an encoder of its own (the `base64`
//! and `percent-encoding` crates, `serde_json`, `format!`), never by the
//! scrubber's code, and a naive search for what must not survive.

use super::forms;
use base64::Engine;
use std::ops::Range;

/// The encodings a secret is planted in.
#[derive(Clone, Copy, Debug)]
pub enum Enc {
    Plain,
    PctLower,
    PctUpper,
    /// Unreserved characters kept, the others escaped (URL components).
    PctComponent,
    JsonU,
    JsonUUpper,
    /// Every other character `\u`-escaped, the rest as JSON writes it,
    /// inside JSON held in a string.
    JsonNested,
    JsonSlash,
    HexLower,
    HexUpper,
    Base64 {
        align: u8,
        url: bool,
    },
    Utf16Le,
    Utf16Be,
}

pub const ENCS: [Enc; 18] = [
    Enc::Plain,
    Enc::PctLower,
    Enc::PctUpper,
    Enc::PctComponent,
    Enc::JsonU,
    Enc::JsonUUpper,
    Enc::JsonNested,
    Enc::JsonSlash,
    Enc::HexLower,
    Enc::HexUpper,
    Enc::Base64 { align: 0, url: false },
    Enc::Base64 { align: 1, url: false },
    Enc::Base64 { align: 2, url: false },
    Enc::Base64 { align: 0, url: true },
    Enc::Base64 { align: 1, url: true },
    Enc::Base64 { align: 2, url: true },
    Enc::Utf16Le,
    Enc::Utf16Be,
];

/// `secret` (UTF-8) encoded by `enc`, with `pad` bytes of context where
/// the encoding has one (a base64 stream's neighbours).
pub fn encode(secret: &str, enc: Enc, pad: u8) -> Vec<u8> {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const ALL: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    match enc {
        Enc::Plain => secret.as_bytes().to_vec(),
        Enc::PctLower | Enc::PctUpper => {
            let mut out = String::new();
            for b in secret.bytes() {
                out.push_str(&if matches!(enc, Enc::PctLower) {
                    format!("%{b:02x}")
                } else {
                    format!("%{b:02X}")
                });
            }
            out.into_bytes()
        }
        Enc::PctComponent => utf8_percent_encode(secret, ALL).to_string().into_bytes(),
        Enc::JsonU | Enc::JsonUUpper => {
            let mut out = String::new();
            for u in secret.encode_utf16() {
                out.push_str(&if matches!(enc, Enc::JsonU) {
                    format!("\\u{u:04x}")
                } else {
                    format!("\\u{u:04X}")
                });
            }
            out.into_bytes()
        }
        Enc::JsonNested => {
            let mut inner = String::new();
            for (i, c) in secret.chars().enumerate() {
                if i % 2 == 0 {
                    for u in c.encode_utf16(&mut [0; 2]) {
                        inner.push_str(&format!("\\u{u:04x}"));
                    }
                } else {
                    // JSON string text itself: a backslash or quote the
                    // secret holds is escaped, so every JSON decoder reads
                    // the secret back.
                    let quoted = serde_json::to_string(&c.to_string()).unwrap_or_default();
                    inner.push_str(&quoted[1..quoted.len().saturating_sub(1).max(1)]);
                }
            }
            // JSON text holding that string, as a string of an outer JSON.
            let json = serde_json::to_string(&serde_json::json!({ "k": format!("pre-{inner}") }))
                .unwrap_or_default();
            serde_json::to_string(&json).unwrap_or_default().into_bytes()
        }
        Enc::JsonSlash => serde_json::to_string(secret).unwrap_or_default().replace('/', "\\/").into_bytes(),
        Enc::HexLower => secret.bytes().map(|b| format!("{b:02x}")).collect::<String>().into_bytes(),
        Enc::HexUpper => secret.bytes().map(|b| format!("{b:02X}")).collect::<String>().into_bytes(),
        Enc::Base64 { align, url } => {
            let mut data = vec![pad; usize::from(align)];
            data.extend_from_slice(secret.as_bytes());
            data.extend_from_slice(&[pad, pad.wrapping_add(1)][..usize::from(pad % 3)]);
            if url {
                base64::engine::general_purpose::URL_SAFE.encode(&data).into_bytes()
            } else {
                base64::engine::general_purpose::STANDARD.encode(&data).into_bytes()
            }
        }
        Enc::Utf16Le => secret.encode_utf16().flat_map(u16::to_le_bytes).collect(),
        Enc::Utf16Be => secret.encode_utf16().flat_map(u16::to_be_bytes).collect(),
    }
}

/// Whether `needle` is in `hay` other than overlapping a marker.
pub fn survives(hay: &[u8], needle: &[u8], any_case: bool, mark: &[u8]) -> bool {
    let marks: Vec<Range<usize>> = hay
        .windows(mark.len())
        .enumerate()
        .filter(|(_, w)| *w == mark)
        .map(|(i, _)| i..i + mark.len())
        .collect();
    hay.windows(needle.len()).enumerate().any(|(i, w)| {
        let equal = if any_case { w.eq_ignore_ascii_case(needle) } else { w == needle };
        equal && !marks.iter().any(|m| i < m.end && m.start < i + needle.len())
    })
}

/// The secret in plain, in hex and in each base64 core: what must not be
/// readable after a scrub.
pub fn visible(out: &[u8], secret: &[u8], mark: &[u8]) -> Option<String> {
    let s = secret;
    if survives(out, s, false, mark) {
        return Some("plain".into());
    }
    if survives(out, &forms::hex(s), true, mark) {
        return Some("hex".into());
    }
    for align in 0..3 {
        if let Some(core) = forms::base64_core(s, align) {
            if survives(out, &core, false, mark) {
                return Some(format!("base64 {align}"));
            }
        }
    }
    let (le, be) = forms::utf16(s);
    if std::str::from_utf8(s).is_ok() && (survives(out, &le, false, mark) || survives(out, &be, false, mark))
    {
        return Some("utf16".into());
    }
    None
}
