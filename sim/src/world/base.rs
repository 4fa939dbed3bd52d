//! What the worlds share: the violation a checker reports, the pipes
//! between simulated processes, the oracle that says which id a frame must
//! be answered under, and the outcome of a run.

use crate::swarm::FaultKind;
use crate::Failure;
use airlock_core::handles::ClientId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};

/// What broke, before the step number is attached.
#[derive(Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub message: String,
    pub level: Option<usize>,
    pub client: Option<ClientId>,
}

pub(super) fn violation(invariant: &'static str, message: String) -> Violation {
    Violation { invariant, message, level: None, client: None }
}

pub(super) fn at(mut v: Violation, level: usize, client: ClientId) -> Violation {
    v.level = Some(level);
    v.client = Some(client);
    v
}

pub(super) type Check = Result<(), Violation>;

/// Bytes on their way through a pipe, kept as the frames they were written
/// as so that an undisturbed delivery hands over exactly one frame.
#[derive(Debug, Default)]
pub(super) struct Pipe {
    pub(super) frames: VecDeque<Vec<u8>>,
    /// Bytes of the front frame already delivered.
    pub(super) off: usize,
    pub(super) len: usize,
    /// Bytes ever pushed and taken: where in the stream each frame ends.
    pub(super) pushed: u64,
    pub(super) taken: u64,
    /// Where the last piece wholly taken ends in the stream.
    pub(super) whole: u64,
}

impl Pipe {
    pub(super) fn push(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.pushed += bytes.len() as u64;
            self.len += bytes.len();
            self.frames.push_back(bytes);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn front_rest(&self) -> usize {
        self.frames.front().map_or(0, |f| f.len() - self.off)
    }

    pub(super) fn take(&mut self, mut n: usize) -> Vec<u8> {
        // Exactly the next piece, whole: handed over, not copied.
        if self.off == 0 && n > 0 && self.frames.front().is_some_and(|f| f.len() == n) {
            if let Some(front) = self.frames.pop_front() {
                self.len -= n;
                self.taken += n as u64;
                self.whole = self.taken;
                return front;
            }
        }
        let mut out = Vec::with_capacity(n);
        while n > 0 {
            let Some(front) = self.frames.front() else { break };
            let k = n.min(front.len() - self.off);
            out.extend_from_slice(&front[self.off..self.off + k]);
            self.off += k;
            n -= k;
            self.len -= k;
            self.taken += k as u64;
            if self.off == front.len() {
                self.frames.pop_front();
                self.off = 0;
                self.whole = self.taken;
            }
        }
        out
    }

    /// Bytes taken past the end of the last piece wholly taken: what a
    /// reader holds of a frame not yet complete.
    pub(super) fn partial(&self) -> u64 {
        self.taken - self.whole
    }

    pub(super) fn clear(&mut self) {
        let pushed = self.pushed;
        *self = Pipe { pushed, taken: pushed, whole: pushed, ..Pipe::default() };
    }
}

/// The id a conforming server must answer `payload` under: the `id` string
/// of a JSON object, else none.
pub(super) fn oracle_id(payload: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Value>(payload) {
        Ok(Value::Object(mut o)) => match o.remove("id") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

pub struct Outcome {
    pub steps: u64,
    pub now: u64,
    pub faults: BTreeMap<FaultKind, u64>,
    pub failure: Option<Failure>,
    pub trace: Option<Vec<u8>>,
}

/// The parts joined: what `format!` gives for strings and integers, in one
/// allocation (`format!` was a tenth of what a client spent on a request).
pub(super) fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

pub(super) fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.gen_range(0..items.len())]
}
