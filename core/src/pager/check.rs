//! The pager's laws (DESIGN.md invariant 7, and 11 for its bytes), checked
//! from outside the indexes: used by the fuzz target and the simulator
//! after every step.

use super::store::{count_lines, Document, Encoding};
use super::Pager;

/// Pages concatenate back to the content; page count, sizes, line ranges
/// and the continued/truncated flags agree with the text itself. Linear
/// in the content.
pub fn check_document(doc: &Document) -> Result<(), String> {
    let text_len = doc.text_len();
    let pages = doc.pages();
    if pages == 0 {
        return Err("a document has no page".into());
    }
    let mut at = 0u64;
    // Newlines before the page, and whether the text before it ends one.
    let mut nl_before = 0u64;
    let mut prev_nl = true;
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
        let ends_nl = text.ends_with('\n');
        if n < pages && chars < doc.page_size() && !ends_nl {
            return Err(format!("page {n} ends short of the page size but not after a newline"));
        }
        if p.continued == prev_nl {
            return Err(format!("page {n}: continued={} but the text before it says otherwise", p.continued));
        }
        if p.truncated != (n < pages && !ends_nl) {
            return Err(format!("page {n}: truncated={} disagrees with its text", p.truncated));
        }
        let nl = text.matches('\n').count() as u64;
        if doc.encoding() == Encoding::Utf8 && !text.is_empty() {
            let first = nl_before + 1;
            let last = first + nl - u64::from(ends_nl);
            if p.lines != (first, last) {
                return Err(format!("page {n}: lines {:?}, the text says {:?}", p.lines, (first, last)));
            }
        }
        nl_before += nl;
        prev_nl = text.is_empty() || ends_nl;
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
    if lines > 0 && doc.lines(1, lines).map(|s| s.end - s.start) != Some(text_len) {
        return Err("lines 1..=total are not the whole text".into());
    }
    Ok(())
}

/// Every stored fd obeys the laws, and the session holds no more than its
/// limit (streams and jobs included).
pub fn check_pager(p: &Pager) -> Result<(), String> {
    for (fd, doc) in p.fds() {
        check_document(doc).map_err(|e| format!("fd:{fd}: {e}"))?;
    }
    check_accounting(p, p.config().max_total_bytes)
}

/// The bytes held: under `limit`, and what the stored fds add up to.
/// Cheap: for every step of a long run.
pub fn check_accounting(p: &Pager, limit: u64) -> Result<(), String> {
    if p.held_total() > limit {
        return Err(format!(
            "fds hold {} bytes, over max_total_bytes {limit} (stored {}, streams and jobs {:?})",
            p.held_total(),
            p.held(),
            p.busy()
        ));
    }
    let held: u64 = p.fds().map(|(_, d)| d.held()).sum();
    if held != p.held() {
        return Err(format!("fds hold {held} bytes but the pager counts {}", p.held()));
    }
    Ok(())
}
