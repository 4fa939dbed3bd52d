//! A client's unanswered requests in the order it sent them, and the bytes
//! of them a machine holds waiting, which the bounds checker asks of every
//! client after every step. The answer is kept with the state it was
//! computed from (the requests' generation and the bytes delivered) and
//! recomputed only when one of them moved, so a step costs the clients it
//! touched, not all of them. [`Order::queued_bytes_recounted`] is the
//! full walk, which the checkers compare it with.
//!
//! It is also where a request's record (`S`: what the checkers expect of
//! its answer) waits for that answer: a client's request ids are unique,
//! answers mostly come in order, so the id is found near the front, and
//! one list does what a map keyed by id beside it did, without a second
//! copy of each id or a search of the map for every answer.

use super::Queued;
use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct Order<S> {
    items: VecDeque<(Queued, S)>,
    /// Bumped by every change to `items`.
    generation: u64,
    /// (generation, bytes delivered) → queued bytes.
    kept: Option<(u64, u64, u64)>,
}

impl<S> Default for Order<S> {
    fn default() -> Self {
        Order { items: VecDeque::new(), generation: 0, kept: None }
    }
}

impl<S> Order<S> {
    /// A request just sent, with its record. Ids are unique per client.
    pub fn push_back(&mut self, q: Queued, sent: S) {
        debug_assert!(self.get(&q.id).is_none(), "request id {} sent twice", q.id);
        self.generation += 1;
        self.items.push_back((q, sent));
    }

    /// Takes the request `id` out, wherever it stands, with its record.
    pub fn remove(&mut self, id: &str) -> Option<S> {
        let p = self.items.iter().position(|(q, _)| q.id == id)?;
        self.generation += 1;
        self.items.remove(p).map(|(_, s)| s)
    }

    /// The record of request `id`, if it is unanswered. Searched from the
    /// newest: it is asked of requests just sent.
    pub fn get(&self, id: &str) -> Option<&S> {
        self.items.iter().rev().find(|(q, _)| q.id == id).map(|(_, s)| s)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Queued, &S)> {
        self.items.iter().map(|(q, s)| (q, s))
    }

    pub fn records(&self) -> impl Iterator<Item = &S> {
        self.items.iter().map(|(_, s)| s)
    }

    pub fn back(&self) -> Option<(&Queued, &S)> {
        self.items.back().map(|(q, s)| (q, s))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The bytes of requests the machine holds waiting once `taken` bytes
    /// were delivered, as [`Self::queued_bytes_recounted`] counts them.
    pub fn queued_bytes(&mut self, taken: u64) -> u64 {
        match self.kept {
            Some((g, t, bytes)) if g == self.generation && t == taken => bytes,
            _ => {
                let bytes = self.queued_bytes_recounted(taken);
                self.kept = Some((self.generation, taken, bytes));
                bytes
            }
        }
    }

    /// Frames wholly delivered and not yet answered behind the oldest one
    /// that holds the line (the one being served, whose bytes have moved
    /// on into an effect or upstream): a machine serves a client's frames
    /// in order and stops at the first that waits. Before it, every frame
    /// was served: those unanswered there answer elsewhere (broker ops,
    /// attaches). Behind it, every frame waits, whatever it is. Closes are
    /// admitted past the bounds (they only release), so they are not
    /// counted.
    pub fn queued_bytes_recounted(&self, taken: u64) -> u64 {
        let delivered = |q: &Queued| q.frame.filter(|(end, _)| *end <= taken);
        self.items
            .iter()
            .map(|(q, _)| q)
            .skip_while(|q| !(q.in_line && delivered(q).is_some()))
            .skip(1)
            .filter(|q| !q.close)
            .filter_map(|q| delivered(q).map(|(_, len)| len))
            .sum()
    }

    /// The kept answer, if any, against the full walk.
    pub fn check_kept(&self) -> Result<(), String> {
        match self.kept {
            Some((g, taken, bytes)) if g == self.generation => {
                let recounted = self.queued_bytes_recounted(taken);
                if bytes != recounted {
                    return Err(format!("kept {bytes} queued bytes at {taken}, recounted {recounted}"));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Change {
        Send { len: u64, in_line: bool, close: bool, framed: bool },
        Answer(usize),
        Deliver(u64),
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (1u64..100, any::<bool>(), any::<bool>(), any::<bool>())
                .prop_map(|(len, in_line, close, framed)| Change::Send { len, in_line, close, framed }),
            (0usize..10).prop_map(Change::Answer),
            (0u64..300).prop_map(Change::Deliver),
        ]
    }

    #[test]
    fn a_kept_answer_that_drifted_is_caught() {
        let mut order = Order::default();
        for (k, end) in [(1, 10), (2, 20), (3, 30)] {
            order.push_back(
                Queued { id: format!("r{k}"), frame: Some((end, 6)), in_line: true, close: false },
                (),
            );
        }
        assert_eq!(order.queued_bytes(30), 12);
        assert_eq!(order.check_kept(), Ok(()));
        order.kept = order.kept.map(|(g, t, b)| (g, t, b + 1));
        assert!(order.check_kept().is_err());
    }

    fn q(id: &str, end: u64, len: u64, in_line: bool, close: bool) -> Queued {
        Queued { id: id.to_owned(), frame: Some((end, len)), in_line, close }
    }

    /// A `QUOTA` passed upstream was served and holds nothing: the read
    /// behind it is the one in service, and what follows it waits,
    /// whether it would hold the line or not; a close waits uncounted.
    #[test]
    fn what_waits_is_behind_the_first_request_that_holds_the_line() {
        let mut order = Order::default();
        order.push_back(q("quota", 10, 6, false, false), 1);
        order.push_back(q("read", 30, 16, true, false), 2);
        order.push_back(q("quota2", 60, 26, false, false), 3);
        order.push_back(q("refused", 100, 36, true, false), 4);
        order.push_back(q("close", 150, 46, true, true), 5);
        order.push_back(q("write", 210, 56, true, false), 6);
        assert_eq!(order.queued_bytes_recounted(210), 26 + 36 + 56);
        // Bytes not yet delivered wait nowhere.
        assert_eq!(order.queued_bytes_recounted(120), 26 + 36);
        // The read answered: the frame the machine refuses is served next,
        // then the close, which waits on its effect.
        assert_eq!(order.remove("read"), Some(2));
        assert_eq!(order.queued_bytes_recounted(210), 56);
        assert_eq!(order.remove("refused"), Some(4));
        assert_eq!(order.remove("refused"), None);
        assert_eq!(order.queued_bytes_recounted(210), 56);
        assert_eq!(order.get("close"), Some(&5));
        assert_eq!(order.remove("close"), Some(5));
        assert_eq!(order.queued_bytes_recounted(210), 0);
        assert_eq!(
            order.iter().map(|(q, _)| q.id.as_str()).collect::<Vec<_>>(),
            ["quota", "quota2", "write"]
        );
        assert_eq!(order.records().copied().collect::<Vec<_>>(), [1, 3, 6]);
    }

    proptest! {
        /// Whatever is sent, answered and delivered in whatever order, the
        /// kept answer is the full walk's.
        #[test]
        fn kept_queued_bytes_are_the_walk(changes in proptest::collection::vec(change(), 0..80)) {
            let (mut order, mut pushed, mut taken, mut next) = (Order::default(), 0u64, 0u64, 0u64);
            for c in changes {
                match c {
                    Change::Send { len, in_line, close, framed } => {
                        next += 1;
                        let frame = framed.then(|| {
                            pushed += len + 4;
                            (pushed, len)
                        });
                        order.push_back(Queued { id: format!("r{next}"), frame, in_line, close }, ());
                    }
                    Change::Answer(k) => {
                        let id = order.iter().nth(k).map(|(q, _)| q.id.clone());
                        if let Some(id) = id {
                            order.remove(&id);
                        }
                    }
                    Change::Deliver(n) => taken = (taken + n).min(pushed),
                }
                prop_assert_eq!(order.queued_bytes(taken), order.queued_bytes_recounted(taken));
                prop_assert_eq!(order.check_kept(), Ok(()));
            }
        }
    }
}
