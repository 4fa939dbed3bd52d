//! The `FD_*` ops' params, field by field: what each decodes to, and the
//! exact error a missing, mistyped, oversized or conflicting field gets.

use super::error::{FdError, FdErrorKind};
use super::search::MAX_QUERY_BYTES;
use super::wire::{
    self, parse_fd, FdOp, FdRequest, Selection, View, WriteMode, MAX_LABEL_BYTES, MAX_PATH_BYTES,
};
use crate::fsproxy::wire::ErrorCode;
use serde_json::{json, Value};

fn parse(op: FdOp, params: Value) -> Result<FdRequest, FdError> {
    let Value::Object(p) = params else { panic!("params are an object") };
    wire::parse(op, &p)
}

/// The `invalid_argument` error, built field by field.
fn arg_error(fd: Option<&str>, message: &str) -> FdError {
    FdError {
        kind: FdErrorKind::InvalidArgument,
        fd: fd.map(str::to_owned),
        message: message.to_owned(),
        details: None,
        code: ErrorCode::Arg,
    }
}

fn accepts(op: FdOp, cases: Vec<(Value, FdRequest)>) {
    for (params, want) in cases {
        assert_eq!(parse(op, params.clone()), Ok(want), "{} {params}", op.as_str());
    }
}

/// `fd`: the error names the fd (as the request spelt it) or not.
fn refuses(op: FdOp, fd: Option<&str>, cases: Vec<(Value, &str)>) {
    for (params, message) in cases {
        assert_eq!(parse(op, params.clone()), Err(arg_error(fd, message)), "{} {params}", op.as_str());
    }
}

fn b64(s: &str) -> String {
    crate::b64::encode(s)
}

#[test]
fn ops_parse_from_and_print_as_their_wire_names() {
    for (name, op) in [
        ("FD_WRAP", FdOp::Wrap),
        ("FD_READ", FdOp::Read),
        ("FD_SEARCH", FdOp::Search),
        ("FD_TO_FILE", FdOp::ToFile),
    ] {
        assert_eq!(FdOp::parse(name), Some(op));
        assert_eq!(op.as_str(), name);
    }
    for name in ["", "fd_read", "FD_READ ", "FD_CLOSE", "READ"] {
        assert_eq!(FdOp::parse(name), None, "{name:?}");
    }
}

#[test]
fn write_modes_print_as_their_wire_names() {
    assert_eq!(WriteMode::Write.as_str(), "write");
    assert_eq!(WriteMode::Append.as_str(), "append");
    assert_eq!(WriteMode::Insert { at: 3 }.as_str(), "insert");
}

#[test]
fn fd_names_parse_only_in_their_canonical_form() {
    let max = format!("fd:{}", u64::MAX);
    for (name, want) in
        [("fd:1", Some(1)), ("fd:0", Some(0)), ("fd:42", Some(42)), (max.as_str(), Some(u64::MAX))]
    {
        assert_eq!(parse_fd(name), want, "{name}");
    }
    for name in ["fd:01", "fd:+1", "fd:", "1", "fd:1 ", "FD:1", "fd:-1", "fd:x", "fd:18446744073709551616"] {
        assert_eq!(parse_fd(name), None, "{name}");
    }
}

#[test]
fn wrap_decodes_data_streams_paths_and_aborts() {
    let wrap = |stream: Option<&str>, data: &[u8], more, offset, source: Option<&str>| FdRequest::Wrap {
        stream: stream.map(str::to_owned),
        data: data.to_vec(),
        more,
        offset,
        source: source.map(str::to_owned),
    };
    accepts(
        FdOp::Wrap,
        vec![
            (json!({"data": b64("hi")}), wrap(None, b"hi", false, None, None)),
            (json!({"data": ""}), wrap(None, b"", false, None, None)),
            (
                json!({"data": b64("ab"), "stream": "s", "more": true, "offset": 7, "source": "user_input"}),
                wrap(Some("s"), b"ab", true, Some(7), Some("user_input")),
            ),
            (
                json!({"data": b64("x"), "stream": "s", "more": false}),
                wrap(Some("s"), b"x", false, None, None),
            ),
            // null is absent, for every kind of field.
            (
                json!({"data": b64("x"), "stream": null, "more": null, "offset": null, "source": null, "path": null, "abort": null}),
                wrap(None, b"x", false, None, None),
            ),
            (json!({"path": "/p"}), FdRequest::WrapPath { path: "/p".into(), source: None }),
            (
                json!({"path": "/p", "source": "tool", "more": false}),
                FdRequest::WrapPath { path: "/p".into(), source: Some("tool".into()) },
            ),
            (json!({"stream": "s", "abort": true}), FdRequest::WrapAbort { stream: "s".into() }),
            (
                json!({"stream": "s", "abort": true, "more": true}),
                FdRequest::WrapAbort { stream: "s".into() },
            ),
            (json!({"data": b64("x"), "abort": false}), wrap(None, b"x", false, None, None)),
        ],
    );
}

#[test]
fn wrap_refusals_say_what_is_wrong() {
    refuses(
        FdOp::Wrap,
        None,
        vec![
            (json!({}), "missing data or path"),
            (json!({"source": "tool"}), "missing data or path"),
            (json!({"data": 5}), "data is not a string"),
            (json!({"data": "!!!!"}), "data is not base64: Invalid symbol 33, offset 0."),
            (json!({"data": b64("x"), "path": "/p"}), "give data or path, not both"),
            (json!({"path": "/p", "stream": "s"}), "a path is wrapped whole, not streamed"),
            (json!({"path": "/p", "more": true}), "a path is wrapped whole, not streamed"),
            (json!({"data": b64("x"), "more": true}), "more needs a stream"),
            (json!({"abort": true}), "abort takes a stream and nothing else"),
            (json!({"abort": true, "stream": "s", "data": ""}), "abort takes a stream and nothing else"),
            (json!({"abort": true, "stream": "s", "path": "/p"}), "abort takes a stream and nothing else"),
            (json!({"abort": "yes", "stream": "s"}), "abort is not a boolean"),
            (json!({"data": "", "more": 1}), "more is not a boolean"),
            (json!({"data": "", "stream": 3}), "stream is not a string"),
            (json!({"data": "", "source": ["tool"]}), "source is not a string"),
            (json!({"path": {}}), "path is not a string"),
            (json!({"data": "", "offset": -1}), "offset is not a non-negative integer"),
            (json!({"data": "", "offset": 1.5}), "offset is not a non-negative integer"),
            (json!({"data": "", "offset": "3"}), "offset is not a non-negative integer"),
        ],
    );
}

#[test]
fn read_decodes_one_view_and_a_cursor() {
    let read = |view, cursor| FdRequest::Read { fd: "fd:1".into(), view, cursor };
    accepts(
        FdOp::Read,
        vec![
            (json!({"fd": "fd:1"}), read(View::Page(1), None)),
            (json!({"fd": "fd:1", "page": 3, "cursor": 9}), read(View::Page(3), Some(9))),
            (json!({"fd": "fd:1", "page": 0}), read(View::Page(0), None)),
            (json!({"fd": "fd:1", "all": true}), read(View::All, None)),
            (json!({"fd": "fd:1", "read_all": true}), read(View::All, None)),
            (json!({"fd": "fd:1", "all": false, "read_all": true}), read(View::All, None)),
            (json!({"fd": "fd:1", "all": true, "read_all": true}), read(View::All, None)),
            (json!({"fd": "fd:1", "all": false, "preview": false}), read(View::Page(1), None)),
            (json!({"fd": "fd:1", "start_line": 2, "end_line": 5}), read(View::Lines(2, 5), None)),
            (json!({"fd": "fd:1", "preview": true, "cursor": 0}), read(View::Preview, Some(0))),
            // Any name is decoded; the machine says whether it exists.
            (
                json!({"fd": "nonsense"}),
                FdRequest::Read { fd: "nonsense".into(), view: View::Page(1), cursor: None },
            ),
        ],
    );
}

#[test]
fn read_refusals_say_what_is_wrong() {
    refuses(
        FdOp::Read,
        None,
        vec![
            (json!({}), "missing fd"),
            (json!({"fd": null}), "missing fd"),
            (json!({"fd": 1}), "fd is not a string"),
            (json!({"fd": "fd:1", "page": "2"}), "page is not a non-negative integer"),
            (json!({"fd": "fd:1", "cursor": -3}), "cursor is not a non-negative integer"),
            (json!({"fd": "fd:1", "all": 1}), "all is not a boolean"),
            (json!({"fd": "fd:1", "read_all": "true"}), "read_all is not a boolean"),
            (json!({"fd": "fd:1", "preview": "no"}), "preview is not a boolean"),
        ],
    );
    let choose = "choose one of page, all, start_line/end_line, preview";
    refuses(
        FdOp::Read,
        Some("fd:1"),
        vec![
            (json!({"fd": "fd:1", "start_line": 2}), "start_line and end_line go together"),
            (json!({"fd": "fd:1", "end_line": 2}), "start_line and end_line go together"),
            (json!({"fd": "fd:1", "page": 1, "all": true}), choose),
            (json!({"fd": "fd:1", "page": 1, "start_line": 1, "end_line": 1}), choose),
            (json!({"fd": "fd:1", "page": 1, "preview": true}), choose),
            (json!({"fd": "fd:1", "all": true, "start_line": 1, "end_line": 1}), choose),
            (json!({"fd": "fd:1", "read_all": true, "preview": true}), choose),
            (json!({"fd": "fd:1", "start_line": 1, "end_line": 1, "preview": true}), choose),
        ],
    );
}

#[test]
fn search_decodes_its_query_case_and_cursor() {
    let search = |query: &str, ignore_case, cursor| FdRequest::Search {
        fd: "fd:2".into(),
        query: query.into(),
        ignore_case,
        cursor,
    };
    accepts(
        FdOp::Search,
        vec![
            (json!({"fd": "fd:2", "query": "x"}), search("x", false, None)),
            (
                json!({"fd": "fd:2", "query": "Ab", "ignore_case": true, "cursor": 4}),
                search("Ab", true, Some(4)),
            ),
            (json!({"fd": "fd:2", "query": " ", "ignore_case": false}), search(" ", false, None)),
        ],
    );
    refuses(FdOp::Search, None, vec![(json!({"query": "x"}), "missing fd")]);
    refuses(
        FdOp::Search,
        None,
        vec![
            (json!({"fd": "fd:2", "query": 1}), "query is not a string"),
            (json!({"fd": "fd:2", "query": "x", "ignore_case": "yes"}), "ignore_case is not a boolean"),
            (json!({"fd": "fd:2", "query": "x", "cursor": "1"}), "cursor is not a non-negative integer"),
        ],
    );
    refuses(
        FdOp::Search,
        Some("fd:2"),
        vec![
            (json!({"fd": "fd:2"}), "missing query"),
            (json!({"fd": "fd:2", "query": null}), "missing query"),
            (json!({"fd": "fd:2", "query": ""}), "the query is empty"),
        ],
    );
}

#[test]
fn to_file_decodes_its_mode_and_selection() {
    let to_file =
        |mode, selection| FdRequest::ToFile { fd: "fd:3".into(), path: "o".into(), mode, selection };
    accepts(
        FdOp::ToFile,
        vec![
            (json!({"fd": "fd:3", "path": "o"}), to_file(WriteMode::Write, Selection::Whole)),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "write"}),
                to_file(WriteMode::Write, Selection::Whole),
            ),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "append"}),
                to_file(WriteMode::Append, Selection::Whole),
            ),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "insert", "insert_at_line": 4}),
                to_file(WriteMode::Insert { at: 4 }, Selection::Whole),
            ),
            // Line 0 is the machine's to refuse, against the file.
            (
                json!({"fd": "fd:3", "path": "o", "mode": "insert", "insert_at_line": 0}),
                to_file(WriteMode::Insert { at: 0 }, Selection::Whole),
            ),
            (json!({"fd": "fd:3", "path": "o", "page": 2}), to_file(WriteMode::Write, Selection::Page(2))),
            (
                json!({"fd": "fd:3", "path": "o", "mode": null, "start_line": 1, "end_line": 3}),
                to_file(WriteMode::Write, Selection::Lines(1, 3)),
            ),
        ],
    );
}

#[test]
fn to_file_refusals_say_what_is_wrong() {
    refuses(
        FdOp::ToFile,
        None,
        vec![
            (json!({"path": "o"}), "missing fd"),
            (json!({"fd": "fd:3", "path": 1}), "path is not a string"),
            (json!({"fd": "fd:3", "path": "o", "mode": 1}), "mode is not a string"),
            (
                json!({"fd": "fd:3", "path": "o", "insert_at_line": -1}),
                "insert_at_line is not a non-negative integer",
            ),
            (json!({"fd": "fd:3", "path": "o", "page": true}), "page is not a non-negative integer"),
            (
                json!({"fd": "fd:3", "path": "o", "end_line": "2", "start_line": 1}),
                "end_line is not a non-negative integer",
            ),
        ],
    );
    refuses(
        FdOp::ToFile,
        Some("fd:3"),
        vec![
            (json!({"fd": "fd:3"}), "missing path"),
            (json!({"fd": "fd:3", "path": ""}), "the path is empty"),
            (json!({"fd": "fd:3", "path": "o", "mode": "insert"}), "mode insert needs insert_at_line"),
            (json!({"fd": "fd:3", "path": "o", "insert_at_line": 2}), "insert_at_line goes with mode insert"),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "write", "insert_at_line": 2}),
                "insert_at_line goes with mode insert",
            ),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "append", "insert_at_line": 2}),
                "insert_at_line goes with mode insert",
            ),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "Write"}),
                "unknown mode \"Write\": want write, append or insert",
            ),
            (
                json!({"fd": "fd:3", "path": "o", "mode": "overwrite", "insert_at_line": 1}),
                "unknown mode \"overwrite\": want write, append or insert",
            ),
            (json!({"fd": "fd:3", "path": "o", "start_line": 1}), "start_line and end_line go together"),
            (
                json!({"fd": "fd:3", "path": "o", "page": 1, "start_line": 1, "end_line": 2}),
                "give page or start_line/end_line, not both",
            ),
        ],
    );
}

#[test]
fn every_string_field_is_bounded_at_its_limit() {
    let fd = |n: usize| format!("fd:{}", "1".repeat(n - 3));
    let at = |n: usize| "p".repeat(n);
    // (op, the params with the field `n` bytes long, the field, its limit)
    type Params = Box<dyn Fn(usize) -> Value>;
    let cases: Vec<(FdOp, Params, &str, usize)> = vec![
        (FdOp::Read, Box::new(move |n| json!({"fd": fd(n)})), "fd", MAX_LABEL_BYTES),
        (FdOp::Wrap, Box::new(move |n| json!({"data": "", "source": at(n)})), "source", MAX_LABEL_BYTES),
        (FdOp::Wrap, Box::new(move |n| json!({"data": "", "stream": at(n)})), "stream", MAX_LABEL_BYTES),
        (FdOp::Wrap, Box::new(move |n| json!({"path": at(n)})), "path", MAX_PATH_BYTES),
        (FdOp::ToFile, Box::new(move |n| json!({"fd": "fd:1", "path": at(n)})), "path", MAX_PATH_BYTES),
        (FdOp::Search, Box::new(move |n| json!({"fd": "fd:1", "query": at(n)})), "query", MAX_QUERY_BYTES),
    ];
    for (op, params, key, max) in cases {
        assert!(parse(op, params(max)).is_ok(), "{key} of {max} bytes");
        let e = parse(op, params(max + 1)).unwrap_err();
        assert_eq!(e, arg_error(None, &format!("{key} is longer than {max} bytes")));
    }
    // The mode's bound comes before its value is looked at.
    let mode = |n| json!({"fd": "fd:1", "path": "o", "mode": "m".repeat(n)});
    let want = format!("unknown mode {:?}: want write, append or insert", "m".repeat(MAX_LABEL_BYTES));
    assert_eq!(parse(FdOp::ToFile, mode(MAX_LABEL_BYTES)), Err(arg_error(Some("fd:1"), &want)));
    let long = format!("mode is longer than {MAX_LABEL_BYTES} bytes");
    assert_eq!(parse(FdOp::ToFile, mode(MAX_LABEL_BYTES + 1)), Err(arg_error(None, &long)));
}
