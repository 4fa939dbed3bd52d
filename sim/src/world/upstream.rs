//! What the checkers read of each request an intermediate forwards to
//! its upstream: `params.h`, and an open's `params.path`, each read as
//! `serde_json::Value` reads it. Every forwarded frame is checked, so the
//! plain frames the core writes are scanned in place (`codec::plain`)
//! rather than built into a tree; anything else (an escape, a float, a
//! nested value, a repeated member, bytes that are not UTF-8) is read as a
//! `Value`, so the two readings agree on every frame (property-tested).

use airlock_core::codec::plain::{is_text, Cursor};
use serde_json::Value;
use std::borrow::Cow;

/// The members the checkers look at.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Forwarded<'a> {
    /// `params.h`, as `Value::as_u64` reads it.
    pub h: Option<u64>,
    /// `params.path` as a string, when `op` is `"open"`.
    pub open_path: Option<Cow<'a, str>>,
}

/// `Err` is serde_json's reason the frame is not JSON.
pub(super) fn read(payload: &[u8]) -> Result<Forwarded<'_>, String> {
    match scan(payload) {
        Some(f) => Ok(f),
        None => by_value(payload),
    }
}

/// The reading through a `Value`, which decides every frame.
fn by_value(payload: &[u8]) -> Result<Forwarded<'static>, String> {
    let v: Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    let params = v.get("params");
    let h = params.and_then(|p| p.get("h")).and_then(Value::as_u64);
    let path = params.and_then(|p| p.get("path")).and_then(Value::as_str);
    let open_path = path.filter(|_| v["op"] == "open").map(|p| Cow::Owned(p.to_owned()));
    Ok(Forwarded { h, open_path })
}

/// What a param's value is, as far as the checks care.
enum Param<'a> {
    Uint(u64),
    Text(&'a str),
    Other,
}

/// The plain case, or `None` for [`by_value`] to decide.
fn scan(payload: &[u8]) -> Option<Forwarded<'_>> {
    let mut c = Cursor::new(payload);
    let (mut id, mut op, mut params) = (false, None, None);
    c.ws();
    c.object(|c, key| match key {
        b"id" if !id => {
            id = true;
            c.text().map(drop)
        }
        b"op" if op.is_none() => {
            op = Some(c.text()?);
            Some(())
        }
        b"params" if params.is_none() => {
            params = Some(scan_params(c)?);
            Some(())
        }
        // Repeated or other members: the tree's.
        _ => None,
    })?;
    if !c.at_end() {
        return None;
    }
    let (h, path) = params.unwrap_or_default();
    let open_path = path.filter(|_| op == Some("open")).map(Cow::Borrowed);
    Some(Forwarded { h, open_path })
}

/// `params`: an object of scalars. Returns its `h` as an integer and its
/// `path` as a string, where they are those.
fn scan_params<'a>(c: &mut Cursor<'a>) -> Option<(Option<u64>, Option<&'a str>)> {
    let (mut h, mut path) = (None, None);
    c.object(|c, key| {
        if !is_text(key) {
            return None;
        }
        let value = param(c)?;
        // A repeated member: the last, as `Value` keeps it.
        match (key, value) {
            (b"h", Param::Uint(n)) => h = Some(n),
            (b"h", _) => h = None,
            (b"path", Param::Text(p)) => path = Some(p),
            (b"path", _) => path = None,
            _ => {}
        }
        Some(())
    })?;
    Some((h, path))
}

fn param<'a>(c: &mut Cursor<'a>) -> Option<Param<'a>> {
    Some(match c.peek()? {
        b'"' => Param::Text(c.text()?),
        b't' => c.literal(b"true").map(|()| Param::Other)?,
        b'f' => c.literal(b"false").map(|()| Param::Other)?,
        b'n' => c.literal(b"null").map(|()| Param::Other)?,
        // A plain non-negative integer; a sign, a fraction or an exponent
        // declines (serde_json's own reading of those is the tree's).
        _ => Param::Uint(c.uint()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Values the scan reads, weighted up so that whole frames of them
    /// (repeated members included) are common, and values it declines.
    fn value() -> impl Strategy<Value = String> {
        const READ: [&str; 11] = [
            "3",
            "2",
            "0",
            "18446744073709551615",
            "true",
            "null",
            r#""open""#,
            r#""v/a""#,
            r#""/data/x""#,
            "\"\u{e9}\"",
            r#""aGk=""#,
        ];
        const DECLINED: [&str; 10] = [
            "-0",
            "-2",
            "2.0",
            "1e2",
            "007",
            "18446744073709551616",
            r#""o\u0070en""#,
            r#""a\"b""#,
            r#"{"h":1}"#,
            "[1,2]",
        ];
        prop_oneof![
            4 => proptest::sample::select(&READ[..]),
            1 => proptest::sample::select(&DECLINED[..]),
        ]
        .prop_map(str::to_owned)
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("h"),
            Just("path"),
            Just("mode"),
            Just("data"),
            Just("op"),
            Just("id"),
            Just("params"),
            Just("x"),
        ]
        .prop_map(str::to_owned)
    }

    fn object(members: Vec<(String, String)>) -> String {
        let body: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    }

    /// Forwarded-request-shaped frames, and their near misses.
    fn frame() -> impl Strategy<Value = Vec<u8>> {
        let params = proptest::collection::vec((key(), value()), 0..5).prop_map(object);
        // Mostly what the core writes, so that the scan answers often.
        let id = prop_oneof![4 => Just(Some(r#""c1-2""#.to_owned())), 1 => proptest::option::of(value())];
        let op = prop_oneof![
            2 => Just(Some(r#""open""#.to_owned())),
            1 => Just(Some(r#""read""#.to_owned())),
            1 => proptest::option::of(value()),
        ];
        let params = prop_oneof![4 => params.prop_map(Some), 1 => proptest::option::of(value())];
        let extra =
            prop_oneof![4 => Just(Vec::new()), 1 => proptest::collection::vec((key(), value()), 1..2)];
        let top = (id, op, params, extra).prop_map(|(id, op, params, extra)| {
            let mut members = Vec::new();
            id.into_iter().for_each(|v| members.push(("id".to_owned(), v)));
            op.into_iter().for_each(|v| members.push(("op".to_owned(), v)));
            params.into_iter().for_each(|v| members.push(("params".to_owned(), v)));
            members.extend(extra);
            object(members)
        });
        let odd = prop_oneof![4 => Just(None), 1 => Just(Some(b' ')), 1 => Just(Some(0xff_u8))];
        (top, any::<u8>(), 0usize..200, odd).prop_map(|(f, b, at, odd)| {
            let mut bytes = f.into_bytes();
            if let Some(odd) = odd {
                let at = at % (bytes.len() + 1);
                bytes.insert(at, if odd == 0xff { b | 0x80 } else { odd });
            }
            bytes
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// Wherever the scan answers, it reads what the tree reads.
        #[test]
        fn the_scan_reads_what_the_tree_reads(frame in frame()) {
            if let Some(scanned) = scan(&frame) {
                prop_assert_eq!(Ok(scanned), by_value(&frame), "{}", String::from_utf8_lossy(&frame));
            }
        }
    }

    /// The property above holds only where the scan answers: it must
    /// answer often enough for that to mean something.
    #[test]
    fn the_scan_answers_a_good_share_of_the_frames() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = frame();
        let n = 2000;
        let scanned = (0..n)
            .filter(|_| scan(&strategy.new_tree(&mut runner).expect("a frame").current()).is_some())
            .count();
        assert!(scanned * 5 >= n, "the scan answered {scanned} of {n} frames");
        assert!(scanned < n, "every frame scanned: the generator makes no near misses");
    }

    #[test]
    fn the_core_s_forwarded_frames_are_scanned() {
        for (frame, h, path) in [
            (r#"{"id":"c1-2","op":"read","params":{"h":7,"max":100}}"#, Some(7), None),
            (r#"{"id":"c1-3","op":"open","params":{"mode":"r","path":"v/x"}}"#, None, Some("v/x")),
            (r#"{"id":"c1-4","op":"FD_READ","params":{"fd":"fd:3","path":"v/x"}}"#, None, None),
        ] {
            let f = scan(frame.as_bytes()).expect(frame);
            assert_eq!((f.h, f.open_path.as_deref()), (h, path), "{frame}");
        }
        assert_eq!(read(b"{\"id\":").map(drop).map_err(|e| e.contains("EOF")), Err(true));
    }
}
