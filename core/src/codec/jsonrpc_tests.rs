use super::*;
use proptest::prelude::*;
use serde_json::json;

#[test]
fn lines_blank_lines_crlf_and_a_last_line_without_newline() {
    let mut d = LineDecoder::new(8);
    d.push(b"\n  \r\nab\r\ncd");
    assert_eq!(d.next_line().unwrap(), Some(b"ab".to_vec()));
    assert_eq!(d.next_line().unwrap(), None);
    assert_eq!(d.buffered(), 2);
    assert_eq!(d.finish().unwrap(), Some(b"cd".to_vec()));
    assert_eq!(d.buffered(), 0);
}

#[test]
fn the_limit_holds_while_reading() {
    // A line of exactly max bytes is fine; one more byte fails at once,
    // before any newline arrives, and nothing more is buffered.
    let mut d = LineDecoder::new(4);
    d.push(b"abcd\n");
    assert_eq!(d.next_line().unwrap(), Some(b"abcd".to_vec()));
    d.push(b"abcd");
    assert_eq!(d.next_line().unwrap(), None);
    d.push(b"e");
    assert_eq!(d.next_line(), Err(LineError::TooLong { max: 4 }));
    d.push(&[b'x'; 1000]);
    assert_eq!(d.buffered(), 0);
    assert!(d.failed().is_some());
    // A long line that does end is refused too.
    let mut d = LineDecoder::new(4);
    d.push(b"abcdefgh\nok\n");
    assert_eq!(d.next_line(), Err(LineError::TooLong { max: 4 }));
    // The CR counts towards the limit as read (it is part of the bytes).
    let mut d = LineDecoder::new(4);
    d.push(b"abc\r\n");
    assert_eq!(d.next_line().unwrap(), Some(b"abc".to_vec()));
}

#[test]
fn parse_classifies_every_shape() {
    let p = |s: &str| parse(s.as_bytes());
    assert_eq!(
        p(r#"{"jsonrpc":"2.0","id":1,"method":"fs.read","params":{"path":"a"}}"#),
        Incoming::Request { id: Id::from(1), method: "fs.read".into(), params: json!({"path":"a"}) }
    );
    assert_eq!(
        p(r#"{"jsonrpc":"2.0","method":"result","params":{"content":"x"}}"#),
        Incoming::Notification { method: "result".into(), params: json!({"content":"x"}) }
    );
    assert_eq!(
        p(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
        Incoming::Response { id: Some(Id::from("a")) }
    );
    let invalid = |s: &str| match p(s) {
        Incoming::Invalid { id, .. } => id,
        other => panic!("{s}: {other:?}"),
    };
    assert_eq!(invalid("x"), None);
    assert_eq!(invalid("[]"), None);
    assert_eq!(invalid("7"), None);
    assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#), None);
    assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":[1],"method":"m"}"#), None);
    assert_eq!(invalid(r#"{"jsonrpc":"2.1","id":5,"method":"m"}"#), Some(Id::from(5)));
    assert_eq!(invalid(r#"{"id":5,"method":"m"}"#), Some(Id::from(5)));
    assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":5}"#), Some(Id::from(5)));
    assert_eq!(invalid(r#"{"jsonrpc":"2.0","id":5,"method":"m","params":3}"#), Some(Id::from(5)));
    assert_eq!(
        parse(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}"),
        Incoming::Invalid {
            id: None,
            reason: "line is not UTF-8 (invalid utf-8 sequence of 1 bytes from index 34)".into()
        }
    );
    // `1` and `"1"` are different ids.
    assert_ne!(Id::from(1).key(), Id::from("1").key());
}

#[test]
fn outgoing_lines_and_error_codes() {
    let e = Outgoing::Error { id: None, error: RpcError::new(ErrorCode::InvalidRequest, "bad\nline") };
    let line = e.to_line();
    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line, newline escaped inside");
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(v, json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad\nline"}}));
    let codes = [
        (ErrorCode::InvalidRequest, -32600),
        (ErrorCode::MethodNotFound, -32601),
        (ErrorCode::InvalidParams, -32602),
        (ErrorCode::Internal, -32603),
        (ErrorCode::AccessDenied, -32001),
        (ErrorCode::NotFound, -32002),
        (ErrorCode::AlreadyExists, -32003),
        (ErrorCode::Timeout, -32004),
        (ErrorCode::Cancelled, -32005),
    ];
    for (c, n) in codes {
        assert_eq!(c.code(), n);
        assert_eq!(ErrorCode::from_code(n), Some(c));
    }
    assert_eq!(ErrorCode::from_code(-32700), None);
}

proptest! {
    /// However the bytes are cut, the same lines come out, and the decoder
    /// never holds more than one line's limit plus the last push.
    #[test]
    fn splitting_changes_nothing(
        lines in proptest::collection::vec("[a-z {}\"]{0,20}", 0..12),
        cuts in proptest::collection::vec(1usize..16, 0..40),
    ) {
        let max = 16;
        let text: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
        let mut whole = LineDecoder::new(max);
        whole.push(&text);
        let mut want = Vec::new();
        let mut want_err = None;
        loop {
            match whole.next_line() {
                Ok(Some(l)) => want.push(l),
                Ok(None) => break,
                Err(e) => { want_err = Some(e); break; }
            }
        }
        let mut d = LineDecoder::new(max);
        let mut got = Vec::new();
        let mut got_err = None;
        let mut rest = &text[..];
        let mut cuts = cuts.into_iter().cycle();
        'feed: while !rest.is_empty() {
            let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
            d.push(&rest[..n]);
            prop_assert!(d.buffered() <= max + 1 + n + 16 * 20);
            rest = &rest[n..];
            loop {
                match d.next_line() {
                    Ok(Some(l)) => got.push(l),
                    Ok(None) => break,
                    Err(e) => { got_err = Some(e); break 'feed; }
                }
            }
            prop_assert!(d.buffered() <= max + 1);
        }
        prop_assert_eq!(got_err, want_err.clone());
        if want_err.is_none() {
            prop_assert_eq!(got, want);
        }
    }

    /// Whatever the bytes, parse never panics, and an id it reports is a
    /// number or a string.
    #[test]
    fn parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        match parse(&bytes) {
            Incoming::Request { id, .. } | Incoming::Invalid { id: Some(id), .. } | Incoming::Response { id: Some(id) } => {
                prop_assert!(id.value().is_number() || id.value().is_string());
            }
            _ => {}
        }
    }
}

/// The exact count: one value, plus one per array or object and per
/// comma outside strings.
fn values(line: &str) -> usize {
    (1..).find(|n| !crate::codec::values::over(line.as_bytes(), *n)).unwrap_or(usize::MAX)
}

#[test]
fn values_are_counted_outside_strings_only() {
    assert_eq!(values(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"running"}}"#), 5);
    assert_eq!(values(r#""[{,}]""#), 1);
    assert_eq!(values(r#"["a\",[{", "\\", [1,2]]"#), 6);
    assert_eq!(values("[]"), 2);
}

#[test]
fn a_line_past_max_values_is_refused_before_it_is_built_and_one_at_it_is_parsed() {
    let line = |n: usize| {
        let items = vec!["0"; n].join(",");
        format!(r#"{{"jsonrpc":"2.0","method":"state","params":{{"type":"running","v":[{items}]}}}}"#)
    };
    // The envelope is 5 values, `"v":[` adds a comma and an array, and
    // each of the n numbers but the first a comma: n + 6 values in all.
    let at = line(94);
    assert_eq!(values(&at), 100);
    assert!(matches!(parse_bounded(at.as_bytes(), 100), Incoming::Notification { .. }));
    match parse_bounded(line(95).as_bytes(), 100) {
        Incoming::Invalid { id: None, reason } => {
            assert!(
                reason.contains("more than 100 JSON values") && reason.contains("--max-line-values"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// What the limit is for: a line that would cost about a hundred times
/// its size once parsed is refused having allocated almost nothing.
#[cfg(feature = "heapcount")]
#[test]
fn a_hostile_line_is_refused_without_being_built() {
    use crate::heapcount::{cost, installed, Tag};
    let mut line = String::from(r#"{"jsonrpc":"2.0","method":"state","params":{"type":"running","v":["#);
    for _ in 0..200_000 {
        line.push_str(r#"{"a":0},"#);
    }
    line.push_str("0]}}");
    let (got, c) = cost(Tag::new(7), || parse(line.as_bytes()));
    assert!(matches!(got, Incoming::Invalid { .. }), "{got:?}");
    assert!(installed(), "the lib's tests count the heap");
    let c = c.expect("counted");
    assert!(c.peak < 4096, "parsing the refused line of {} bytes peaked at {} bytes", line.len(), c.peak);
    // Without the limit the same line costs about a hundred times itself.
    let (_, unbounded) = cost(Tag::new(7), || parse_bounded(line.as_bytes(), usize::MAX));
    let unbounded = unbounded.expect("counted");
    assert!(unbounded.peak > 20 * line.len() as u64, "{unbounded:?} for {} bytes", line.len());
}
