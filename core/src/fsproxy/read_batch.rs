//! Consecutive reads of one host file served by one host read.
//!
//! A client that pipelines reads of a host handle (`airlock fs cat` keeps
//! 32 of 4 KiB in flight) has them waiting in its queue while the one
//! before is served. When a read of a host handle is served, the reads of
//! the same handle queued right behind it join it, up to
//! `Config::max_read_batch` bytes of their `max`es summed: one
//! `Effect::Read` asks for the sum, and its bytes are split among the
//! answers in order, each taking at most its own `max`. That is the same
//! reads, back to back: nothing of this client runs between them (its
//! requests are served one at a time, and nobody else holds the handle),
//! so it is one valid order of events, the one where they follow each
//! other at once. It is not a read-ahead: only requests already received
//! join, no byte read before a request arrived answers it, and a batch
//! ends at the first request that is not a read of that handle (a write,
//! a close, another handle's read), so nothing is reordered around it.
//!
//! Short reads and failures are split as sequential reads would give
//! them: a host read of 0 bytes is the end of the file, and every read of
//! the batch answers empty with `eof` (each would have read 0, back to
//! back); a shorter read than asked answers the reads its bytes reach
//! (the last maybe short, as any read may be) and reads again for the
//! others, since a short read is not proof of the end (a file may grow,
//! a filesystem may return less). A failed host read answers the first
//! read of the batch with the failure and reads again for the others, as
//! each would have tried its own read.
//!
//! Reads joined to a batch keep their frame bytes counted against the
//! queue bounds until they are answered (or become the one being served),
//! so what a client may have waiting is the same with or without batches.

use super::wire::{Op, Request};
use super::{fs_failure, unexpected, Effect, EffectResult, FileId, FsProxy, Held, Pending, Success, Waiting};
use crate::handles::{ClientId, Handle};
use std::ops::Range;

/// Bytes one host read may ask for on behalf of consecutive reads of one
/// handle, by default (`Config::max_read_batch`): sixteen 4 KiB reads.
pub const DEFAULT_MAX_READ_BATCH: u32 = 64 << 10;

/// Queued frames longer than this are never looked at to join a batch: a
/// read request is some 60 bytes, and this bounds the parse spent on a
/// frame that turns out not to be one (it is parsed again when served).
pub const MAX_BATCHED_FRAME: usize = 512;

/// A read taking part in a batch.
#[derive(Debug)]
pub(super) struct Batched {
    pub(super) id: String,
    pub(super) max: u32,
    /// Bytes of its frame still counted against the queue bounds; 0 for
    /// the read being served (the oldest unanswered one).
    pub(super) held: u64,
}

/// A host read served during the input being handled: its effect is
/// asked for once the input is handled, so that the reads of the same
/// handle that arrive in the same input (a pipelining client's bytes carry
/// several) join it.
#[derive(Debug)]
pub(super) struct Starting {
    client: ClientId,
    file: FileId,
    h: Handle,
    read: Batched,
}

/// The bytes each of the reads asking for `maxes` gets from one host read
/// that returned `len` bytes, in order: the reads the bytes reach, each at
/// most its `max`. None of `len` is 0: every read gets an empty range (the
/// end of the file, for each of them). The reads past the end of the
/// ranges are left to read again.
pub(super) fn split(len: usize, maxes: &[u32]) -> Vec<Range<usize>> {
    if len == 0 {
        return vec![0..0; maxes.len()];
    }
    let mut out = Vec::with_capacity(maxes.len());
    let mut off = 0usize;
    for &max in maxes {
        if off >= len {
            break;
        }
        let end = off.saturating_add(max as usize).min(len);
        out.push(off..end);
        off = end;
    }
    out
}

impl FsProxy {
    /// Serve a read of host handle `h` (open on `file`): the client is busy
    /// with it from now on, exactly as if its effect had been asked for,
    /// so whatever it sends next waits in its queue as it would have.
    pub(super) fn start_read(&mut self, client: ClientId, file: FileId, h: Handle, read: Batched) {
        if read.max >= self.config.max_read_batch {
            return self.read_batch(client, file, vec![read]);
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.busy = true;
            c.busy_on_file = true;
        }
        self.starting_reads.push(Starting { client, file, h, read });
    }

    /// Ask the host for the reads served during the input just handled,
    /// each joined by the reads of its handle queued behind it meanwhile.
    pub(super) fn flush_reads(&mut self) {
        // After most inputs there is none: leave the list as it is.
        if self.starting_reads.is_empty() {
            return;
        }
        for Starting { client, file, h, read } in std::mem::take(&mut self.starting_reads) {
            let max = read.max;
            let mut reads = vec![read];
            reads.extend(self.gather_reads(client, h, max));
            self.read_batch(client, file, reads);
        }
    }

    /// The reads of handle `h` queued right behind the one being served
    /// (which asks for `max`), taken off the queue while their `max`es
    /// summed stay within `Config::max_read_batch`.
    pub(super) fn gather_reads(&mut self, client: ClientId, h: Handle, max: u32) -> Vec<Batched> {
        let limit = u64::from(self.config.max_read_batch);
        let mut total = u64::from(max);
        let mut out = Vec::new();
        while total < limit {
            let Some(c) = self.clients.get_mut(&client) else { break };
            let Some(q) = c.queue.front().filter(|q| q.len <= MAX_BATCHED_FRAME as u64) else { break };
            // Reads are held parsed; anything held as its frame is no read.
            let Held::Parsed(Ok(Request { id, op: Op::Read { h: next, max } })) = &q.held else { break };
            let (next, max) = (*next, *max);
            if next != h || total + u64::from(max) > limit {
                break;
            }
            let id = id.clone();
            let held = q.len;
            c.queue.pop_front();
            // Its bytes stay counted until it is answered.
            c.batched += 1;
            total += u64::from(max);
            if let Some(a) = &mut self.audit {
                a.request(client, &id, &Op::Read { h, max });
            }
            out.push(Batched { id, max, held });
        }
        out
    }

    /// Ask the host for the reads of `reads` (the first being served) in
    /// one read of their `max`es summed.
    pub(super) fn read_batch(&mut self, client: ClientId, file: FileId, reads: Vec<Batched>) {
        let Some(first) = reads.first() else { return };
        let req = Some(first.id.clone());
        let max = reads.iter().map(|r| r.max).fold(0u32, u32::saturating_add);
        let waiting = if reads.len() == 1 { Waiting::Read } else { Waiting::ReadBatch { file, reads } };
        self.effect(Pending { client, req, waiting }, Effect::Read { file, max });
    }

    /// `read` no longer waits behind the one being served: its bytes leave
    /// the queue bounds.
    fn unhold(&mut self, client: ClientId, read: &mut Batched) {
        if read.held == 0 {
            return;
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.queued_bytes -= read.held;
            c.batched -= 1;
            self.queued_total -= read.held;
        }
        read.held = 0;
    }

    /// The host read of a batch completed: answer the reads it answers,
    /// and read again for the others.
    pub(super) fn read_batch_done(
        &mut self,
        client: ClientId,
        file: FileId,
        reads: Vec<Batched>,
        result: EffectResult,
    ) {
        if let Some(c) = self.clients.get_mut(&client) {
            c.busy = false;
            c.busy_on_file = false;
        }
        if !self.clients.get(&client).is_some_and(|c| c.alive) {
            // Departing cleared its queue bounds already.
            return self.cleanup(client);
        }
        let mut reads = reads.into_iter();
        let answers: Vec<(Batched, Result<Success, _>)> = match result {
            EffectResult::Data { data, .. } => {
                let maxes: Vec<u32> = reads.as_slice().iter().map(|r| r.max).collect();
                let ranges = split(data.len(), &maxes);
                ranges
                    .into_iter()
                    .zip(reads.by_ref())
                    .map(|(r, read)| {
                        let eof = r.is_empty();
                        (read, Ok(Success::Data { data: data[r].to_vec(), eof }))
                    })
                    .collect()
            }
            EffectResult::Failed { kind, message } => {
                reads.next().map(|read| (read, Err(fs_failure(kind, message)))).into_iter().collect()
            }
            other => reads.next().map(|read| (read, Err(unexpected(&other)))).into_iter().collect(),
        };
        for (mut read, outcome) in answers {
            self.unhold(client, &mut read);
            self.respond(client, Some(read.id), outcome);
        }
        let mut rest: Vec<Batched> = reads.collect();
        if let Some(first) = rest.first_mut() {
            // The oldest unanswered read is now the one being served.
            self.unhold(client, first);
            return self.read_batch(client, file, rest);
        }
        self.pump(client);
    }
}

#[cfg(test)]
mod tests;
