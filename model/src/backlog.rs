//! Flow control between a connection's writer and its reader.
//!
//! The session queues responses for the writer task; the reader task reads
//! the client's next requests only while fewer than `limit` response bytes
//! are unsent, so a client that never reads its answers is throttled rather
//! than buffered without bound.

use crate::sync::{AtomicBool, AtomicUsize, AtomicWaker, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

#[derive(Debug)]
pub struct Backlog {
    unsent: AtomicUsize,
    closed: AtomicBool,
    limit: usize,
    /// The reader, waiting for the writer to drain.
    reader: AtomicWaker,
}

impl Backlog {
    pub fn new(limit: usize) -> Self {
        Backlog {
            unsent: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            limit,
            reader: AtomicWaker::new(),
        }
    }

    /// The session queued `n` bytes for the writer.
    pub fn queued(&self, n: usize) {
        self.unsent.fetch_add(n, Ordering::AcqRel);
    }

    /// The writer sent (or dropped) `n` queued bytes.
    pub fn sent(&self, n: usize) {
        self.unsent.fetch_sub(n, Ordering::AcqRel);
        self.reader.wake();
    }

    /// The writer is gone: nothing will drain any more, so the reader must
    /// not wait for it (it will find the connection's end itself).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.reader.wake();
    }

    pub fn unsent(&self) -> usize {
        self.unsent.load(Ordering::Acquire)
    }

    fn clear(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.unsent() <= self.limit
    }

    /// Resolves once the reader may read again. One reader waits at a time.
    pub fn room(&self) -> Room<'_> {
        Room { backlog: self }
    }
}

pub struct Room<'a> {
    backlog: &'a Backlog,
}

impl Future for Room<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let b = self.backlog;
        if b.clear() {
            return Poll::Ready(());
        }
        // Register, then look again: a drain between the first look and the
        // registration would otherwise wake nobody.
        crate::sync::register(&b.reader, cx.waker());
        if b.clear() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
