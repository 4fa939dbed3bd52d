//! The pager's laws (DESIGN.md invariant 7, and 11 for its bytes), checked
//! from outside the indexes: used by the fuzz target and the simulator
//! after every step.

use super::store::{count_lines, Document, Encoding};
use super::Pager;

/// Pages concatenate back to the content; page count, sizes, line ranges
/// and the continued/truncated flags agree with the text itself.
pub fn check_document(doc: &Document) -> Result<(), String> {
    let text_len = doc.text_len();
    let mut at = 0u64;
    let pages = doc.pages();
    if pages == 0 {
        return Err("a document has no page".into());
    }
    for n in 1..=pages {
        let p = doc.page(n).ok_or_else(|| format!("page {n} of {pages} is missing"))?;
        if p.span.start != at {
            return Err(format!("page {n} starts at {} not {at}", p.span.start));
        }
        if p.span.end < p.span.start || p.span.end > text_len || (p.span.is_empty() && text_len > 0) {
            return Err(format!("page {n} has span {:?} of {text_len}", p.span));
        }
        let text = doc.text(p.span.clone());
        let chars = text.chars().count() as u64;
        if chars > doc.page_size() {
            return Err(format!("page {n} holds {chars} characters, over {}", doc.page_size()));
        }
        if n < pages && chars < doc.page_size() && !text.ends_with('\n') {
            return Err(format!("page {n} ends short of the page size but not after a newline"));
        }
        let prev_nl = at == 0 || doc.text(at - 1..at) == "\n";
        if p.continued == prev_nl {
            return Err(format!("page {n}: continued={} but the text before it says otherwise", p.continued));
        }
        if p.truncated != (n < pages && !text.ends_with('\n')) {
            return Err(format!("page {n}: truncated={} disagrees with its text", p.truncated));
        }
        if doc.encoding() == Encoding::Utf8 && !text.is_empty() {
            let before = doc.text(0..p.span.start);
            let first = count_lines(before.as_bytes()) + u64::from(prev_nl);
            let last = first + text[..text.len() - 1].matches('\n').count() as u64;
            if p.lines != (first, last) {
                return Err(format!("page {n}: lines {:?}, the text says {:?}", p.lines, (first, last)));
            }
        }
        at = p.span.end;
    }
    if at != text_len {
        return Err(format!("pages end at {at} of {text_len}"));
    }
    if doc.page(0).is_some() || doc.page(pages + 1).is_some() {
        return Err("a page outside 1..=pages is served".into());
    }
    let lines = doc.total_lines();
    let want = match doc.encoding() {
        Encoding::Utf8 => count_lines(doc.raw()),
        Encoding::Base64 => u64::from(text_len > 0),
    };
    if lines != want {
        return Err(format!("total_lines {lines}, the text has {want}"));
    }
    if lines > 0 && doc.lines(1, lines).map(|s| doc.text(s).len() as u64) != Some(text_len) {
        return Err("lines 1..=total are not the whole text".into());
    }
    Ok(())
}

/// Every stored fd obeys the laws, and the session holds no more than its
/// limit (streams and jobs included).
pub fn check_pager(p: &Pager) -> Result<(), String> {
    let limit = p.config().max_total_bytes;
    if p.held_total() > limit {
        return Err(format!("fds hold {} bytes, over max_total_bytes {limit}", p.held_total()));
    }
    let mut held = 0;
    for (fd, doc) in p.fds() {
        check_document(doc).map_err(|e| format!("fd:{fd}: {e}"))?;
        held += doc.held();
    }
    if held != p.held() {
        return Err(format!("fds hold {held} bytes but the pager counts {}", p.held()));
    }
    Ok(())
}
