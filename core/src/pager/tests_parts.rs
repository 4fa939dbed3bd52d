//! The pager's parts on their own, beside the machine's tests in
//! `tests.rs`. Many are here because a mutant of the part's code went
//! unnoticed otherwise (docs/verification.md).

use super::error::{echo, MAX_ECHO};

#[test]
fn an_echo_is_cut_at_max_echo_on_a_character_boundary() {
    let exact = "x".repeat(MAX_ECHO);
    assert_eq!(echo(&exact), exact);
    let long = "y".repeat(MAX_ECHO + 40);
    assert_eq!(echo(&long), format!("{}…", &long[..MAX_ECHO]));
    // 'a' then two-byte characters: byte MAX_ECHO (even) falls inside one.
    let wide = format!("a{}", "é".repeat(MAX_ECHO));
    let cut = echo(&wide);
    assert_eq!(cut, format!("a{}…", "é".repeat((MAX_ECHO - 2) / 2)));
    assert_eq!(cut.len(), MAX_ECHO - 1 + "…".len());
}

#[test]
fn a_size_whose_frames_just_fit_max_frame_is_accepted() {
    use super::PagerConfig;
    // 3 characters: up to 12 bytes, 16 of base64, plus 1,024 of framing.
    let c = PagerConfig {
        max_direct_output_chars: 3,
        max_input_chars: 3,
        default_page_size: 3,
        ..PagerConfig::default()
    };
    assert_eq!(c.validate(1040), Ok(vec![]));
    let e = c.validate(1039).unwrap_err();
    assert_eq!(
        e,
        "file_descriptor.max_direct_output_chars = 3: content that size needs frames of 1040 bytes, over --max-frame 1039"
    );
    let warned = PagerConfig { default_page_size: 4, ..c };
    assert_eq!(warned.validate(1040).unwrap().len(), 1);
}

/// A bounded escape fills its budget as far as a whole escape still
/// fits, and never past it, whatever the budget.
#[test]
fn a_bounded_escape_stops_where_the_next_escape_might_not_fit() {
    use super::xml::{escape_bounded_text, MAX_ESCAPED};
    // Room of exactly MAX_ESCAPED still takes a run that long.
    let mut out = String::new();
    assert_eq!(escape_bounded_text("abcdefghij", MAX_ESCAPED, &mut out), MAX_ESCAPED);
    assert_eq!(out, "abcdef");
    // Less room than an escape may take stops before the next one.
    let mut out = String::new();
    assert_eq!(escape_bounded_text("abc&", MAX_ESCAPED + 1, &mut out), 3);
    assert_eq!(out, "abc");
    for budget in 0..40 {
        let mut out = String::new();
        let s = "a\"b&c<d>e'f\rg";
        let used = escape_bounded_text(s, budget, &mut out);
        assert!(out.len() <= budget, "budget {budget}: {out:?}");
        assert!(
            used == s.len() || budget.saturating_sub(out.len()) < MAX_ESCAPED,
            "budget {budget}: {out:?}"
        );
    }
}

/// A cursor continues a rendering only from a character boundary inside
/// the span being rendered.
#[test]
fn a_cursor_must_be_a_boundary_inside_the_span() {
    use super::store::Document;
    use super::xml::{render_span, BadCursor, Part};
    // "aé\nb\n": 'é' is bytes 1..3, the span "aé" is 0..3.
    let doc = Document::from_bytes("aé\nb\n".as_bytes(), 100);
    let at =
        |span: std::ops::Range<u64>, cursor: u64| render_span(&doc, "<h>", span, "</h>", Some(cursor), 1024);
    assert_eq!(at(0..3, 2), Err(BadCursor), "inside a character");
    assert_eq!(at(0..3, 4), Err(BadCursor), "a boundary past the span");
    assert_eq!(at(4..6, 3), Err(BadCursor), "a boundary before the span");
    assert_eq!(at(0..3, 1), Ok(Part { xml: "é</h>".into(), next: None }));
    assert_eq!(at(0..3, 3), Ok(Part { xml: "</h>".into(), next: None }));
    assert_eq!(at(4..6, 4), Ok(Part { xml: "b\n</h>".into(), next: None }));
}

/// The tail goes in the part that ends the span, and only if it fits
/// whole; otherwise the next part is the tail alone.
#[test]
fn the_tail_ends_the_last_part_only_when_it_fits() {
    use super::store::Document;
    use super::xml::{render_span, Part};
    let text = "a".repeat(100);
    let doc = Document::from_bytes(text.as_bytes(), 1000);
    // The smallest budget is 64 bytes; an empty tail does not end a part
    // that stops short of the span's end.
    let first = render_span(&doc, "", 0..100, "", None, 1).unwrap();
    assert_eq!(first, Part { xml: "a".repeat(64), next: Some(64) });
    // 60 bytes and a 4-byte tail fit 64 exactly.
    assert_eq!(
        render_span(&doc, "", 0..60, "</h>", None, 64),
        Ok(Part { xml: format!("{}</h>", "a".repeat(60)), next: None })
    );
    // 61 and 4 do not: the tail comes alone, from the span's end.
    assert_eq!(render_span(&doc, "", 0..61, "</h>", None, 64).unwrap().next, Some(61));
    assert_eq!(
        render_span(&doc, "", 0..61, "</h>", Some(61), 64),
        Ok(Part { xml: "</h>".into(), next: None })
    );
}

/// A search's cursor continues from a line's start, a character boundary
/// inside a match, or the text's end; anything else is refused.
#[test]
fn a_search_cursor_inside_a_character_or_past_the_text_is_refused() {
    use super::search::{render, Query};
    use super::store::Document;
    use super::xml::BadCursor;
    // "aé\nb\n": 'é' is bytes 1..3.
    let doc = Document::from_bytes("aé\nb\n".as_bytes(), 100);
    let q = Query::new("é", false);
    let at = |cursor: u64| render(&doc, "fd:1", "é", &q, Some(cursor), 4096).map(|p| p.next);
    assert_eq!(at(2), Err(BadCursor), "inside 'é'");
    assert_eq!(at(7), Err(BadCursor), "past the text");
    assert_eq!(at(6), Ok(None), "the text's end");
    assert_eq!(at(4), Ok(None), "the last line, which does not match");
    let inside = render(&doc, "fd:1", "é", &q, Some(1), 4096).unwrap();
    assert!(inside.xml.starts_with("é</match>"), "{inside:?}");
}

/// A search rendered in small parts, cursor after cursor, is the whole
/// rendering cut into pieces: a `<match>` that does not fit whole with
/// its line starts the next part, and no part passes its budget.
#[test]
fn a_search_in_small_parts_adds_up_to_the_whole() {
    use super::search::{render, Query};
    use super::store::Document;
    let text: String = (0..60).map(|i| format!("line {i} é{}\n", "x".repeat(i % 7))).collect();
    let doc = Document::from_bytes(text.as_bytes(), 4000);
    let q = Query::new("é", false);
    let whole = render(&doc, "fd:1", "é", &q, None, 1 << 20).unwrap();
    assert_eq!(whole.next, None);
    for budget in [300, 317, 333, 350] {
        let mut parts = String::new();
        let mut cursor = None;
        for _ in 0..1000 {
            let p = render(&doc, "fd:1", "é", &q, cursor, budget).unwrap();
            assert!(p.xml.len() <= budget.max(256 + 64), "budget {budget}: {} bytes", p.xml.len());
            parts.push_str(&p.xml);
            cursor = p.next;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(cursor, None, "budget {budget}: the rendering ends");
        assert_eq!(parts, whole.xml, "budget {budget}");
    }
}

/// A part of a search defers a match, or the search's closing tag, to the
/// next part only when it would not fit: a part is as full as the budget
/// lets it be, and never fuller.
#[test]
fn a_search_part_defers_only_what_does_not_fit() {
    use super::search::{render, Query};
    use super::store::Document;
    let lines: Vec<String> = (0..80).map(|i| format!("é{}", "y".repeat(i % 11))).collect();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let starts: Vec<u64> = lines
        .iter()
        .scan(0u64, |at, l| {
            let s = *at;
            *at += l.len() as u64 + 1;
            Some(s)
        })
        .collect();
    let doc = Document::from_bytes(text.as_bytes(), 8000);
    let q = Query::new("é", false);
    let (mut deferred, mut tails) = (0, 0);
    for budget in 256..420 {
        let mut cursor = Some(0);
        while let Some(c) = cursor {
            let p = render(&doc, "fd:1", "é", &q, Some(c), budget).unwrap();
            assert!(p.xml.len() <= budget, "budget {budget}: {} bytes", p.xml.len());
            if p.next == Some(text.len() as u64) {
                let needs = p.xml.len() + "</fd_search>".len();
                assert!(needs > budget, "budget {budget}: the tail deferred, {needs} bytes fit");
                tails += 1;
            }
            if let Some(i) = p.next.and_then(|n| starts.iter().position(|&s| s == n)) {
                let tag = format!("  <match line=\"{}\">", i + 1);
                let needs = p.xml.len() + tag.len() + 8 + "</match>\n".len();
                assert!(needs > budget, "budget {budget}: line {} deferred, {needs} bytes fit", i + 1);
                deferred += 1;
            }
            assert!(p.next != Some(c), "budget {budget}: no progress at {c}");
            cursor = p.next;
        }
    }
    assert!(deferred > 100 && tails > 10, "parts ended before {deferred} matches and {tails} tails");
}
