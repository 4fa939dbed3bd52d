//! Models of airlock's cross-task primitives. Under `--cfg loom` loom
//! explores every interleaving (preemption bound 3); without it each model
//! runs many times on real threads as a stress test.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p airlock-model --release
//! ```

use airlock_model::backlog::Backlog;
use airlock_model::inflight::{Cancel, Inflight};
use airlock_model::seeds::SeedQueue;
use airlock_model::sync::{thread, Arc, AtomicUsize, Ordering};

mod common;

fn check(model: impl Fn() + Sync + Send + 'static) {
    common::check(3, 500, model);
}

#[cfg(loom)]
use airlock_model::sync::block_on;
#[cfg(not(loom))]
use pollster::block_on;

#[test]
fn a_draining_writer_always_wakes_the_throttled_reader() {
    check(|| {
        let b = Arc::new(Backlog::new(1));
        b.queued(3);
        let writer = {
            let b = b.clone();
            thread::spawn(move || {
                b.sent(1);
                b.sent(1);
                b.sent(1);
            })
        };
        // A lost wakeup leaves this blocked for ever: loom reports it.
        block_on(b.room());
        assert!(b.unsent() <= 1);
        writer.join().unwrap();
        assert_eq!(b.unsent(), 0);
    });
}

#[test]
fn a_writer_that_dies_releases_the_reader() {
    check(|| {
        let b = Arc::new(Backlog::new(1));
        b.queued(10);
        let writer = {
            let b = b.clone();
            thread::spawn(move || b.close())
        };
        block_on(b.room());
        writer.join().unwrap();
        assert_eq!(b.unsent(), 10);
    });
}

#[test]
fn a_provider_result_racing_its_cancel_is_delivered_exactly_once() {
    check(|| {
        let calls = Arc::new(Inflight::<u64, &'static str>::new());
        calls.start(7);
        let told = Arc::new(AtomicUsize::new(0));
        let task = {
            let (calls, told) = (calls.clone(), told.clone());
            thread::spawn(move || {
                if calls.complete(7, "real") {
                    // The session will hear of it through its event queue.
                    told.store(1, Ordering::Release);
                }
            })
        };
        // The session cancels while the task may be finishing.
        let mut delivered = Vec::new();
        match calls.cancel(7) {
            Cancel::Finished(r) => delivered.push(r),
            Cancel::Running => delivered.push("cancelled"),
            Cancel::Unknown => panic!("the call was running"),
        }
        task.join().unwrap();
        // Then it handles the task's event, if one was sent.
        if told.load(Ordering::Acquire) == 1 {
            if let Some(r) = calls.take(7) {
                delivered.push(r);
            }
        }
        assert_eq!(delivered.len(), 1, "delivered {delivered:?}");
        assert!(calls.is_empty());
        // The task's result and "cancelled" are never both delivered, and a
        // result that reached the slot first is the one delivered.
        if told.load(Ordering::Acquire) == 1 {
            assert_eq!(delivered, ["real"]);
        }
    });
}

#[test]
fn two_calls_finishing_together_are_each_delivered_once() {
    check(|| {
        let calls = Arc::new(Inflight::<u64, u64>::new());
        calls.start(1);
        calls.start(2);
        let tasks: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|c| {
                let calls = calls.clone();
                thread::spawn(move || calls.complete(c, c * 10))
            })
            .collect();
        let told: Vec<bool> = tasks.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(told, [true, true]);
        assert_eq!(calls.take(1), Some(10));
        assert_eq!(calls.take(2), Some(20));
        assert_eq!(calls.take(2), None);
        assert!(calls.drain().is_empty());
    });
}

#[test]
fn every_seed_is_run_exactly_once_whatever_the_workers() {
    check(|| {
        let q = Arc::new(SeedQueue::new(10..13));
        let worker = |q: Arc<SeedQueue<u64>>| {
            move || {
                while let Some(seed) = q.claim() {
                    q.finish(seed);
                }
            }
        };
        let other = thread::spawn(worker(q.clone()));
        worker(q.clone())();
        other.join().unwrap();
        let q = Arc::try_unwrap(q).unwrap_or_else(|_| panic!("a worker still holds the queue"));
        let mut seeds = q.into_results();
        seeds.sort_unstable();
        assert_eq!(seeds, [10, 11, 12]);
    });
}
