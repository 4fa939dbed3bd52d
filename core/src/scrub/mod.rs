//! Finding secrets in text a child could see, in every derived form: the
//! one engine behind the VFS tool host's `--env-allow` scrubbing
//! (`vfs::scrub`) and the broker's API-key redaction (`broker::secret`).
//!
//! A secret is found
//!
//! - as it is, in UTF-16 (either byte order), in hex (either case), and in
//!   base64 (standard or URL-safe, at each of its three alignments inside
//!   a longer encoded text): literal forms ([`forms`]), searched at once
//!   with one Aho-Corasick automaton per case rule;
//! - percent-encoded (either case) or JSON-escaped after any run of
//!   backslashes, in whole or in part, nested: the text is read as decoded
//!   [`units`] and the secret matched on the decoded bytes, with a span
//!   back in the text; once reading any run before an escape as that
//!   escape, and, for a secret holding `\` or `"`, once per JSON depth up
//!   to [`units::MAX_JSON_DEPTH`], where the backslashes it holds count;
//!   for a secret holding `%`, each of those again with percent escapes
//!   left as they are, as JSON leaves them. This pass runs only on text
//!   holding `%` or `\`.
//!
//! Both passes are linear in the text (the second once per reading); memory is the automata (a few times
//! the secrets' total length, built once) plus the spans found. Spans are
//! merged and replaced whole by the caller's marker.

pub mod forms;
/// Independent encoders and a naive search (tests, fuzzing, the simulator).
#[cfg(any(test, feature = "oracle"))]
pub mod oracle;
pub mod units;

use aho_corasick::automaton::Automaton;
use aho_corasick::{AhoCorasick, AhoCorasickKind, Anchored, MatchKind};
use std::borrow::Cow;
use std::ops::Range;

/// The secrets one scrubber looks for, compiled.
#[derive(Clone, Debug, Default)]
pub struct SecretSet {
    /// The literal forms matched byte for byte.
    exact: Option<AhoCorasick>,
    /// Hex forms, matched in either ASCII case.
    any_case: Option<AhoCorasick>,
    /// The secrets themselves, matched on decoded units.
    decoded: Option<aho_corasick::nfa::contiguous::NFA>,
    /// Longest secret, in bytes.
    max_len: usize,
    /// Whether a secret holds a backslash or a quote: only then do the
    /// JSON depths read its own bytes otherwise than any depth does.
    depths: bool,
    /// Whether a secret holds `%`: only then is text read with percent
    /// escapes left as they are too.
    percents: bool,
}

fn automaton(patterns: &[Vec<u8>], any_case: bool) -> Option<AhoCorasick> {
    if patterns.is_empty() {
        return None;
    }
    // The contiguous NFA: its memory is a small multiple of the patterns'
    // (a DFA's can be hundreds of times), and its search is linear.
    AhoCorasick::builder()
        .kind(Some(AhoCorasickKind::ContiguousNFA))
        .match_kind(MatchKind::Standard)
        .ascii_case_insensitive(any_case)
        .build(patterns)
        .ok()
}

impl SecretSet {
    /// Look for each of `secrets` (empty ones are ignored).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut plain: Vec<Vec<u8>> =
            secrets.into_iter().map(|s| s.as_ref().to_vec()).filter(|s| !s.is_empty()).collect();
        plain.sort();
        plain.dedup();
        if plain.is_empty() {
            return SecretSet::default();
        }
        let (mut exact, mut any_case) = (Vec::new(), Vec::new());
        for s in &plain {
            let f = forms::forms(s);
            exact.extend(f.exact);
            any_case.extend(f.any_case);
        }
        exact.sort();
        exact.dedup();
        any_case.sort();
        any_case.dedup();
        let decoded =
            aho_corasick::nfa::contiguous::NFA::builder().match_kind(MatchKind::Standard).build(&plain).ok();
        SecretSet {
            exact: automaton(&exact, false),
            any_case: automaton(&any_case, true),
            decoded,
            max_len: plain.iter().map(Vec::len).max().unwrap_or(0),
            depths: plain.iter().flatten().any(|b| matches!(b, b'\\' | b'"')),
            percents: plain.iter().flatten().any(|&b| b == b'%'),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.max_len == 0
    }

    /// Every span of `data` holding a secret in any form, sorted, merged
    /// where they overlap.
    pub fn spans(&self, data: &[u8]) -> Vec<Range<usize>> {
        let mut spans = Vec::new();
        if self.is_empty() {
            return spans;
        }
        // Counted first, then kept: a vector that doubles as it fills
        // would hold up to three times the spans while it grows. Each
        // match overlapping the one before joins it, so a run of matches
        // (a secret of one repeated byte inside a long run of it) costs
        // one span, not one per byte.
        let automata = || [&self.exact, &self.any_case].into_iter().flatten();
        spans.reserve_exact(
            automata().map(|ac| merged_count(ac.find_overlapping_iter(data).map(|m| m.range()))).sum(),
        );
        for ac in automata() {
            for m in ac.find_overlapping_iter(data) {
                push_merged(&mut spans, m.range());
            }
        }
        // Only escapes decode to something else: without them the
        // literal pass has found every span already.
        if let Some(nfa) = self.decoded.as_ref().filter(|_| units::has_escapes(data)) {
            self.decoded_spans(nfa, data, &mut spans);
        }
        merge(spans)
    }

    fn decoded_spans(
        &self,
        nfa: &aho_corasick::nfa::contiguous::NFA,
        data: &[u8],
        out: &mut Vec<Range<usize>>,
    ) {
        let Ok(start) = nfa.start_state(Anchored::No) else { return };
        for reading in units::Reading::needed(self.depths, self.percents) {
            // What earlier readings found is merged before the next adds
            // its own: the readings mostly find the same spans, which
            // would otherwise be kept once per reading.
            merge_in_place(out);
            let mut sid = start;
            units::spans(
                data,
                reading,
                self.max_len,
                |b, lens| {
                    sid = nfa.next_state(Anchored::No, sid, b);
                    if nfa.is_match(sid) {
                        for i in 0..nfa.match_len(sid) {
                            lens.push(nfa.pattern_len(nfa.match_pattern(sid, i)));
                        }
                    }
                },
                out,
            );
        }
    }

    /// Whether `data` holds a secret in any form.
    pub fn reveals(&self, data: &[u8]) -> bool {
        if self.is_empty() {
            return false;
        }
        if [&self.exact, &self.any_case].into_iter().flatten().any(|ac| ac.is_match(data)) {
            return true;
        }
        units::has_escapes(data) && !self.spans(data).is_empty()
    }

    /// `data` with every span holding a secret replaced by `marker`.
    pub fn replace<'a>(&self, data: &'a [u8], marker: &[u8]) -> Cow<'a, [u8]> {
        let spans = self.spans(data);
        if spans.is_empty() {
            return Cow::Borrowed(data);
        }
        // Sized exactly: a buffer that doubles as it fills would hold up
        // to twice the result at its peak.
        let removed: usize = spans.iter().map(|r| r.len()).sum();
        let mut out = Vec::with_capacity(data.len() - removed + spans.len() * marker.len());
        let mut at = 0;
        for r in spans {
            out.extend_from_slice(&data[at..r.start]);
            out.extend_from_slice(marker);
            at = r.end;
        }
        out.extend_from_slice(&data[at..]);
        Cow::Owned(out)
    }
}

/// `r` joined into `last` when the two overlap (their union is then one
/// span, the one [`merge`] would make of them); whether it was.
fn join(last: &mut Range<usize>, r: &Range<usize>) -> bool {
    let overlap = r.start < last.end && last.start < r.end;
    if overlap {
        *last = last.start.min(r.start)..last.end.max(r.end);
    }
    overlap
}

/// `r` added to `spans`, joined to the last span when the two overlap.
/// Matches come with their ends in order, so a run of overlapping ones
/// is kept as one span; [`merge`] still settles the rest.
fn push_merged(spans: &mut Vec<Range<usize>>, r: Range<usize>) {
    if !spans.last_mut().is_some_and(|last| join(last, &r)) {
        spans.push(r);
    }
}

/// How many spans [`push_merged`] keeps of `ranges`, allocating nothing.
fn merged_count(ranges: impl Iterator<Item = Range<usize>>) -> usize {
    let mut last: Option<Range<usize>> = None;
    let mut n = 0;
    for r in ranges {
        if !last.as_mut().is_some_and(|l| join(l, &r)) {
            n += 1;
            last = Some(r);
        }
    }
    n
}

/// [`merge`] on a vector kept in place (its capacity stays for reuse).
fn merge_in_place(spans: &mut Vec<Range<usize>>) {
    *spans = merge(std::mem::take(spans));
}

/// Sorted and merged: spans that overlap become one (copies side by side
/// stay two). In place, with an unstable sort: nothing is allocated
/// beside the spans themselves.
fn merge(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_unstable_by_key(|r| (r.start, r.end));
    let mut kept = 0;
    for i in 0..spans.len() {
        let r = spans[i].clone();
        if kept > 0 && r.start < spans[kept - 1].end {
            let last = &mut spans[kept - 1];
            last.end = last.end.max(r.end);
        } else {
            spans[kept] = r;
            kept += 1;
        }
    }
    spans.truncate(kept);
    spans
}

#[cfg(test)]
mod tests;
