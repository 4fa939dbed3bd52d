//! The simulated clients' requests, written straight as the bytes
//! `serde_json::to_vec(&json!({...}))` gives (keys sorted, as serde_json's
//! map sorts them) without building a `Value`: the requests are most of
//! what a world sends, and building, escaping and dropping a tree for each
//! was a tenth of a seed's cost. `tests` holds every builder to `json!`.

use serde_json::Value;

/// `{"id":…,"op":…,"params":…}` for any params.
pub(super) fn req(id: &str, op: &str, params: Value) -> Vec<u8> {
    let mut out = head(id, op, 0);
    let _ = serde_json::to_writer(&mut out, &params);
    out.push(b'}');
    out
}

/// `open {mode, path}`.
pub(super) fn open(id: &str, path: &str, mode: &str) -> Vec<u8> {
    let mut out = head(id, "open", path.len() + mode.len() + 24);
    out.extend_from_slice(b"{\"mode\":");
    string(&mut out, mode);
    out.extend_from_slice(b",\"path\":");
    string(&mut out, path);
    out.extend_from_slice(b"}}");
    out
}

/// `read {h, max}`.
pub(super) fn read(id: &str, h: u64, max: u32) -> Vec<u8> {
    let mut out = head(id, "read", 0);
    out.extend_from_slice(b"{\"h\":");
    number(&mut out, h);
    out.extend_from_slice(b",\"max\":");
    number(&mut out, u64::from(max));
    out.extend_from_slice(b"}}");
    out
}

/// `close {h}`.
pub(super) fn close(id: &str, h: u64) -> Vec<u8> {
    let mut out = head(id, "close", 0);
    out.extend_from_slice(b"{\"h\":");
    number(&mut out, h);
    out.extend_from_slice(b"}}");
    out
}

/// `write {data, final?, h}`, the data base64-encoded in place.
pub(super) fn write(id: &str, h: u64, data: &[u8], fin: Option<bool>) -> Vec<u8> {
    let mut out = head(id, "write", data.len().div_ceil(3) * 4 + 64);
    data_member(&mut out, data);
    if let Some(fin) = fin {
        out.extend_from_slice(if fin { b",\"final\":true" } else { b",\"final\":false" });
    }
    out.extend_from_slice(b",\"h\":");
    number(&mut out, h);
    out.extend_from_slice(b"}}");
    out
}

/// `FD_WRAP {data, source}`: content handed to the pager whole.
pub(super) fn wrap(id: &str, data: &[u8], source: &str) -> Vec<u8> {
    let mut out = head(id, "FD_WRAP", data.len().div_ceil(3) * 4 + source.len() + 32);
    data_member(&mut out, data);
    out.extend_from_slice(b",\"source\":");
    string(&mut out, source);
    out.extend_from_slice(b"}}");
    out
}

/// `FD_WRAP {data, more, offset, stream}`: one chunk of a stream.
pub(super) fn wrap_chunk(id: &str, stream: &str, data: &[u8], more: bool, offset: u64) -> Vec<u8> {
    let mut out = head(id, "FD_WRAP", data.len().div_ceil(3) * 4 + stream.len() + 64);
    data_member(&mut out, data);
    out.extend_from_slice(if more { b",\"more\":true" } else { b",\"more\":false" });
    out.extend_from_slice(b",\"offset\":");
    number(&mut out, offset);
    out.extend_from_slice(b",\"stream\":");
    string(&mut out, stream);
    out.extend_from_slice(b"}}");
    out
}

/// `{"data":"<base64>"`, opening the params.
fn data_member(out: &mut Vec<u8>, data: &[u8]) {
    out.reserve(data.len().div_ceil(3) * 4 + 32);
    out.extend_from_slice(b"{\"data\":\"");
    base64_simd::STANDARD.encode_append(data, out);
    out.push(b'"');
}

/// `{"id":…,"op":…,"params":`, in a buffer with room for `params` bytes
/// more (a request's buffer is sized once, not grown as it is written).
/// The builders' own ops are plain words, written as they are; any other
/// op is escaped as serde_json escapes it.
fn head(id: &str, op: &str, params: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + id.len() + params);
    out.extend_from_slice(b"{\"id\":");
    string(&mut out, id);
    match op {
        "open" => out.extend_from_slice(b",\"op\":\"open\",\"params\":"),
        "read" => out.extend_from_slice(b",\"op\":\"read\",\"params\":"),
        "write" => out.extend_from_slice(b",\"op\":\"write\",\"params\":"),
        "close" => out.extend_from_slice(b",\"op\":\"close\",\"params\":"),
        _ => {
            out.extend_from_slice(b",\"op\":");
            string(&mut out, op);
            out.extend_from_slice(b",\"params\":");
        }
    }
    out
}

fn number(out: &mut Vec<u8>, n: u64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(n).as_bytes());
}

/// A JSON string: copied whole when nothing in it needs escaping (the
/// common case, and the long names of the floods), else as serde_json
/// escapes it.
fn string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().fold(false, |bad, b| bad | (b < 0x20) | (b == b'"') | (b == b'\\')) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use proptest::prelude::*;
    use serde_json::json;

    fn want(id: &str, op: &str, params: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({ "id": id, "op": op, "params": params })).unwrap()
    }

    #[test]
    fn requests_are_the_bytes_json_gives() {
        for (id, op, params) in [
            ("c1-1", "read", json!({ "h": 3, "max": 4096 })),
            ("a\"b\\", "open", json!({ "path": "x/é\n", "mode": "r" })),
            ("", "QUOTA", json!({})),
            ("c2-9", "write", json!(null)),
            ("c3-1", "close", json!({ "h": 4 })),
            ("c3-2", "open", json!({})),
            ("c3-3", "OPEN", json!({})),
            ("c3-4", "re\"ad", json!({})),
        ] {
            assert_eq!(req(id, op, params.clone()), want(id, op, params));
        }
    }

    proptest! {
        #[test]
        fn each_builder_gives_the_bytes_json_gives(
            id in ".{0,12}",
            path in prop_oneof![".{0,40}", "[ -~]{0,40}", "\\PC{0,20}"],
            mode in "[rwa+]{0,3}",
            h in any::<u64>(),
            max in any::<u32>(),
            data in proptest::collection::vec(any::<u8>(), 0..300),
            fin in proptest::option::of(any::<bool>()),
        ) {
            prop_assert_eq!(open(&id, &path, &mode), want(&id, "open", json!({ "path": path, "mode": mode })));
            prop_assert_eq!(read(&id, h, max), want(&id, "read", json!({ "h": h, "max": max })));
            prop_assert_eq!(close(&id, h), want(&id, "close", json!({ "h": h })));
            let params = match fin {
                Some(f) => json!({ "h": h, "data": STANDARD.encode(&data), "final": f }),
                None => json!({ "h": h, "data": STANDARD.encode(&data) }),
            };
            prop_assert_eq!(write(&id, h, &data, fin), want(&id, "write", params));
            prop_assert_eq!(
                wrap(&id, &data, &mode),
                want(&id, "FD_WRAP", json!({ "data": STANDARD.encode(&data), "source": mode }))
            );
            let more = fin.unwrap_or(false);
            let chunk = json!({ "stream": path, "data": STANDARD.encode(&data), "more": more, "offset": max });
            prop_assert_eq!(wrap_chunk(&id, &path, &data, more, u64::from(max)), want(&id, "FD_WRAP", chunk));
        }
    }
}
