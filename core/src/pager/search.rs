//! `search`: the lines of an fd holding a literal substring, optionally
//! ignoring case by Unicode simple case folding.

use super::store::Document;
use super::xml::{attr, escape_bounded_text, BadCursor, Part};
use std::ops::Range;

/// Longest query, in bytes.
pub const MAX_QUERY_BYTES: usize = 4096;

/// Simple (one-to-one) case folding: the lowercase of the uppercase when
/// each is one character, so `ς`, `σ` and `Σ` meet, as do `ſ` and `s`, and
/// the Kelvin sign and `k`; characters whose mappings are not one-to-one
/// (`ß`, `İ`) fold to their single lowercase, or stay as they are. `ı`
/// stays itself: simple folding does not take it to `i`.
pub fn fold(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    if c == 'ı' {
        return c;
    }
    let mut up = c.to_uppercase();
    if let (Some(u), None) = (up.next(), up.next()) {
        let mut low = u.to_lowercase();
        if let (Some(l), None) = (low.next(), low.next()) {
            return l;
        }
    }
    let mut low = c.to_lowercase();
    match (low.next(), low.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// Bytes of a line folded at a time by an ignore-case search: the fold is
/// a buffer no limit counts, so it is made of a bounded piece of the line
/// however long the line is.
pub const FOLD_CHUNK_BYTES: usize = 64 << 10;

/// Most bytes a character's fold may add: a 2-byte character may fold to a
/// 3-byte one (`Ⱥ` to `ⱥ`), never more.
const FOLD_GROWTH_NUM: usize = 3;
const FOLD_GROWTH_DEN: usize = 2;

/// The fold buffer's capacity: the carry-over of a folded needle and one
/// chunk folded, each up to a character past its size. Reserved once, so
/// it never grows by doubling.
pub const FOLD_BUFFER_BYTES: usize =
    (MAX_QUERY_BYTES + FOLD_CHUNK_BYTES + 8) * FOLD_GROWTH_NUM / FOLD_GROWTH_DEN;

/// A fresh fold buffer, at its whole capacity.
pub fn fold_buffer() -> String {
    String::with_capacity(FOLD_BUFFER_BYTES)
}

/// Does the fold of `line` hold `needle` (already folded)? The line is
/// folded [`FOLD_CHUNK_BYTES`] at a time into `buf`, keeping the last
/// `needle.len() - 1` bytes of each folded chunk in front of the next, so
/// a match across a chunk's edge is still found and `buf` never passes
/// [`FOLD_BUFFER_BYTES`].
pub fn folded_contains(line: &str, needle: &str, buf: &mut String) -> bool {
    buf.clear();
    let keep = needle.len().saturating_sub(1);
    let mut rest = line;
    loop {
        let (chunk, tail) = rest.split_at(ceil_boundary(rest, FOLD_CHUNK_BYTES.min(rest.len())));
        buf.extend(chunk.chars().map(fold));
        if buf.contains(needle) {
            return true;
        }
        if tail.is_empty() {
            return false;
        }
        rest = tail;
        // A match that crosses the edge starts on a character within the
        // last `keep` bytes: keep the suffix from the first such start.
        let from = ceil_boundary(buf, buf.len().saturating_sub(keep));
        buf.drain(..from);
    }
}

/// The first character boundary of `s` at or after `i` (`str::ceil_char_boundary`,
/// newer than this crate's `rust-version`).
fn ceil_boundary(s: &str, i: usize) -> usize {
    (i..s.len()).find(|&j| s.is_char_boundary(j)).unwrap_or(s.len())
}

#[derive(Clone, Debug)]
pub struct Query {
    needle: String,
    ignore_case: bool,
}

impl Query {
    pub fn new(query: &str, ignore_case: bool) -> Query {
        let needle = if ignore_case { query.chars().map(fold).collect() } else { query.to_owned() };
        Query { needle, ignore_case }
    }
}

/// Bytes of line `i` (0-based) without its `\n`.
fn line_span(doc: &Document, i: usize) -> Range<u64> {
    let ls = doc.line_starts();
    let start = u64::from(ls[i]);
    let end = ls.get(i + 1).map_or(doc.text_len(), |&e| u64::from(e));
    let text_end = if end > start && doc.utf8(end - 1..end) == Some("\n") { end - 1 } else { end };
    start..text_end
}

/// The first matching line at or after line `from` (0-based).
fn next_match(doc: &Document, q: &Query, from: usize, buf: &mut String) -> Option<usize> {
    let ls = doc.line_starts();
    if from >= ls.len() || q.needle.contains('\n') {
        return None;
    }
    if !q.ignore_case {
        let start = u64::from(ls[from]);
        let text = doc.utf8(start..doc.text_len())?;
        let hit = start + text.find(&q.needle)? as u64;
        return Some(ls.partition_point(|&s| u64::from(s) <= hit) - 1);
    }
    (from..ls.len()).find(|&i| {
        let line = doc.utf8(line_span(doc, i)).unwrap_or_default();
        folded_contains(line, &q.needle, buf)
    })
}

/// Matching lines.
pub fn count(doc: &Document, q: &Query) -> u64 {
    let mut buf = fold_buffer();
    let mut n = 0;
    let mut from = 0;
    while let Some(i) = next_match(doc, q, from, &mut buf) {
        n += 1;
        from = i + 1;
    }
    n
}

const MATCH_TAIL: &str = "</match>\n";
const SEARCH_TAIL: &str = "</fd_search>";

/// One part of `<fd_search>`. The cursor is a text offset: a line start
/// means "look for matches from this line on", anywhere else "inside the
/// `<match>` of this line".
pub fn render(
    doc: &Document,
    fd: &str,
    query: &str,
    q: &Query,
    cursor: Option<u64>,
    budget: usize,
) -> Result<Part, BadCursor> {
    let ls = doc.line_starts();
    let len = doc.text_len();
    let mut out = String::new();
    let mut buf = fold_buffer();
    let mut from = match cursor {
        None => {
            let n = count(doc, q);
            out.push_str(&format!(
                "<fd_search fd=\"{}\" query=\"{}\" matches=\"{n}\">\n",
                attr(fd),
                attr(query)
            ));
            0
        }
        Some(c) if c == len => ls.len(),
        Some(c) if c < len && doc.is_boundary(c) => {
            let i = ls.partition_point(|&s| u64::from(s) <= c) - 1;
            if u64::from(ls[i]) == c {
                i
            } else {
                let span = line_span(doc, i);
                if c > span.end {
                    return Err(BadCursor);
                }
                match finish_line(doc, c..span.end, budget, &mut out) {
                    Some(next) => return Ok(Part { xml: out, next: Some(next) }),
                    None => i + 1,
                }
            }
        }
        Some(_) => return Err(BadCursor),
    };
    let budget = budget.max(out.len() + 256);
    while let Some(i) = next_match(doc, q, from, &mut buf) {
        let tag = format!("  <match line=\"{}\">", i + 1);
        if out.len() + tag.len() + 8 + MATCH_TAIL.len() > budget {
            return Ok(Part { xml: out, next: Some(u64::from(ls[i])) });
        }
        out.push_str(&tag);
        if let Some(next) = finish_line(doc, line_span(doc, i), budget, &mut out) {
            return Ok(Part { xml: out, next: Some(next) });
        }
        from = i + 1;
    }
    if out.len() + SEARCH_TAIL.len() > budget {
        return Ok(Part { xml: out, next: Some(len) });
    }
    out.push_str(SEARCH_TAIL);
    Ok(Part { xml: out, next: None })
}

/// Escape `span` of a matching line and close its element; `Some(next)`
/// when the budget ran out first.
fn finish_line(doc: &Document, span: Range<u64>, budget: usize, out: &mut String) -> Option<u64> {
    let s = doc.utf8(span.clone()).unwrap_or_default();
    let used = escape_bounded_text(s, budget.saturating_sub(MATCH_TAIL.len()), out) as u64;
    if span.start + used < span.end {
        return Some(span.start + used);
    }
    out.push_str(MATCH_TAIL);
    None
}
