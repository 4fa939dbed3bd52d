//! XML rendering: escaping, element heads, and rendering a piece of an
//! fd's text in parts that each fit a frame.
//!
//! Text inside `<fd_content>`, `<preview>` and `<match>` is exactly the
//! fd's characters once an XML parser has read it: no added newline or
//! indentation; `&`, `<`, `>`, quotes escaped, and `\r` as `&#13;` (a
//! parser would otherwise turn `\r\n` into `\n`). Attribute values also
//! escape `\n` and `\t`, which attribute normalization would turn into
//! spaces.

use super::store::{Document, Encoding};
use std::fmt::Write as _;
use std::ops::Range;

/// Escape one character of element text; `None` when it stands for itself.
fn text_escape(c: char) -> Option<&'static str> {
    Some(match c {
        '&' => "&amp;",
        '<' => "&lt;",
        '>' => "&gt;",
        '"' => "&quot;",
        '\'' => "&apos;",
        '\r' => "&#13;",
        _ => return None,
    })
}

/// The longest escape: a character never takes more than this.
pub const MAX_ESCAPED: usize = 6;

/// Element text from anywhere but the content (messages, paths): a
/// character XML cannot carry becomes U+FFFD.
pub fn escape_text(s: &str, out: &mut String) {
    for c in s.chars().map(carriable) {
        match text_escape(c) {
            Some(e) => out.push_str(e),
            None => out.push(c),
        }
    }
}

pub fn escape_attr(s: &str, out: &mut String) {
    for c in s.chars().map(carriable) {
        match c {
            '\n' => out.push_str("&#10;"),
            '\t' => out.push_str("&#9;"),
            c => match text_escape(c) {
                Some(e) => out.push_str(e),
                None => out.push(c),
            },
        }
    }
}

pub fn attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_attr(s, &mut out);
    out
}

pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_text(s, &mut out);
    out
}

fn carriable(c: char) -> char {
    if xml_char(c) {
        c
    } else {
        '\u{FFFD}'
    }
}

/// Can XML 1.0 carry `c`?
pub fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// Escape a prefix of `s` so that `out` stays within `budget` bytes;
/// returns the bytes of `s` consumed (a character boundary).
pub(crate) fn escape_bounded_text(s: &str, budget: usize, out: &mut String) -> usize {
    // Plain runs are copied whole; only escapes are looked at one by one.
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let room = budget.saturating_sub(out.len());
        if room < MAX_ESCAPED {
            break;
        }
        let run_end = bytes[i..]
            .iter()
            .position(|&b| matches!(b, b'&' | b'<' | b'>' | b'"' | b'\'' | b'\r'))
            .map_or(bytes.len(), |p| i + p);
        if run_end > i {
            let mut end = run_end.min(i + room);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            if end == i {
                break;
            }
            out.push_str(&s[i..end]);
            i = end;
            continue;
        }
        let c = bytes[i] as char;
        out.push_str(text_escape(c).unwrap_or_default());
        i += 1;
    }
    i
}

/// One part of a rendering: its XML, and where the next part starts
/// (`None`: this was the last).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub xml: String,
    pub next: Option<u64>,
}

/// `cursor` does not name a place in the span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadCursor;

/// Render `head`, the text of `span`, then `tail`, from `cursor` (`None`:
/// from the start, head included), at most about `budget` bytes of XML.
pub fn render_span(
    doc: &Document,
    head: &str,
    span: Range<u64>,
    tail: &str,
    cursor: Option<u64>,
    budget: usize,
) -> Result<Part, BadCursor> {
    let mut out = String::new();
    let mut pos = match cursor {
        None => {
            out.push_str(head);
            span.start
        }
        Some(c) if c >= span.start && c <= span.end && doc.is_boundary(c) => c,
        Some(_) => return Err(BadCursor),
    };
    // At least one character per part, whatever the head took.
    let budget = budget.max(out.len() + 64);
    // At the span's end both arms add nothing.
    match doc.encoding() {
        Encoding::Utf8 => {
            let s = doc.utf8(pos..span.end).unwrap_or_default();
            pos += escape_bounded_text(s, budget, &mut out) as u64;
        }
        Encoding::Base64 => {
            let n = (budget.saturating_sub(out.len()) as u64).min(span.end - pos);
            out.push_str(&doc.base64(pos..pos + n));
            pos += n;
        }
    }
    if pos == span.end && out.len() + tail.len() <= budget {
        out.push_str(tail);
        return Ok(Part { xml: out, next: None });
    }
    Ok(Part { xml: out, next: Some(pos) })
}

fn encoding_attr(doc: &Document) -> &'static str {
    match doc.encoding() {
        Encoding::Utf8 => "",
        Encoding::Base64 => " encoding=\"base64\"",
    }
}

fn lines_attr(lines: (u64, u64)) -> String {
    format!("{}-{}", lines.0, lines.1)
}

/// `<fd_result …><message>…</message><preview>` and its tail.
pub fn result_head(fd: &str, doc: &Document, message: &str) -> (String, String) {
    let p1 = doc.page(1);
    let (truncated, lines) = p1.map_or((false, (0, 0)), |p| (p.truncated, p.lines));
    let mut h = String::new();
    let _ = write!(
        h,
        "<fd_result fd=\"{}\" pages=\"{}\" truncated=\"{}\" lines=\"{}\" total_lines=\"{}\"{}>\n  <message>{}</message>\n  <preview>",
        attr(fd),
        doc.pages(),
        truncated,
        lines_attr(lines),
        doc.total_lines(),
        encoding_attr(doc),
        text(message),
    );
    (h, "</preview>\n</fd_result>".into())
}

/// `<fd_content …>` for page `page`.
pub fn page_head(fd: &str, doc: &Document, page: u64) -> Option<(String, Range<u64>)> {
    let p = doc.page(page)?;
    let head = format!(
        "<fd_content fd=\"{}\" page=\"{}\" pages=\"{}\" continued=\"{}\" truncated=\"{}\" lines=\"{}\" total_lines=\"{}\"{}>",
        attr(fd),
        page,
        doc.pages(),
        p.continued,
        p.truncated,
        lines_attr(p.lines),
        doc.total_lines(),
        encoding_attr(doc),
    );
    Some((head, p.span))
}

/// `<fd_content …>` for lines `a..=b` (the whole content: `1..=total`).
pub fn lines_head(fd: &str, doc: &Document, lines: (u64, u64)) -> String {
    format!(
        "<fd_content fd=\"{}\" lines=\"{}\" total_lines=\"{}\"{}>",
        attr(fd),
        lines_attr(lines),
        doc.total_lines(),
        encoding_attr(doc),
    )
}

pub const CONTENT_TAIL: &str = "</fd_content>";
