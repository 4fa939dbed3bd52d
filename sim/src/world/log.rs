//! The shared log every client appends to: the chunks sent, acknowledged
//! and refused, and the check that the file holds whole chunks only, each
//! sent, none refused, none twice, and every acknowledged one.
//!
//! The file only grows while a world runs, and the check ran whenever it
//! changed: reading it from the start each time made the checker's cost
//! grow with the square of the log. [`Log::check`] reads only what was
//! added since the bytes it last passed, which it keeps, and starts over
//! if those bytes changed. [`Log::recheck`] is the check from the start;
//! the two give the same verdict (compared on every check in debug
//! builds, at the end of every seed, and property-tested).

use std::collections::BTreeSet;

#[derive(Clone, Debug, Default)]
pub(super) struct Log {
    sent: BTreeSet<Vec<u8>>,
    acked: BTreeSet<Vec<u8>>,
    refused: BTreeSet<Vec<u8>>,
    /// The file as last checked: whole chunks, each passed.
    passed: Vec<u8>,
    /// The chunks in `passed`.
    seen: BTreeSet<Vec<u8>>,
    /// Acknowledged chunks not in `seen`.
    missing: BTreeSet<Vec<u8>>,
}

impl Log {
    /// A chunk some client sent: it may end up in the file.
    pub fn send(&mut self, chunk: Vec<u8>) {
        self.sent.insert(chunk);
    }

    /// A chunk whose write was acknowledged: it must be in the file.
    pub fn ack(&mut self, chunk: Vec<u8>) {
        if !self.seen.contains(&chunk) {
            self.missing.insert(chunk.clone());
        }
        self.acked.insert(chunk);
    }

    /// A chunk whose write was refused: it must never be in the file.
    pub fn refuse(&mut self, chunk: Vec<u8>) {
        self.refused.insert(chunk);
    }

    /// The check, reading only what the file gained since it last passed.
    pub fn check(&mut self, data: &[u8]) -> Result<(), String> {
        let verdict = self.check_from_last(data);
        if cfg!(debug_assertions) {
            let full = self.recheck(data);
            assert_eq!(verdict.is_ok(), full.is_ok(), "log checks disagree: {verdict:?} / {full:?}");
        }
        verdict
    }

    fn check_from_last(&mut self, data: &[u8]) -> Result<(), String> {
        if !data.starts_with(&self.passed) {
            // Rewritten, not appended to: start over.
            self.passed.clear();
            self.seen.clear();
            self.missing = self.acked.clone();
        }
        // What was added, kept only once all of it passes, so that a
        // failed check leaves the state as it was.
        let start = self.passed.len();
        let mut added = BTreeSet::new();
        let mut at = start;
        while at < data.len() {
            let chunk = next_chunk(data, at)?;
            self.vet(chunk)?;
            if self.seen.contains(chunk) || !added.insert(chunk) {
                return Err(repeated(chunk));
            }
            at += chunk.len();
        }
        for chunk in added {
            self.missing.remove(chunk);
            self.seen.insert(chunk.to_vec());
        }
        self.passed.extend_from_slice(&data[start..]);
        // A chunk already in the file may have been refused since.
        if let Some(r) = self.refused.iter().find(|r| self.seen.contains(*r)) {
            return Err(repeated(r));
        }
        match self.missing.first() {
            Some(m) => Err(missing(m)),
            None => Ok(()),
        }
    }

    /// The check from the start of the file, keeping nothing.
    pub fn recheck(&self, data: &[u8]) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        let mut at = 0;
        while at < data.len() {
            let chunk = next_chunk(data, at)?;
            self.vet(chunk)?;
            if !seen.insert(chunk) {
                return Err(repeated(chunk));
            }
            at += chunk.len();
        }
        match self.acked.iter().find(|c| !seen.contains(c.as_slice())) {
            Some(m) => Err(missing(m)),
            None => Ok(()),
        }
    }

    /// Both checks of `data` give one verdict (the incremental one on a
    /// copy, from where it stands).
    pub fn agrees(&self, data: &[u8]) -> Result<(), String> {
        let (kept, full) = (self.clone().check_from_last(data), self.recheck(data));
        if kept.is_ok() != full.is_ok() {
            return Err(format!("the kept log check says {kept:?}, the full one {full:?}"));
        }
        Ok(())
    }

    fn vet(&self, chunk: &[u8]) -> Result<(), String> {
        if !self.sent.contains(chunk) || self.refused.contains(chunk) {
            return Err(repeated(chunk));
        }
        Ok(())
    }
}

/// The whole chunk (`[` to `]`) at `at`.
fn next_chunk(data: &[u8], at: usize) -> Result<&[u8], String> {
    let rest = &data[at..];
    match (rest.first(), rest.iter().position(|&b| b == b']')) {
        (Some(b'['), Some(end)) => Ok(&rest[..=end]),
        _ => Err(format!("torn chunk at {at}")),
    }
}

fn repeated(chunk: &[u8]) -> String {
    format!("chunk {} was never sent, was refused, or repeats", String::from_utf8_lossy(chunk))
}

fn missing(chunk: &[u8]) -> String {
    format!("acknowledged chunk {} is missing", String::from_utf8_lossy(chunk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(n: u8) -> Vec<u8> {
        format!("[c{n}]").into_bytes()
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A write of this chunk that landed in the file.
        Write(u8),
        /// A write sent that never landed.
        Lost(u8),
        Ack(u8),
        /// The last chunk written is acknowledged, or refused.
        AckLast,
        RefuseLast,
        Refuse(u8),
        /// Bytes no one sent: a chunk, or half of one.
        Stray(u8),
        Tear(u8),
        /// Cut the file to this many bytes (a rewrite).
        Cut(usize),
        Check,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u8..40).prop_map(Step::Write),
            1 => (0u8..40).prop_map(Step::Lost),
            1 => (0u8..40).prop_map(Step::Ack),
            5 => Just(Step::AckLast),
            1 => Just(Step::RefuseLast),
            1 => (0u8..40).prop_map(Step::Refuse),
            1 => (0u8..40).prop_map(Step::Stray),
            1 => (0u8..40).prop_map(Step::Tear),
            1 => (0usize..60).prop_map(Step::Cut),
            5 => Just(Step::Check),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Whatever is written, lost, acknowledged, refused, torn or cut,
        /// in whatever order, the kept check gives the full check's
        /// verdict after every change.
        #[test]
        fn the_kept_check_is_the_full_check(steps in proptest::collection::vec(step(), 0..60)) {
            let mut log = Log::default();
            let mut file: Vec<u8> = Vec::new();
            let mut last = None;
            for s in steps {
                match s {
                    Step::Write(n) => {
                        log.send(chunk(n));
                        file.extend_from_slice(&chunk(n));
                        last = Some(n);
                    }
                    Step::Lost(n) => log.send(chunk(n)),
                    Step::Ack(n) => log.ack(chunk(n)),
                    Step::AckLast => last.into_iter().for_each(|n| log.ack(chunk(n))),
                    Step::RefuseLast => last.into_iter().for_each(|n| log.refuse(chunk(n))),
                    Step::Refuse(n) => log.refuse(chunk(n)),
                    Step::Stray(n) => file.extend_from_slice(&chunk(n)),
                    Step::Tear(n) => file.extend_from_slice(&chunk(n)[..2]),
                    Step::Cut(n) => file.truncate(n),
                    Step::Check => {
                        let full = log.recheck(&file);
                        prop_assert_eq!(log.check_from_last(&file).is_ok(), full.is_ok(), "{:?}", full);
                    }
                }
            }
        }
    }

    #[test]
    fn each_way_to_lose_data_is_caught() {
        let mut log = Log::default();
        for n in 0..3 {
            log.send(chunk(n));
        }
        log.ack(chunk(0));
        assert_eq!(log.check(b""), Err(missing(&chunk(0))));
        assert_eq!(log.check(b"[c0]"), Ok(()));
        assert_eq!(log.check(b"[c0][c9]"), Err(repeated(b"[c9]")), "never sent");
        let mut log2 = log.clone();
        assert_eq!(log2.check(b"[c0][c0]"), Err(repeated(b"[c0]")), "twice");
        assert_eq!(log.check(b"[c0][c1"), Err("torn chunk at 4".to_owned()));
        assert_eq!(log.check(b"[c0][c1]"), Ok(()));
        log.refuse(chunk(1));
        assert_eq!(log.check(b"[c0][c1]"), Err(repeated(b"[c1]")), "refused after it was seen");
        assert_eq!(log.agrees(b"[c0][c1]"), Ok(()));
    }
}
