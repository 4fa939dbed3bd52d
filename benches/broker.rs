//! What one step of the LLM broker costs with many calls waiting.
//!
//! Steady state with `n` waiters: each iteration queues one more call and
//! completes the running one, which hands the lock to the head of the
//! queue, so the queue stays at `n`. A second group cancels a waiter in
//! the middle of the queue by its token and queues a replacement. From 10
//! to 100 000 waiters the first stays flat and the cancel takes O(log n)
//! instructions, its time growing faster once the queue outgrows the
//! caches (docs/perf.md, Scale). Building the queue of `n` waiters is
//! setup, outside the measured loop.

use airlock_core::broker::{
    Broker, BrokerConfig, BrokerInput, CallId, LlmRequest, Money, PricingCatalog, ProviderResult, Usage,
};
use airlock_core::handles::ClientId;
use airlock_core::time::Instant;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::time::Duration;

const SIZES: [u64; 4] = [10, 1_000, 10_000, 100_000];

struct Bench {
    broker: Broker,
    next_call: u64,
    now: u64,
    request: LlmRequest,
    result: ProviderResult,
}

impl Bench {
    fn new(waiters: u64) -> Self {
        // Deadlines far away and room for every waiter: the bench
        // measures queueing, not timeouts or refusals.
        let config = BrokerConfig {
            queue_max_wait: Duration::from_secs(1 << 30),
            request_timeout: Duration::from_secs(1 << 30),
            max_pending: usize::MAX,
            max_pending_bytes: u64::MAX,
            ..BrokerConfig::default()
        };
        let broker = Broker::new(config, PricingCatalog::builtin(), Money::from_pico(u64::MAX / 2), "bench")
            .expect("bench config is valid");
        let usage = Usage { prompt_tokens: 100, cached_tokens: 0, completion_tokens: 10, total_tokens: 110 };
        let mut b = Bench {
            broker,
            next_call: 0,
            now: 0,
            request: LlmRequest::new(vec![serde_json::json!({"role": "user", "content": "hi"})]),
            result: ProviderResult::Ok {
                messages: airlock_core::broker::RawJson::from_value(&serde_json::json!([])),
                usage: Some(usage),
                model: "gpt-4o-mini".into(),
            },
        };
        for _ in 0..=waiters {
            b.submit();
        }
        assert_eq!(b.broker.queued() as u64, waiters);
        b
    }

    fn submit(&mut self) {
        let call = CallId(self.next_call);
        self.next_call += 1;
        self.now += 1;
        let token = Some(format!("t{}", call.0));
        let owner = ClientId(call.0 % 64);
        self.broker.handle(
            Instant::from_micros(self.now),
            BrokerInput::Submit {
                call,
                owner,
                scope: owner,
                request: self.request.clone(),
                cancel_token: token,
            },
        );
        while self.broker.poll_output().is_some() {}
    }

    fn complete_running(&mut self) {
        let call = self.broker.running().expect("a call runs");
        self.broker.handle(
            Instant::from_micros(self.now),
            BrokerInput::ProviderDone { call, result: self.result.clone() },
        );
        while self.broker.poll_output().is_some() {}
    }

    /// Cancel the waiter admitted `back` calls before the newest.
    fn cancel_middle(&mut self, back: u64) {
        let id = self.next_call - back;
        let owner = ClientId(id % 64);
        self.broker.handle(
            Instant::from_micros(self.now),
            BrokerInput::Cancel { request: CallId(u64::MAX), owner, token: format!("t{id}") },
        );
        while self.broker.poll_output().is_some() {}
    }
}

fn enqueue_dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("broker_enqueue_dispatch");
    g.sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    for n in SIZES {
        let mut b = Bench::new(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                b.submit();
                b.complete_running();
            })
        });
        assert_eq!(b.broker.queued() as u64, n, "queue length drifted");
    }
    g.finish();
}

fn cancel_waiter(c: &mut Criterion) {
    let mut g = c.benchmark_group("broker_cancel_waiter");
    g.sample_size(30).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    for n in SIZES {
        let mut b = Bench::new(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| {
                // Newest admitted is next_call - 1; half the queue back.
                b.cancel_middle(n / 2 + 1);
                b.submit();
            })
        });
        assert_eq!(b.broker.queued() as u64, n, "a cancel missed its waiter");
    }
    g.finish();
}

criterion_group!(benches, enqueue_dispatch, cancel_waiter);
criterion_main!(benches);
