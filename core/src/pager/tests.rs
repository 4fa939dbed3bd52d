//! The pager's laws against a naive model, its XML read back by a real
//! parser, and snapshots of the seed's examples and every error.

use super::error::FdError;
use super::machine::{FileOp, FileResult, JobId, Pager, PagerInput, PagerOutput};
use super::search::{fold, Query};
use super::store::{Builder, Document, Encoding};
use super::wire::{self, FdOp, FdRequest};
use super::xml::{self, Part};
use super::PagerConfig;
use crate::fsproxy::FsErrorKind;
use crate::handles::ClientId;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const C: ClientId = ClientId(1);

/// Pages by the rule, over characters, the slow obvious way.
fn naive_pages(chars: &[char], p: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut s = 0;
    if chars.is_empty() {
        return vec![(0, 0)];
    }
    while s < chars.len() {
        if chars.len() - s <= p {
            out.push((s, chars.len()));
            break;
        }
        let e = match chars[s..s + p].iter().rposition(|&c| c == '\n') {
            Some(i) => s + i + 1,
            None => s + p,
        };
        out.push((s, e));
        s = e;
    }
    out
}

/// 1-based line of character `i`.
fn naive_line(chars: &[char], i: usize) -> u64 {
    chars[..i].iter().filter(|&&c| c == '\n').count() as u64 + 1
}

fn xml_text(x: &str, tag: &str) -> String {
    let doc = roxmltree::Document::parse(x).unwrap_or_else(|e| panic!("not XML ({e}): {x}"));
    let node = doc.descendants().find(|n| n.has_tag_name(tag)).unwrap_or_else(|| panic!("no <{tag}> in {x}"));
    node.text().unwrap_or_default().to_owned()
}

fn xml_attr(x: &str, tag: &str, name: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(x).ok()?;
    let node = doc.descendants().find(|n| n.has_tag_name(tag))?;
    node.attribute(name).map(str::to_owned)
}

/// Every part of a rendering, from the start, with `budget`.
fn render_all(doc: &Document, head: &str, span: std::ops::Range<u64>, tail: &str, budget: usize) -> String {
    let mut out = String::new();
    let mut cursor = None;
    loop {
        let Part { xml, next } = xml::render_span(doc, head, span.clone(), tail, cursor, budget).unwrap();
        out.push_str(&xml);
        match next {
            None => return out,
            Some(n) => {
                assert!(cursor.is_none_or(|c| n > c) || !xml.is_empty(), "no progress");
                cursor = Some(n);
            }
        }
    }
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Lines of mixed lengths, multi-byte characters, XML specials, CRLF.
    let piece = prop_oneof![
        4 => "[a-z]{0,12}",
        2 => Just("\n".to_string()),
        1 => Just("\r\n".to_string()),
        1 => "[<>&\"'é😀ß]{1,3}",
        1 => "[a]{5,40}",
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn pages_follow_the_naive_model(text in text_strategy(), p in 1u64..20, chunk in 1usize..9) {
        let chars: Vec<char> = text.chars().collect();
        // Fed in small chunks, splitting UTF-8 sequences.
        let mut b = Builder::new(p);
        for c in text.as_bytes().chunks(chunk) {
            b.push(c, u64::MAX).unwrap();
        }
        let doc = b.finish();
        prop_assert_eq!(doc.encoding(), Encoding::Utf8);
        let naive = naive_pages(&chars, p as usize);
        prop_assert_eq!(doc.pages(), naive.len() as u64);
        let mut joined = String::new();
        for (i, &(s, e)) in naive.iter().enumerate() {
            let page = doc.page(i as u64 + 1).unwrap();
            let got = doc.text(page.span.clone());
            let want: String = chars[s..e].iter().collect();
            prop_assert_eq!(&got, &want);
            prop_assert!(got.chars().count() as u64 <= p);
            joined.push_str(&got);
            let continued = s > 0 && chars[s - 1] != '\n';
            let truncated = i + 1 < naive.len() && chars[e - 1] != '\n';
            prop_assert_eq!(page.continued, continued);
            prop_assert_eq!(page.truncated, truncated);
            if s < e {
                prop_assert_eq!(page.lines, (naive_line(&chars, s), naive_line(&chars, e - 1)));
            }
        }
        prop_assert_eq!(joined, text.clone());
        prop_assert!(doc.page(0).is_none());
        prop_assert!(doc.page(doc.pages() + 1).is_none());
    }

    #[test]
    fn line_ranges_agree_with_a_naive_split(text in text_strategy(), a in 0u64..12, len in 0u64..6) {
        let doc = Document::from_bytes(text.as_bytes(), 7);
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        prop_assert_eq!(doc.total_lines(), lines.len() as u64);
        let b = a + len;
        match doc.lines(a, b) {
            Some(span) => {
                prop_assert!(a >= 1 && b <= lines.len() as u64);
                let want: String = lines[(a - 1) as usize..b as usize].concat();
                prop_assert_eq!(doc.text(span), want);
            }
            None => prop_assert!(a == 0 || b > lines.len() as u64),
        }
        prop_assert_eq!(super::store::count_lines(text.as_bytes()), lines.len() as u64);
    }

    #[test]
    fn xml_parses_back_to_the_text_in_any_number_of_parts(text in text_strategy(), p in 1u64..30, budget in 1usize..200) {
        let doc = Document::from_bytes(text.as_bytes(), p);
        for n in 1..=doc.pages() {
            let (head, span) = xml::page_head("fd:1", &doc, n).unwrap();
            let whole = render_all(&doc, &head, span.clone(), xml::CONTENT_TAIL, usize::MAX / 2);
            let parts = render_all(&doc, &head, span.clone(), xml::CONTENT_TAIL, budget);
            prop_assert_eq!(&whole, &parts);
            prop_assert_eq!(xml_text(&whole, "fd_content"), doc.text(span));
            prop_assert_eq!(xml_attr(&whole, "fd_content", "pages"), Some(doc.pages().to_string()));
        }
        let (head, tail) = xml::result_head("fd:1", &doc, "m");
        let span = doc.page(1).unwrap().span;
        let whole = render_all(&doc, &head, span.clone(), &tail, 64);
        prop_assert_eq!(xml_text(&whole, "preview"), doc.text(span));
    }

    #[test]
    fn binary_and_xml_hostile_content_is_base64(mut bytes in proptest::collection::vec(any::<u8>(), 0..200), p in 1u64..50) {
        bytes.push(0x01);
        let doc = Document::from_bytes(&bytes, p);
        prop_assert_eq!(doc.encoding(), Encoding::Base64);
        let b64 = STANDARD.encode(&bytes);
        let mut joined = String::new();
        let mut raw = Vec::new();
        for n in 1..=doc.pages() {
            let page = doc.page(n).unwrap();
            joined.push_str(&doc.text(page.span.clone()));
            raw.extend_from_slice(doc.bytes_of(page.span.clone()));
            let (head, span) = xml::page_head("fd:2", &doc, n).unwrap();
            let x = render_all(&doc, &head, span.clone(), xml::CONTENT_TAIL, 40);
            prop_assert_eq!(xml_attr(&x, "fd_content", "encoding"), Some("base64".into()));
            prop_assert_eq!(xml_text(&x, "fd_content"), doc.text(span));
        }
        prop_assert_eq!(joined, b64);
        prop_assert_eq!(raw, bytes);
    }

    #[test]
    fn search_matches_a_naive_scan(text in text_strategy(), q in "[a-zA-Zé<]{1,3}", ci: bool) {
        let doc = Document::from_bytes(text.as_bytes(), 10);
        let fq = |s: &str| -> String { if ci { s.chars().map(fold).collect() } else { s.to_owned() } };
        let want: Vec<(usize, &str)> = text
            .split_inclusive('\n')
            .map(|l| l.strip_suffix('\n').unwrap_or(l))
            .enumerate()
            .filter(|(_, l)| fq(l).contains(&fq(&q)))
            .collect();
        let query = Query::new(&q, ci);
        prop_assert_eq!(super::search::count(&doc, &query), want.len() as u64);
        for budget in [300, 1 << 20] {
            let mut x = String::new();
            let mut cursor = None;
            loop {
                let part = super::search::render(&doc, "fd:1", &q, &query, cursor, budget).unwrap();
                x.push_str(&part.xml);
                match part.next { Some(n) => cursor = Some(n), None => break }
            }
            let parsed = roxmltree::Document::parse(&x).unwrap();
            let got: Vec<(usize, String)> = parsed
                .descendants()
                .filter(|n| n.has_tag_name("match"))
                .map(|n| (n.attribute("line").unwrap().parse::<usize>().unwrap() - 1, n.text().unwrap_or_default().to_owned()))
                .collect();
            let want: Vec<(usize, String)> = want.iter().map(|(i, l)| (*i, l.to_string())).collect();
            prop_assert_eq!(got, want.clone());
        }
    }

    #[test]
    fn fold_is_idempotent(c: char) {
        prop_assert_eq!(fold(fold(c)), fold(c));
    }
}

// ---- the machine, through requests ----

fn pager(config: PagerConfig) -> Pager {
    Pager::new(config, 1 << 20)
}

fn small() -> PagerConfig {
    PagerConfig {
        max_direct_output_chars: 8,
        default_page_size: 4,
        max_input_chars: 6,
        ..PagerConfig::default()
    }
}

fn request(p: &mut Pager, op: FdOp, params: Value) -> Result<Map<String, Value>, FdError> {
    let Value::Object(params) = params else { panic!("params") };
    let req = wire::parse(op, &params)?;
    p.handle(PagerInput::Request { client: C, id: "1".into(), req });
    match p.poll_output() {
        Some(PagerOutput::Reply { outcome, .. }) => outcome,
        other => panic!("expected a reply, got {other:?}"),
    }
}

fn xml_of(r: &Result<Map<String, Value>, FdError>) -> String {
    match r {
        Ok(m) => m["xml"].as_str().unwrap().to_owned(),
        Err(e) => e.to_xml(),
    }
}

fn wrap(p: &mut Pager, text: &[u8]) -> Result<Map<String, Value>, FdError> {
    request(p, FdOp::Wrap, json!({ "data": STANDARD.encode(text) }))
}

#[test]
fn content_at_the_threshold_comes_back_unchanged_and_makes_no_fd() {
    let mut p = pager(small());
    let r = wrap(&mut p, b"12345678").unwrap();
    assert_eq!(r["direct"], true);
    assert_eq!(r["data"], STANDARD.encode(b"12345678"));
    assert_eq!(p.fds().count(), 0);
    let r = wrap(&mut p, b"123456789").unwrap();
    assert_eq!(r["fd"], "fd:1");
    // Binary: the threshold counts the base64 characters, at or under it
    // the original bytes come back.
    let r = wrap(&mut p, &[0xff, 0, 1]).unwrap();
    assert_eq!(r["data"], STANDARD.encode([0xff, 0, 1]));
    let r = wrap(&mut p, &[0xff; 7]).unwrap();
    assert_eq!(r["fd"], "fd:2");
}

#[test]
fn user_input_has_its_own_threshold_and_message() {
    let mut p = pager(small());
    let r = request(&mut p, FdOp::Wrap, json!({"data": STANDARD.encode("1234567"), "source": "user_input"}))
        .unwrap();
    let user = "Large user input has been stored in a file descriptor.";
    assert!(xml_of(&Ok(r.clone())).contains(user), "{r:?}");
    // A preview read later names the same origin, and an output's fd keeps
    // its own message beside it.
    request(&mut p, FdOp::Wrap, json!({"data": STANDARD.encode("123456789")})).unwrap();
    let again = xml_of(&request(&mut p, FdOp::Read, json!({"fd": "fd:1", "preview": true})));
    assert!(again.contains(user) && !again.contains("Output exceeds"), "{again}");
    let output = xml_of(&request(&mut p, FdOp::Read, json!({"fd": "fd:2", "preview": true})));
    assert!(output.contains("Output exceeds 8 characters") && !output.contains(user), "{output}");
    let mut off = small();
    off.page_user_input = false;
    let mut p = pager(off);
    let r = request(&mut p, FdOp::Wrap, json!({"data": STANDARD.encode("1234567"), "source": "user_input"}))
        .unwrap();
    assert_eq!(r["direct"], true);
}

#[test]
fn a_line_of_k_pages_ends_with_a_one_character_continued_page() {
    let doc = Document::from_bytes(b"abcdefgh\n", 4);
    assert_eq!(doc.pages(), 3);
    let last = doc.page(3).unwrap();
    assert_eq!(doc.text(last.span.clone()), "\n");
    assert!(last.continued);
    assert!(!last.truncated);
    assert_eq!(last.lines, (1, 1));
}

#[test]
fn lines_count_by_the_seed_rule() {
    for (text, n) in [("a\nb\n", 2), ("a\nb", 2), ("", 0), ("\n", 1), ("\r\n\r\n", 2)] {
        assert_eq!(Document::from_bytes(text.as_bytes(), 3).total_lines(), n, "{text:?}");
    }
}

#[test]
fn unicode_pages_never_split_a_character() {
    let text = "é😀ßa".repeat(5);
    let doc = Document::from_bytes(text.as_bytes(), 3);
    for n in 1..=doc.pages() {
        let s = doc.text(doc.page(n).unwrap().span);
        assert!(s.chars().count() <= 3);
    }
}

#[test]
fn stored_once_with_a_compact_index() {
    let text = "0123456789abcdefghi\n".repeat(1000);
    let doc = Document::from_bytes(text.as_bytes(), 4000);
    // 20 000 bytes, 1000 lines, 5 pages: 4 bytes per line, 4 per page.
    assert_eq!(doc.held(), 20_000 + 4 * 1000 + 4 * 5);
}

#[test]
fn a_stream_is_bounded_while_it_streams_and_nothing_stored_is_touched() {
    let mut cfg = small();
    cfg.max_total_bytes = 120;
    let mut p = pager(cfg);
    let first = wrap(&mut p, b"0123456789\n0123").unwrap();
    assert_eq!(first["fd"], "fd:1");
    let held = p.held();
    let chunk = STANDARD.encode([b'x'; 30]);
    let ok = request(&mut p, FdOp::Wrap, json!({"stream": "s", "data": chunk, "more": true})).unwrap();
    assert_eq!(ok["received"], 30);
    let err = request(&mut p, FdOp::Wrap, json!({"stream": "s", "data": chunk, "more": true})).unwrap_err();
    assert!(p.held_total() <= 120);
    insta::assert_snapshot!("error_limit", err.to_xml());
    // The stream is gone and fd:1 is intact.
    assert_eq!(p.held(), held);
    assert_eq!(p.busy(), (0, 0));
    let r = request(&mut p, FdOp::Read, json!({"fd": "fd:1", "all": true})).unwrap();
    assert_eq!(xml_text(&xml_of(&Ok(r)), "fd_content"), "0123456789\n0123");
}

#[test]
fn seed_examples() {
    // The seed's shapes: 210 lines of mixed lengths.
    let text: String = (1..=210).map(|i| format!("line {i}: {}\n", "x".repeat(i % 37))).collect();
    let cfg =
        PagerConfig { default_page_size: 1000, max_direct_output_chars: 2000, ..PagerConfig::default() };
    let mut p = pager(cfg);
    let r = wrap(&mut p, text.as_bytes());
    insta::assert_snapshot!("seed_fd_result", xml_of(&r));
    let r = request(&mut p, FdOp::Read, json!({"fd": "fd:1", "page": 2}));
    insta::assert_snapshot!("seed_read_page_2", xml_of(&r));
    let r = request(&mut p, FdOp::Read, json!({"fd": "fd:1", "start_line": 45, "end_line": 47}));
    insta::assert_snapshot!("seed_read_lines", xml_of(&r));
    let r = request(&mut p, FdOp::Search, json!({"fd": "fd:1", "query": "LINE 20", "ignore_case": true}));
    insta::assert_snapshot!("seed_search", xml_of(&r));
}

#[test]
fn xml_hostile_content_is_escaped_exactly() {
    let mut p = pager(small());
    let text = "<a href=\"x\">&'</a>\r\n\ttab";
    wrap(&mut p, text.as_bytes()).unwrap();
    let r = request(&mut p, FdOp::Read, json!({"fd": "fd:1", "all": true}));
    let x = xml_of(&r);
    insta::assert_snapshot!("escaped_all", x);
    assert_eq!(xml_text(&x, "fd_content"), text);
    wrap(&mut p, b"nul\0here and more").unwrap();
    let r = request(&mut p, FdOp::Read, json!({"fd": "fd:2", "page": 1}));
    insta::assert_snapshot!("base64_page", xml_of(&r));
}

#[test]
fn every_error() {
    let mut p = pager(small());
    wrap(&mut p, b"one\ntwo\nthree\nfour\n").unwrap();
    wrap(&mut p, &[0xff; 20]).unwrap();
    let cases = [
        ("not_found", FdOp::Read, json!({"fd": "fd:nonexistent"})),
        ("not_found_number", FdOp::Read, json!({"fd": "fd:99"})),
        ("invalid_page_high", FdOp::Read, json!({"fd": "fd:1", "page": 100})),
        ("invalid_page_zero", FdOp::Read, json!({"fd": "fd:1", "page": 0})),
        ("invalid_range_reversed", FdOp::Read, json!({"fd": "fd:1", "start_line": 3, "end_line": 2})),
        ("invalid_range_past_end", FdOp::Read, json!({"fd": "fd:1", "start_line": 1, "end_line": 5})),
        ("invalid_range_zero", FdOp::Read, json!({"fd": "fd:1", "start_line": 0, "end_line": 1})),
        (
            "page_with_lines",
            FdOp::ToFile,
            json!({"fd": "fd:1", "path": "o", "page": 1, "start_line": 1, "end_line": 1}),
        ),
        ("insert_without_line", FdOp::ToFile, json!({"fd": "fd:1", "path": "o", "mode": "insert"})),
        ("bad_mode", FdOp::ToFile, json!({"fd": "fd:1", "path": "o", "mode": "overwrite"})),
        ("to_file_bad_page", FdOp::ToFile, json!({"fd": "fd:1", "path": "o", "page": 9})),
        ("search_binary", FdOp::Search, json!({"fd": "fd:2", "query": "x"})),
        ("search_empty", FdOp::Search, json!({"fd": "fd:1", "query": ""})),
        ("search_hostile_query", FdOp::Search, json!({"fd": "fd:1", "query": "a\u{1}"})),
        ("bad_cursor", FdOp::Read, json!({"fd": "fd:1", "page": 1, "cursor": 999})),
        ("wrap_nothing", FdOp::Wrap, json!({})),
        ("wrap_more_without_stream", FdOp::Wrap, json!({"data": "", "more": true})),
    ];
    let mut all = String::new();
    for (name, op, params) in cases {
        let e = request(&mut p, op, params).expect_err(name);
        roxmltree::Document::parse(&e.to_xml()).unwrap();
        all.push_str(&format!("{name} ({}):\n{}\n\n", e.code, e.to_xml()));
    }
    insta::assert_snapshot!("every_error", all);
}

/// Run a pager's file jobs against an in-memory file map.
fn run_jobs(
    p: &mut Pager,
    files: &mut std::collections::BTreeMap<String, Vec<u8>>,
    refused: &[&str],
) -> Result<Map<String, Value>, FdError> {
    let mut open: Option<(String, usize, bool)> = None;
    loop {
        match p.poll_output() {
            Some(PagerOutput::Reply { outcome, .. }) => return outcome,
            Some(PagerOutput::File { job, op, .. }) => {
                let result = match op {
                    FileOp::Open { path, access } => {
                        let write = !matches!(access, super::Access::Read);
                        if refused.contains(&path.as_str()) {
                            FileResult::Failed {
                                kind: FsErrorKind::Denied,
                                message: "Permission denied".into(),
                            }
                        } else if matches!(access, super::Access::Read | super::Access::ReadForWrite)
                            && !files.contains_key(&path)
                        {
                            FileResult::Failed { kind: FsErrorKind::NotFound, message: "No such file".into() }
                        } else {
                            let f = files.entry(path.clone()).or_default();
                            if access == super::Access::Write {
                                f.clear();
                            }
                            let pos = if access == super::Access::Append { f.len() } else { 0 };
                            open = Some((path, pos, write));
                            FileResult::Opened
                        }
                    }
                    FileOp::Read { max } => {
                        let (path, pos, _) = open.as_mut().unwrap();
                        let f = &files[path.as_str()];
                        let end = (*pos + max as usize).min(f.len());
                        let data = f[*pos..end].to_vec();
                        *pos = end;
                        FileResult::Data { eof: data.is_empty(), data }
                    }
                    FileOp::Write { data } => {
                        let (path, pos, _) = open.as_mut().unwrap();
                        let f = files.get_mut(path.as_str()).unwrap();
                        f.truncate(*pos);
                        f.extend_from_slice(&data);
                        *pos += data.len();
                        FileResult::Written
                    }
                    FileOp::Close => {
                        open = None;
                        FileResult::Closed
                    }
                };
                p.handle(PagerInput::FileDone { job, result });
            }
            None => panic!("no reply"),
        }
    }
}

fn to_file(
    p: &mut Pager,
    files: &mut std::collections::BTreeMap<String, Vec<u8>>,
    params: Value,
) -> Result<Map<String, Value>, FdError> {
    let Value::Object(params) = params else { panic!() };
    let req = wire::parse(FdOp::ToFile, &params)?;
    p.handle(PagerInput::Request { client: C, id: "1".into(), req });
    run_jobs(p, files, &["/root/protected.txt"])
}

#[test]
fn to_file_writes_appends_and_inserts() {
    let mut p = pager(small());
    let mut files = std::collections::BTreeMap::new();
    wrap(&mut p, b"one\ntwo\nthree\nfour\n").unwrap();
    let r = to_file(&mut p, &mut files, json!({"fd": "fd:1", "path": "/out.txt"}));
    insta::assert_snapshot!("fd_write", xml_of(&r));
    let r = to_file(
        &mut p,
        &mut files,
        json!({"fd": "fd:1", "path": "/out.txt", "mode": "append", "start_line": 2, "end_line": 2}),
    );
    assert!(xml_of(&r).contains("<bytes>4</bytes>"));
    assert_eq!(files["/out.txt"], b"one\ntwo\nthree\nfour\ntwo\n");
    let r = to_file(
        &mut p,
        &mut files,
        json!({"fd": "fd:1", "path": "/out.txt", "mode": "insert", "insert_at_line": 2, "page": 1}),
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(files["/out.txt"], b"one\none\ntwo\nthree\nfour\ntwo\n");
    // lines + 1 appends; a missing file counts as empty.
    to_file(
        &mut p,
        &mut files,
        json!({"fd": "fd:1", "path": "/out.txt", "mode": "insert", "insert_at_line": 7, "page": 2}),
    )
    .unwrap();
    assert_eq!(files["/out.txt"], b"one\none\ntwo\nthree\nfour\ntwo\ntwo\n");
    to_file(
        &mut p,
        &mut files,
        json!({"fd": "fd:1", "path": "/new.txt", "mode": "insert", "insert_at_line": 1}),
    )
    .unwrap();
    assert_eq!(files["/new.txt"], b"one\ntwo\nthree\nfour\n");
    let before = files.clone();
    let e = to_file(
        &mut p,
        &mut files,
        json!({"fd": "fd:1", "path": "/out.txt", "mode": "insert", "insert_at_line": 9}),
    )
    .unwrap_err();
    insta::assert_snapshot!("error_insert_range", e.to_xml());
    let e = to_file(&mut p, &mut files, json!({"fd": "fd:1", "path": "/root/protected.txt"})).unwrap_err();
    insta::assert_snapshot!("error_file_operation", e.to_xml());
    assert_eq!(files, before, "nothing is written on error");
    // A base64 fd writes its decoded bytes.
    wrap(&mut p, &[0xff, 0xfe, 0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    to_file(&mut p, &mut files, json!({"fd": "fd:2", "path": "/bin"})).unwrap();
    assert_eq!(files["/bin"], [0xff, 0xfe, 0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn wrap_of_a_path_reads_it_through_the_embedder() {
    let mut p = pager(small());
    let mut files = std::collections::BTreeMap::new();
    files.insert("/big".to_string(), b"0123456789\n".repeat(10_000));
    p.handle(PagerInput::Request {
        client: C,
        id: "1".into(),
        req: FdRequest::WrapPath { path: "/big".into(), source: None },
    });
    let r = run_jobs(&mut p, &mut files, &[]).unwrap();
    assert_eq!(r["fd"], "fd:1");
    assert_eq!(p.document(1).unwrap().raw(), files["/big"].as_slice());
    p.handle(PagerInput::Request {
        client: C,
        id: "1".into(),
        req: FdRequest::WrapPath { path: "/root/protected.txt".into(), source: None },
    });
    let e = run_jobs(&mut p, &mut files, &["/root/protected.txt"]).unwrap_err();
    insta::assert_snapshot!("error_wrap_refused", e.to_xml());
}

#[test]
fn a_departed_client_s_job_closes_its_file_and_answers_nobody() {
    let mut p = pager(small());
    wrap(&mut p, b"one\ntwo\nthree\nfour\n").unwrap();
    let req = wire::parse(FdOp::ToFile, json!({"fd": "fd:1", "path": "/o"}).as_object().unwrap()).unwrap();
    p.handle(PagerInput::Request { client: C, id: "1".into(), req });
    let Some(PagerOutput::File { job, .. }) = p.poll_output() else { panic!() };
    p.handle(PagerInput::ClientGone { client: C });
    p.handle(PagerInput::FileDone { job, result: FileResult::Opened });
    assert_eq!(p.poll_output(), Some(PagerOutput::File { job, client: C, op: FileOp::Close }));
    p.handle(PagerInput::FileDone { job, result: FileResult::Closed });
    assert_eq!(p.poll_output(), None);
    assert_eq!(p.busy(), (0, 0));
    let _ = JobId(0);
}

#[test]
fn config_checks() {
    let c = PagerConfig::default();
    assert_eq!(c.validate(1 << 20), Ok(vec![]));
    let mut z = c.clone();
    z.default_page_size = 0;
    assert!(z.validate(1 << 20).unwrap_err().contains("default_page_size"));
    let mut w = c.clone();
    w.default_page_size = 9000;
    assert_eq!(w.validate(1 << 20).unwrap().len(), 1);
    let mut big = c;
    big.max_direct_output_chars = 1 << 20;
    assert!(big.validate(1 << 20).unwrap_err().contains("max_direct_output_chars"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The fuzz target's checks, on random command streams.
    #[test]
    fn the_fuzz_target_holds_on_random_input(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        super::fuzzing::pager_session(&data);
    }
}

#[test]
fn a_huge_line_pages_by_characters_and_a_flood_of_newlines_counts_its_index() {
    let line = "x".repeat(3_000_001);
    let doc = Document::from_bytes(line.as_bytes(), 4000);
    assert_eq!(doc.pages(), 751);
    assert_eq!(doc.total_lines(), 1);
    let last = doc.page(751).unwrap();
    assert_eq!(last.span.end - last.span.start, 1);
    assert!(last.continued && !last.truncated);
    assert!(doc.page(2).unwrap().truncated);
    // 300 000 newlines hold 300 000 bytes of text and 1.2 MB of line
    // index: over a 1 MB limit, whatever the text alone would say.
    let cfg = PagerConfig { max_total_bytes: 1_000_000, ..small() };
    let mut p = pager(cfg);
    let e = wrap(&mut p, &[b'\n'; 300_000]).unwrap_err();
    assert_eq!(e.kind, super::FdErrorKind::Limit);
    assert_eq!(p.held_total(), 0);
    assert!(wrap(&mut p, &[b'\n'; 100_000]).is_ok());
    assert!(p.held() <= 1_000_000);
}

/// Accounting by what is allocated: the fold of an ignore-case search and
/// the builder's content and indexes.
mod allocation {
    use super::super::search::{self, folded_contains, FOLD_BUFFER_BYTES, FOLD_CHUNK_BYTES};
    use super::super::search::{fold, Query};
    use super::super::store::{self, Builder, Document, Encoding, INDEX_ENTRY_BYTES};
    use proptest::prelude::*;

    fn naive(line: &str, needle: &str) -> bool {
        line.chars().map(fold).collect::<String>().contains(&needle.chars().map(fold).collect::<String>())
    }

    #[test]
    fn a_long_line_that_folds_larger_is_searched_in_a_bounded_buffer() {
        // `Ⱥ` is 2 bytes and folds to the 3-byte `ⱥ`: the whole line
        // folded would be 1.5 times the line.
        let line = "Ⱥ".repeat(1 << 20);
        let mut buf = search::fold_buffer();
        assert!(folded_contains(&line, "ⱥⱥ", &mut buf));
        assert!(!folded_contains(&line, "ⱥb", &mut buf));
        assert_eq!(buf.capacity(), FOLD_BUFFER_BYTES, "the buffer never grew");
        let doc = Document::from_bytes(format!("{line}\n{line}b\n").as_bytes(), 4000);
        assert_eq!(search::count(&doc, &Query::new("ⱥB", true)), 1);
    }

    /// The worst case the buffer is reserved for: a needle of the longest
    /// query, every character of it growing by half when folded, carried
    /// into chunks of characters that grow too. It fits without the
    /// buffer growing, and the reserve is that case and little more.
    #[test]
    fn the_fold_buffer_holds_its_worst_case_and_little_more() {
        use super::super::search::MAX_QUERY_BYTES;
        let query = format!("{}b", "Ⱥ".repeat((MAX_QUERY_BYTES - 1) / 2));
        assert!(query.len() <= MAX_QUERY_BYTES);
        let needle: String = query.chars().map(fold).collect();
        let line = "Ⱥ".repeat(3 * FOLD_CHUNK_BYTES / 2);
        let mut buf = search::fold_buffer();
        assert!(!folded_contains(&line, &needle, &mut buf));
        assert_eq!(buf.capacity(), FOLD_BUFFER_BYTES, "the buffer never grew");
        // The carry (under the needle's length) and a chunk folded.
        let worst = needle.len() + FOLD_CHUNK_BYTES * 3 / 2;
        assert!(FOLD_BUFFER_BYTES <= worst + 64, "{FOLD_BUFFER_BYTES} reserved for {worst}");
    }

    #[test]
    fn a_match_across_every_chunk_edge_is_found() {
        let needle = "Ⱥ<kelvin:\u{212A}>";
        let folded: String = needle.chars().map(fold).collect();
        for pad in ["a", "é", "Ⱥ", "😀"] {
            for shift in 0..needle.len() + 4 {
                let n = (FOLD_CHUNK_BYTES - shift) / pad.len();
                let line = format!("{}{needle}{}", pad.repeat(n), pad.repeat(3));
                let mut buf = search::fold_buffer();
                assert!(folded_contains(&line, &folded, &mut buf), "pad {pad:?} shift {shift}");
                let missing = line.replace('<', "(");
                assert!(!folded_contains(&missing, &folded, &mut buf), "pad {pad:?} shift {shift}");
                assert!(buf.capacity() <= FOLD_BUFFER_BYTES);
            }
        }
    }

    proptest! {
        #[test]
        fn chunked_fold_agrees_with_the_whole_fold(
            head in 0usize..3,
            reps in (FOLD_CHUNK_BYTES / 3 - 8)..(FOLD_CHUNK_BYTES / 3 + 8),
            unit in "[aÅȺ\u{212A}ß😀]{3}",
            needle in "[aåⱥkKȺ😀]{1,4}",
        ) {
            let line = format!("{}{}", "x".repeat(head), unit.repeat(reps));
            let folded: String = needle.chars().map(fold).collect();
            let mut buf = search::fold_buffer();
            prop_assert_eq!(folded_contains(&line, &folded, &mut buf), naive(&line, &needle));
            prop_assert!(buf.capacity() <= FOLD_BUFFER_BYTES);
        }

        /// Whatever is pushed, and whether or not it fits, what the
        /// builder has allocated stays within the limit it is given.
        #[test]
        fn a_builder_never_allocates_past_its_limit(
            chunks in proptest::collection::vec((0usize..4, 1usize..3000), 1..12),
            limit in 1u64..40_000,
            page in 1u64..50,
        ) {
            let mut b = Builder::new(page);
            for (kind, n) in chunks {
                let chunk: Vec<u8> = match kind {
                    0 => vec![b'\n'; n],
                    1 => b"ab\n".repeat(n),
                    2 => "Ⱥ".repeat(n).into_bytes(),
                    _ => vec![b'x'; n],
                };
                let fits = b.push(&chunk, limit).is_ok();
                prop_assert!(b.held() <= limit, "held {} over {limit}", b.held());
                if !fits {
                    return Ok(());
                }
            }
            let doc = b.finish();
            prop_assert!(doc.held() <= limit.max(INDEX_ENTRY_BYTES));
        }
    }

    #[test]
    fn one_byte_lines_are_refused_when_their_index_would_pass_the_limit() {
        // Each line costs a byte and a 4-byte index entry; growing the
        // index by doubling would pass the limit long before the bytes do.
        let limit = 1 << 20;
        let mut b = Builder::new(4000);
        let mut pushed = 0u64;
        while b.push(&[b'\n'; 4096], limit).is_ok() {
            pushed += 4096;
            assert!(b.held() <= limit);
        }
        assert!(b.held() <= limit);
        assert!(pushed * 5 <= limit && pushed * 5 > limit / 2, "{pushed} bytes of lines fit");
    }

    #[test]
    fn content_and_index_just_under_the_limit_still_fit() {
        // 64-byte lines: a 4-byte entry each, 1/16 of the content again.
        // Growth leaves the indexes room, so only the last few chunks'
        // worth of the limit is lost to capacity.
        let limit = 4 << 20;
        let line =
            [b"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk".as_slice(), b"\n"].concat();
        let chunk = line.repeat(16 << 10 >> 6);
        let mut b = Builder::new(4000);
        let mut len = 0u64;
        while (len + chunk.len() as u64) * 17 / 16 < limit - limit / 50 {
            b.push(&chunk, limit).unwrap_or_else(|_| panic!("refused at {len} bytes, {} held", b.held()));
            len += chunk.len() as u64;
        }
        assert!(b.finish().held() <= limit);
    }

    #[test]
    fn a_line_that_fits_what_is_allocated_needs_no_room_left() {
        // Under a limit equal to what is held, a push that fits the
        // content's and the index's spare capacity allocates nothing, so
        // it fits; one that needs to grow either is refused, having
        // allocated nothing past the limit.
        let mut fitted = 0;
        for n in 1..40 {
            let mut b = Builder::new(1000);
            for i in 0..n {
                assert!(b.push(b"a\n", 1 << 20).is_ok(), "line {i} of {n} refused under 1 MiB");
            }
            let held = b.held();
            if b.push(b"a\n", held).is_ok() {
                assert_eq!(b.held(), held, "after {n} lines");
                fitted += 1;
            } else {
                assert!(b.held() <= held, "refused after {n} lines, yet grew to {}", b.held());
            }
        }
        assert!(fitted >= 10, "{fitted} of 39 fitted");
    }

    #[test]
    fn content_that_fills_the_limit_exactly_fits() {
        let mut b = Builder::new(1000);
        assert!(b.push(&[b'x'; 100], 1 << 20).is_ok());
        let limit = b.held() + 50;
        assert!(b.push(&[b'x'; 50], limit).is_ok(), "50 bytes under a limit 50 bytes above held");
        assert_eq!(b.held(), limit);
        assert!(b.push(b"x", limit).is_err(), "one byte more");
    }

    #[test]
    fn content_grows_by_doubling() {
        // A thousand one-byte pushes: a handful of allocations, not one
        // each (every growth copies the content).
        let mut b = Builder::new(10_000);
        let mut growths = 0;
        let mut held = b.held();
        for _ in 0..1000 {
            assert!(b.push(b"x", 1 << 20).is_ok());
            growths += usize::from(b.held() != held);
            held = b.held();
        }
        assert!(growths <= 16, "{growths} growths");
    }

    #[test]
    fn growing_content_leaves_the_indexes_a_share_of_the_room() {
        let mut b = Builder::new(10_000);
        assert!(b.push(&[b'x'; 1000], 1 << 20).is_ok());
        // The content would double, but takes only 7/8 of the 800 bytes
        // left, so six more line starts still find room.
        let limit = b.held() + 800;
        assert!(b.push(b"\n\n\n\n\n\n", limit).is_ok());
        assert!(b.held() <= limit);
        assert_eq!(b.finish().total_lines(), 6);
    }

    #[test]
    fn broken_utf8_drops_the_indexes_at_once() {
        let mut b = Builder::new(10_000);
        assert!(b.push(b"a\n\xff", 1 << 20).is_ok());
        // Base64 from here on: the content alone is held.
        assert!(b.held() < 3 + INDEX_ENTRY_BYTES, "{} held", b.held());
    }

    #[test]
    fn a_character_split_across_pushes_counts_as_base64_until_it_is_whole() {
        let mut b = Builder::new(10_000);
        assert!(b.push(b"\xc3", 1 << 20).is_ok());
        // Ending here would make a base64 fd: 1 byte, 4 characters.
        assert_eq!(b.chars(), 4);
        assert!(b.push(b"\xa9", 1 << 20).is_ok());
        assert_eq!(b.chars(), 1);
        let doc = b.finish();
        assert_eq!((doc.encoding(), doc.chars()), (Encoding::Utf8, 1));

        let mut b = Builder::new(10_000);
        assert!(b.push(b"a\xc3", 1 << 20).is_ok());
        let doc = b.finish();
        assert_eq!((doc.encoding(), doc.chars(), doc.text(doc.all())), (Encoding::Base64, 4, "YcM=".into()));
    }

    #[test]
    fn the_scan_skips_eight_bytes_only_when_all_are_printable_ascii() {
        // Every byte value at every position, among printable ones.
        for at in 0..8 {
            for v in 0..=255u8 {
                let mut w = *b"a~ Z0\x7f@z";
                w[at] = v;
                let want = (0x20..0x80).contains(&v);
                assert_eq!(store::plain(u64::from_le_bytes(w)), want, "{w:x?}");
            }
        }
    }

    #[test]
    fn a_document_counts_its_capacity() {
        let mut b = Builder::new(10);
        for _ in 0..100 {
            b.push(b"0123456789abcdef\n", 1 << 20).unwrap();
        }
        let held = b.held();
        let doc = b.finish();
        // At least the content and one entry a line and a page.
        assert!(doc.held() >= 1700 + 4 * (100 + 170));
        assert!(doc.held() <= held);
    }
}
