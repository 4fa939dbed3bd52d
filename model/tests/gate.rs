//! The broker's one-call gate, fed by concurrent tasks.
//!
//! In airlock the gate is the core's broker machine, owned by one task, so
//! it never runs twice at once; what is concurrent is where its inputs come
//! from: clients submitting and cancelling on their own connections, the
//! provider call finishing, the clock firing. Here each of those is a
//! thread pushing its steps into the broker's invariant checker
//! (`airlock_core::broker::check`) behind the shim's mutex, and loom tries
//! every order in which they can arrive — including a cancel, a timeout and
//! a provider result landing at the very instant the lock is handed on.
//! The checker asserts, after every step: never two calls holding the gate,
//! starts in admission order, a timed-out or cancelled waiter never starts,
//! one answer per call, exact quota.

use airlock_core::broker::check::{Checker, Setup, Step};
use airlock_core::broker::Usage;
use airlock_model::sync::{lock, thread, Arc, Mutex};

mod common;

fn check(model: impl Fn() + Sync + Send + 'static) {
    common::check(2, 200, model);
}

fn usage() -> Option<Usage> {
    Some(Usage { prompt_tokens: 100, cached_tokens: 40, completion_tokens: 20, total_tokens: 120 })
}

/// Each thread's steps, run in order; threads interleave freely.
fn race(setup_byte: u8, scripts: Vec<Vec<Step>>) {
    let checker = Arc::new(Mutex::new(Checker::new(Setup::from_byte(setup_byte))));
    let handles: Vec<_> = scripts
        .into_iter()
        .map(|steps| {
            let checker = checker.clone();
            thread::spawn(move || {
                for step in &steps {
                    lock(&checker).step(step);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Every timer out, every call finished: all answered, quota exact.
    lock(&checker).finish();
}

#[test]
fn waiters_racing_cancel_timeout_and_completion_never_break_the_gate() {
    check(|| {
        race(
            // Short timers, a budget that trims.
            0b101,
            vec![
                // A client: submits, then cancels its own call.
                vec![
                    Step::Submit { slot: 0, model: 1, max_tokens: Some(50), token: Some(1) },
                    Step::Cancel { slot: 0, token: 1 },
                ],
                // Another client queues behind it.
                vec![Step::Submit { slot: 1, model: 1, max_tokens: None, token: None }],
                // The provider answers, and the clock reaches a deadline.
                vec![Step::ProviderOk { usage: usage() }, Step::ToDeadline, Step::Tick],
            ],
        );
    });
}

#[test]
fn an_owner_leaving_races_the_handoff() {
    check(|| {
        race(
            0b1,
            vec![
                vec![
                    Step::Submit { slot: 0, model: 0, max_tokens: Some(10), token: None },
                    Step::OwnerGone { slot: 0 },
                ],
                vec![Step::Submit { slot: 1, model: 0, max_tokens: Some(10), token: Some(2) }],
                vec![Step::ProviderErr { usage: usage() }, Step::ToDeadline, Step::Tick],
            ],
        );
    });
}
