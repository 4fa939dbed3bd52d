//! The broker scenario: clients interleave `LLMCMD`, `CANCEL` and `QUOTA`
//! with file ops on one FS proxy that runs the session's broker, against a
//! simulated provider with seeded latency, errors, hangs and usage.
//!
//! The checkers here keep their own model and never ask the broker how it
//! sees things, except for the quota it holds, which they recompute:
//!
//! 1. at most one provider call in flight (started, not yet reported done
//!    and not given up on with `CancelProvider`); calls start in the order
//!    their `LLMCMD`s were admitted (the order their frames reached the
//!    machine, which serves broker ops as they arrive); a call answered
//!    before it started (`queue_timeout`, `cancelled_before_start`) or
//!    whose client left never starts;
//! 3. every broker op of a live client is answered exactly once (the
//!    generic per-id bookkeeping of `on_response`);
//! 4. the provider's API key never reaches a child: every frame sent to a
//!    client is searched for it as raw text and, for broker answers, in
//!    every decoded string (escape-aware, so `\u`-escaped copies, copies
//!    split by an escape and copies escaped again inside JSON-in-a-string
//!    count), while the simulated provider leaks it in all those shapes,
//!    in error messages, tool-call arguments, the model name, object keys
//!    and huge many-valued replies; replies pass the real codec
//!    (`openai::parse_response_with`) as they would in the shell;
//! 5. the quota held equals the initial amount minus the sum of charges
//!    recomputed here, with this file's own prices, from the usage the
//!    simulated provider reported, clamped at zero;
//! 6. every broker op is answered within `queue_max_wait +
//!    request_timeout` (plus a step of slack) of simulated time after its
//!    frame reached the machine, not counting clock jumps (a shell that
//!    stalls cannot fire its timers on time);
//! 1. (retries) a call whose attempt the provider answered `429` or
//!    `5xx` keeps the lock while it backs off: no other call starts until
//!    it is answered or its client leaves; a retry starts only after the
//!    back-off its record announced, before the call's deadline (never
//!    moved), at most `max_retries` times, only after a `429` or `5xx`
//!    (whatever the `Retry-After`: absent, zero, huge, a date, garbage),
//!    and never for a call already answered (a cancel during the back-off
//!    is answered with no new start);
//! 11. the calls waiting for the lock never number more than
//!     `max_pending`, and never hold more than `max_pending_bytes` — by
//!     the machine's count, and by this file's own lower bound (the
//!     compact JSON of each waiting call's messages); a call answered
//!     `queue_full` or `budget_exhausted` never reaches the provider.
//!
//! And, for invariant 5 under `enforce_budget`: with a provider whose
//! reported usage stays within what the call was sent with (prompt tokens
//! at most its bytes, completion at most its `max_tokens`, which is what
//! the design promises about), every call started has a worst case that
//! fits the remaining budget less the worst case of calls given up on
//! whose usage may still come, and so the quota never clamps at zero.

use super::{at, next_id, req, request, send, violation, Check, Client, Kind, World};
use crate::swarm::FaultKind;
use airlock_core::broker::openai::{parse_response_with, retry_after_ms};
use airlock_core::broker::{
    retryable_status, BrokerConfig, BrokerSetup, CallId, Money, PricingCatalog, ProviderRequest,
    ProviderResult, ReadLimits, Redactor, TelemetryRecord, Usage,
};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::Input;
use airlock_core::fsproxy::PlantedBug;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The catalog the simulated session is priced with.
const CATALOG: &str = r#"{
  "m-small": {"input": 0.15, "cached": 0.075, "output": 0.6},
  "m-big": {"input": 2.5, "cached": 1.25, "output": 10.0},
  "m-free": {"input": 0, "cached": 0, "output": 0}
}"#;

/// The checker's own copy of the prices, in micro-USD per 1M tokens
/// (input, cached, output): one token at a price of `p` micro-USD per 1M
/// tokens costs exactly `p` pico-USD.
const PRICES: [(&str, u64, u64, u64); 3] =
    [("m-small", 150_000, 75_000, 600_000), ("m-big", 2_500_000, 1_250_000, 10_000_000), ("m-free", 0, 0, 0)];
const DEFAULT_MODEL: &str = "m-small";
const MODELS: [Option<&str>; 5] = [None, Some("m-small"), Some("m-big"), Some("m-free"), Some("m-unknown")];
/// The largest step of simulated time in this scenario, in µs.
pub(super) const MAX_STEP_US: u64 = 2_000;
/// How late an answer may be past its bound: timers fire at the first
/// step at or after their deadline.
const SLACK_US: u64 = 2 * MAX_STEP_US;

/// The simulated wall clock at simulated time zero (2026-01-01 UTC), for
/// `Retry-After` dates.
const SIM_EPOCH_SECS: u64 = 1_767_225_600;

/// The simulated provider's API key: the machine and the codec are handed
/// a redactor for it at run time; it is in no config and no trace.
pub const SIM_KEY: &str = "sk-sim-5ecret-K3y-0123456789";
/// The simulated shell's reply limits: small, so huge replies pass them.
const SIM_REPLY_LIMITS: ReadLimits = ReadLimits { max_values: 4_000, max_depth: 16 };

/// The redactor the world hands the machine and its provider codec (with
/// the planted bug, the old raw-only scrub).
pub(super) fn world_redactor(bug: Option<PlantedBug>) -> Redactor {
    let r = Redactor::with_secret(SIM_KEY).unwrap_or_default();
    if PlantedBug::scrubs_before_decode_only(bug) {
        r.planted_raw_only()
    } else {
        r
    }
}

/// The broker a broker world's machine runs: short timers, so timeouts
/// happen within a run; a budget from none to plenty, so the trim and the
/// clamp at zero are reached; queue bounds from tight to the defaults.
pub(super) fn setup(rng: &mut ChaCha8Rng, seed: u64) -> BrokerSetup {
    let mut config = BrokerConfig {
        queue_max_wait: Duration::from_millis(rng.gen_range(20..200)),
        request_timeout: Duration::from_millis(rng.gen_range(50..500)),
        default_model: DEFAULT_MODEL.into(),
        inject_remaining_context: rng.gen_bool(0.3),
        ..BrokerConfig::default()
    };
    const BUDGETS: [u64; 5] = [0, 1_000_000, 100_000_000, 10_000_000_000, 1_000_000_000_000];
    let initial_units = Money::from_pico(BUDGETS[rng.gen_range(0..BUDGETS.len())]);
    config.max_pending = [2, 4, 16, airlock_core::broker::DEFAULT_MAX_PENDING][rng.gen_range(0..4)];
    config.max_pending_bytes =
        [4 << 10, 16 << 10, 64 << 10, airlock_core::broker::DEFAULT_MAX_PENDING_BYTES][rng.gen_range(0..4)];
    config.enforce_budget = rng.gen_bool(0.5);
    // Back-offs of a few ms against timeouts of 50..500 ms: some retries
    // fit, some do not; retries off in some worlds. From a stream of their
    // own, so the world draws what it drew before retries were modelled
    // (and the worlds of kept traces are still the same worlds).
    let mut retry_rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5245_5452_5900_0000);
    config.max_retries = [0, 1, 3][retry_rng.gen_range(0..3)];
    config.retry_base = Duration::from_millis(retry_rng.gen_range(1..20));
    config.retry_after_max = config.retry_base * retry_rng.gen_range(1..=20);
    BrokerSetup {
        config,
        // The constant above is valid JSON; a test runs the scenario.
        catalog: PricingCatalog::from_json(CATALOG).unwrap_or_default(),
        initial_units,
        session_id: "sim".into(),
    }
}

fn prices(model: &str) -> Option<(u64, u64, u64)> {
    PRICES.iter().find(|p| p.0 == model).map(|p| (p.1, p.2, p.3))
}

/// The seed's `delta_units`, in pico-USD: uncached prompt tokens at the
/// input price, cached ones at the cached price, completion tokens at the
/// output price.
fn charge(model: &str, u: &Usage) -> Option<u64> {
    let (input, cached_price, output) = prices(model)?;
    let cached = u.cached_tokens.min(u.prompt_tokens);
    Some((u.prompt_tokens - cached) * input + cached * cached_price + u.completion_tokens * output)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BOp {
    /// `bytes`: the compact JSON of its messages, a lower bound of what
    /// the broker holds while it waits.
    Llm {
        known: bool,
        bytes: u64,
    },
    Cancel,
    Quota {
        known: bool,
    },
}

#[derive(Debug)]
struct BReq {
    op: BOp,
    /// Simulated time and clock jumps so far when its frame reached the
    /// machine.
    delivered: Option<(u64, u64)>,
    /// Admission number, for an `LLMCMD` the broker must queue.
    seq: Option<u64>,
    started: bool,
}

#[derive(Debug)]
struct Prov {
    model: String,
    /// When the provider reports; `None` while a hung call waits to be
    /// cancelled.
    due: Option<u64>,
    cancelled: bool,
    /// Reported: no longer in flight, though still known while the
    /// report is being handled.
    done: bool,
    result: ProviderResult,
    /// Its worst-case cost in pico-USD (enforce_budget worlds).
    worst: u64,
    /// What the provider bills for this attempt if it runs to its end:
    /// what it generated for a `2xx` answer (reported or not), what it
    /// reported for an error status (it refused the call otherwise).
    billable: Option<Usage>,
}

/// A started call, as the retry checkers follow it.
#[derive(Debug)]
struct Attempts {
    /// Attempts started.
    n: u32,
    /// Its provider deadline, in µs, fixed at its first start.
    deadline: u64,
    /// The request it answers.
    key: (usize, String),
}

#[derive(Debug, Default)]
pub(super) struct BrokerSim {
    qmw: u64,
    rt: u64,
    initial: u64,
    /// Sum of the recomputed charges (saturating).
    charged: u64,
    prov: BTreeMap<CallId, Prov>,
    reqs: BTreeMap<(usize, String), BReq>,
    /// Admitted calls that have neither started nor been answered.
    waiting: BTreeMap<u64, (usize, String)>,
    next_seq: u64,
    /// Simulated time skipped by clock jumps.
    pub jumped: u64,
    pub started: u64,
    max_pending: usize,
    max_pending_bytes: u64,
    enforce: bool,
    /// What the machine and the codec scrub with (planted bugs included).
    redactor: Redactor,
    /// The checker's own, always whole.
    oracle: Redactor,
    max_retries: u32,
    /// In µs.
    retry_base: u64,
    retry_cap: u64,
    /// Started calls not yet answered.
    attempts: BTreeMap<CallId, Attempts>,
    /// The call backing off, and the earliest its retry may start (µs).
    backoff: Option<(CallId, u64)>,
    /// What the simulated provider billed, in pico-USD, with this file's
    /// prices: every attempt's generation, cancelled and timed-out ones
    /// included (a provider bills what it generated before the request
    /// was dropped).
    billed: u64,
    /// `BudgetPassed` was said (advisory worlds).
    said_passed: bool,
    /// How much of a dropped call was generated: a stream of its own, so
    /// the worlds draw what they drew before billing was modelled.
    bill_rng: Option<ChaCha8Rng>,
}

impl BrokerSim {
    pub(super) fn new(setup: &BrokerSetup, bug: Option<PlantedBug>, seed: u64) -> Self {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        BrokerSim {
            qmw: micros(setup.config.queue_max_wait),
            rt: micros(setup.config.request_timeout),
            initial: setup.initial_units.as_pico(),
            max_pending: setup.config.max_pending,
            max_pending_bytes: setup.config.max_pending_bytes,
            enforce: setup.config.enforce_budget,
            redactor: world_redactor(bug),
            oracle: Redactor::with_secret(SIM_KEY).unwrap_or_default(),
            max_retries: setup.config.max_retries,
            retry_base: micros(setup.config.retry_base),
            retry_cap: micros(setup.config.retry_after_max),
            bill_rng: Some(ChaCha8Rng::seed_from_u64(seed ^ 0x4249_4c4c_0000_0000)),
            ..BrokerSim::default()
        }
    }

    /// The worst case of a call as sent, with this file's own prices: one
    /// token per prompt byte at the dearer input price, `max_tokens` at
    /// the output price.
    fn worst_case(request: &ProviderRequest) -> Option<u64> {
        let (input, cached, output) = prices(&request.model)?;
        Some(request.prompt_bytes() * input.max(cached) + u64::from(request.max_tokens) * output)
    }

    /// Worst cases of calls given up on whose usage has not come in.
    fn reserved(&self) -> u64 {
        self.prov.values().filter(|p| p.cancelled && !p.done).map(|p| p.worst).sum()
    }

    fn expected_remaining(&self) -> u64 {
        self.initial.saturating_sub(self.charged)
    }

    /// Nothing running at the provider.
    pub(super) fn provider_idle(&self) -> bool {
        self.prov.is_empty()
    }

    /// Provider calls the shell holds a connection for: started, neither
    /// reported nor given up on.
    pub(super) fn connections_held(&self) -> u64 {
        self.prov.values().filter(|p| !p.cancelled && !p.done).count() as u64
    }

    fn next_due(&self) -> Option<u64> {
        self.prov.values().filter_map(|p| p.due).min()
    }
}

/// The request id an `LLMCMD` carries in its last message, so the checker
/// can tell which request a provider call is for.
fn marker(request: &ProviderRequest) -> Option<String> {
    let messages = request.messages.to_value();
    messages.as_array()?.last()?.get("content")?.as_str().map(str::to_owned)
}

impl World {
    fn bsim(&mut self) -> &mut BrokerSim {
        self.broker.get_or_insert_with(BrokerSim::default)
    }

    /// Feed what is due: provider results, then the machine's timer.
    pub(super) fn broker_due(&mut self) {
        let Some(b) = &self.broker else { return };
        let now = self.now;
        let due: Vec<CallId> =
            b.prov.iter().filter(|(_, p)| p.due.is_some_and(|d| d <= now)).map(|(c, _)| *c).collect();
        for call in due {
            // Removed only once fed: a timer due at the same moment fires
            // first inside the machine and may cancel the call meanwhile.
            let Some(p) = self.bsim().prov.get_mut(&call) else { continue };
            p.done = true;
            p.due = None;
            // A dropped request was billed when it was dropped.
            let bill = if p.cancelled { None } else { p.billable };
            let (model, result) = (p.model.clone(), p.result.clone());
            let usage = result.usage();
            for (what, u) in [("charged", usage), ("billed", bill)] {
                let Some(u) = u else { continue };
                match charge(&model, &u) {
                    Some(delta) => {
                        let b = self.bsim();
                        let sum = if what == "charged" { &mut b.charged } else { &mut b.billed };
                        *sum = sum.saturating_add(delta);
                    }
                    None => {
                        let v = violation("quota", format!("{call} ran unpriced model {model:?}"));
                        self.first_violation.get_or_insert(v);
                    }
                }
            }
            self.feed(0, Input::ProviderDone { call, result });
            self.bsim().prov.remove(&call);
        }
        if self.levels[0].m.poll_timeout().is_some_and(|t| t.as_micros() <= self.now) {
            self.feed(0, Input::Tick);
        }
    }

    /// When something will next happen by itself (a provider result or a
    /// timer), for a world with nothing else to do.
    pub(super) fn broker_next_event(&self) -> Option<u64> {
        let b = self.broker.as_ref()?;
        let timer = self.levels[0].m.poll_timeout().map(|t| t.as_micros());
        [b.next_due(), timer].into_iter().flatten().min()
    }

    /// Frames of client `i` that have fully reached the machine (after a
    /// delivery, before it is fed): their clocks start, and `LLMCMD`s that
    /// the broker must queue get their admission numbers, in arrival order.
    pub(super) fn mark_delivered(&mut self, i: usize) {
        let Some(b) = self.broker.as_mut() else { return };
        let c = &mut self.clients[i];
        while let Some((end, id)) = c.bpending.front() {
            if *end > c.out.taken {
                break;
            }
            let key = (i, id.clone());
            c.bpending.pop_front();
            if let Some(r) = b.reqs.get_mut(&key) {
                r.delivered = Some((self.now, b.jumped));
                if matches!(r.op, BOp::Llm { known: true, .. }) {
                    r.seq = Some(b.next_seq);
                    b.waiting.insert(b.next_seq, key);
                    b.next_seq += 1;
                }
            }
        }
    }

    /// Client `i` is gone: nothing it asked may start from now on, nor be
    /// answered.
    pub(super) fn broker_depart(&mut self, i: usize) {
        let Some(b) = self.broker.as_mut() else { return };
        b.reqs.retain(|(c, _), _| *c != i);
        b.waiting.retain(|_, (c, _)| *c != i);
        b.attempts.retain(|_, a| a.key.0 != i);
        // The machine drops a departed client's call that backs off.
        if b.backoff.is_some_and(|(call, _)| !b.attempts.contains_key(&call)) {
            b.backoff = None;
        }
        self.clients[i].bpending.clear();
    }

    /// Pick client `i`'s next request: a broker op or a file op on its own
    /// virtual file (which never waits on an effect, so broker ops are
    /// served the moment they arrive).
    pub(super) fn broker_issue(&mut self, i: usize) {
        let c = &mut self.clients[i];
        let roll = c.rng.gen_range(0..100);
        match roll {
            0..45 => issue_llm(c),
            45..58 => {
                let token = pick_cancel_token(c);
                issue_cancel(c, token);
            }
            58..68 => {
                let model = MODELS[c.rng.gen_range(0..MODELS.len())];
                let id = next_id(c);
                let params = match model {
                    Some(m) => json!({ "model": m }),
                    None => json!({}),
                };
                let known = model.is_none_or(|m| prices(m).is_some());
                send(c, id.clone(), req(&id, "QUOTA", params), Kind::Broker(BOp::Quota { known }), None);
                track(c, id);
            }
            _ => issue_file_op(c),
        }
        self.register_broker_requests(i);
    }

    /// Requests just sent by client `i` that the broker checkers follow.
    fn register_broker_requests(&mut self, i: usize) {
        let c = &mut self.clients[i];
        let fresh: Vec<(String, BOp)> = std::mem::take(&mut c.bnew);
        let b = self.bsim();
        for (id, op) in fresh {
            b.reqs.insert((i, id), BReq { op, delivered: None, seq: None, started: false });
        }
    }

    /// A burst of CANCELs from one client, for its live tokens and some
    /// that never existed.
    pub(super) fn cancel_storm(&mut self) {
        let live: Vec<usize> = (0..self.clients.len()).filter(|&i| !self.clients[i].gone).collect();
        if live.is_empty() {
            return;
        }
        self.count(FaultKind::CancelStorm);
        let i = live[self.rng.gen_range(0..live.len())];
        let n = self.rng.gen_range(1..=6);
        let c = &mut self.clients[i];
        for _ in 0..n {
            let token = pick_cancel_token(c);
            issue_cancel(c, token);
        }
        self.register_broker_requests(i);
    }

    pub(super) fn on_start_provider(
        &mut self,
        call: CallId,
        request: ProviderRequest,
        deadline: u64,
    ) -> Check {
        let now = self.now;
        let hang = self.fires(FaultKind::ProviderHang);
        let error = self.fires(FaultKind::ProviderError);
        let malformed = self.fires(FaultKind::ProviderMalformed);
        let retryable = self.fires(FaultKind::ProviderRetryable);
        let Some(b) = self.broker.as_mut() else {
            return Err(violation("policy", format!("{call} started without a broker")));
        };
        b.started += 1;
        if let Some((running, _)) = b.prov.iter().find(|(_, p)| !p.cancelled && !p.done) {
            return Err(violation("one_call_in_flight", format!("{call} started while {running} runs")));
        }
        if b.prov.contains_key(&call) {
            return Err(violation("one_call_in_flight", format!("{call} started twice")));
        }
        if let Some((other, _)) = b.backoff.filter(|(c, _)| *c != call) {
            return Err(violation(
                "lock_held",
                format!("{call} started while {other} backs off holding the lock"),
            ));
        }
        let id = marker(&request).unwrap_or_default();
        if let Some(a) = b.attempts.get_mut(&call) {
            // A retry.
            let Some((_, earliest)) = b.backoff.take() else {
                return Err(violation(
                    "retry",
                    format!("{call} started again, yet no back-off was announced"),
                ));
            };
            if now < earliest {
                return Err(violation(
                    "retry",
                    format!("{call} retried at {now} µs, its back-off ends at {earliest}"),
                ));
            }
            if now >= a.deadline || deadline != a.deadline {
                return Err(violation(
                    "retry_deadline",
                    format!(
                        "{call} attempt at {now} µs with deadline {deadline}, the call's is {}",
                        a.deadline
                    ),
                ));
            }
            a.n += 1;
            if a.n > 1 + b.max_retries {
                return Err(violation(
                    "retry_count",
                    format!("{call}: attempt {} with max_retries {}", a.n, b.max_retries),
                ));
            }
            if a.key.1 != id || !b.reqs.contains_key(&a.key) {
                return Err(violation(
                    "never_starts",
                    format!("{call} retried for {id:?}, answered or gone"),
                ));
            }
        } else {
            b.first_start(call, &id, now, deadline)?;
        }
        let worst = BrokerSim::worst_case(&request).unwrap_or(0);
        if b.enforce {
            let available = b.expected_remaining().saturating_sub(b.reserved());
            if worst > available {
                return Err(violation(
                    "budget",
                    format!(
                        "{call} for {id} started with enforce_budget: worst case {worst} pico-USD, \
                         {available} available"
                    ),
                ));
            }
        }
        self.provider_answer(call, request, hang, (error, malformed, retryable), worst, &id)
    }
}

impl BrokerSim {
    /// The machine charged `call` its reserve: add this checker's own worst
    /// case of the call, once it has checked that the usage is unknown
    /// (none reported, and no error status, with which the provider
    /// refuses and bills nothing it does not report) under
    /// `enforce_budget`. Whether a reserve is charged where it must be is
    /// what invariant 15 (`budget_bound`) holds the machine to.
    fn charge_reserve(&mut self, call: CallId, record: &TelemetryRecord) -> Check {
        let Some(p) = self.prov.get(&call).filter(|p| p.done) else {
            return Err(violation("quota", format!("{call} charged its reserve with no result: {record:?}")));
        };
        let refused =
            matches!(&p.result, ProviderResult::Err { status: Some(s), .. } if !(200..300).contains(s));
        if !self.enforce || refused || p.result.usage().is_some() || record.charged.as_pico() != p.worst {
            return Err(violation(
                "quota",
                format!(
                    "{call} charged a reserve of {} (worst case {}; enforce {}; result {:?})",
                    record.charged.as_pico(),
                    p.worst,
                    self.enforce,
                    p.result
                ),
            ));
        }
        self.charged = self.charged.saturating_add(p.worst);
        Ok(())
    }

    /// The checks of a call's first start: asked, admitted, in FIFO order.
    fn first_start(&mut self, call: CallId, id: &str, now: u64, deadline: u64) -> Check {
        let b = self;
        if deadline != now + b.rt {
            return Err(violation("liveness", format!("{call} deadline {deadline}, want {}", now + b.rt)));
        }
        let key = b.reqs.keys().find(|(_, rid)| *rid == id).cloned();
        let Some(key) = key else {
            return Err(violation(
                "never_starts",
                format!("{call} started for {id:?}: answered, its client gone, or never asked"),
            ));
        };
        let Some(seq) = b.reqs.get(&key).and_then(|r| r.seq) else {
            return Err(violation(
                "never_starts",
                format!("{call} started for {id}, which was never admitted"),
            ));
        };
        let head = b.waiting.first_key_value().map(|(s, k)| (*s, k.1.clone()));
        if head.as_ref().map(|h| h.0) != Some(seq) {
            return Err(violation(
                "fifo",
                format!("{call} for {id} (admitted {seq}) started before {head:?}"),
            ));
        }
        b.waiting.remove(&seq);
        if let Some(r) = b.reqs.get_mut(&key) {
            r.started = true;
        }
        b.attempts.insert(call, Attempts { n: 1, deadline, key });
        Ok(())
    }
}

impl World {
    /// What the simulated provider will answer attempt `call`, and when.
    fn provider_answer(
        &mut self,
        call: CallId,
        request: ProviderRequest,
        hang: bool,
        (error, malformed, retryable): (bool, bool, bool),
        worst: u64,
        id: &str,
    ) -> Check {
        let now = self.now;
        if hang {
            *self.faults.entry(FaultKind::ProviderHang).or_default() += 1;
        }
        let latency = self.rng.gen_range(0..=b_rt(&self.broker) * 13 / 10);
        let usage = self.draw_usage(request.max_tokens, request.prompt_bytes());
        let leak = self.fires(FaultKind::ProviderLeak);
        let huge = self.fires(FaultKind::ProviderHuge);
        let mut retry_after = None;
        let (status, body) = if malformed {
            *self.faults.entry(FaultKind::ProviderMalformed).or_default() += 1;
            (200, "{\"choices\": [malformed provider reply".to_string())
        } else if retryable {
            self.count(FaultKind::ProviderRetryable);
            let status = [429, 503, 500, 502][self.rng.gen_range(0..4)];
            let wall =
                std::time::UNIX_EPOCH + Duration::from_secs(SIM_EPOCH_SECS) + Duration::from_micros(now);
            let header = match self.rng.gen_range(0..10) {
                0 | 1 => None,
                2 => Some("0".to_owned()),
                3 => Some("1".to_owned()),
                4 => Some("99999999999999999999999".to_owned()),
                5 => Some("-1".to_owned()),
                6 => Some("soon".to_owned()),
                7 => Some("0.5".to_owned()),
                8 => Some(httpdate::fmt_http_date(wall + Duration::from_secs(1))),
                _ => Some(httpdate::fmt_http_date(wall - Duration::from_secs(5))),
            };
            retry_after = header.and_then(|h| retry_after_ms(&h, wall));
            let mut body =
                json!({ "error": { "message": format!("HTTP {status} from provider"), "type": "busy" } });
            if self.rng.gen_bool(0.3) {
                body["usage"] = usage_json(&usage);
            }
            (status, body.to_string())
        } else if error {
            *self.faults.entry(FaultKind::ProviderError).or_default() += 1;
            let usage = if self.rng.gen_bool(0.5) { Some(usage) } else { None };
            let mut body =
                json!({ "error": { "message": "HTTP 500 from provider", "type": "server_error" } });
            if let Some(u) = usage {
                body["usage"] = usage_json(&u);
            }
            (500, body.to_string())
        } else {
            let usage = if self.rng.gen_bool(0.95) { Some(usage) } else { None };
            let message = json!({ "role": "assistant", "content": format!("re {id}") });
            let mut body = json!({ "model": request.model, "choices": [{ "index": 0, "message": message }] });
            if let Some(u) = usage {
                body["usage"] = usage_json(&u);
            }
            (200, body.to_string())
        };
        let (status, body) = if huge {
            self.count(FaultKind::ProviderHuge);
            let n = self.rng.gen_range(100..8_000);
            // An honest provider still: it reports what it bills.
            (200, huge_reply(n, &request.model, leak, &usage_json(&usage)))
        } else if leak {
            self.count(FaultKind::ProviderLeak);
            let how = self.rng.gen_range(0..LEAKS);
            leaky_reply(how, status, &body, &mut self.rng)
        } else {
            (status, body)
        };
        let redactor = self.broker.as_ref().map(|b| b.redactor.clone()).unwrap_or_default();
        let result =
            parse_response_with(status, body.as_bytes(), &request.model, &redactor, SIM_REPLY_LIMITS)
                .with_retry_after(retry_after);
        let due = if hang { None } else { Some(now + latency) };
        // What the provider bills if the attempt runs to its end: what it
        // generated for a `2xx` answer, reported or not; for an error
        // status it refused the call and bills what it reported, if any.
        let billable = if (200..300).contains(&status) { Some(usage) } else { result.usage() };
        let p = Prov { model: request.model, due, cancelled: false, done: false, result, worst, billable };
        self.bsim().prov.insert(call, p);
        Ok(())
    }

    /// Usage as a provider reports it. With `enforce_budget`, within what
    /// the call was sent with (`prompt_bytes` prompt tokens at most), the
    /// honest provider the budget promise is about.
    fn draw_usage(&mut self, max_tokens: u32, prompt_bytes: u64) -> Usage {
        let enforce = self.broker.as_ref().is_some_and(|b| b.enforce);
        let top = if enforce { prompt_bytes.clamp(1, 5_000) } else { 5_000 };
        let prompt = self.rng.gen_range(1..=top);
        let cached = if self.rng.gen_bool(0.5) { self.rng.gen_range(0..=prompt) } else { 0 };
        let completion = self.rng.gen_range(0..=u64::from(max_tokens));
        Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }

    /// A telemetry record: one announcing a retry must follow a `429` or
    /// `5xx` of the attempt in flight, with another attempt allowed, and a
    /// back-off within the configured bounds that ends before the deadline.
    pub(super) fn on_broker_telemetry(&mut self, record: &TelemetryRecord) -> Check {
        let now = self.now;
        let Some(b) = self.broker.as_mut() else { return Ok(()) };
        let call = record.call;
        if record.reserve_charged {
            b.charge_reserve(call, record)?;
        }
        let Some(delay_ms) = record.retry_delay_ms else {
            // A call's last record: it is over.
            if b.backoff.is_some_and(|(c, _)| c == call) {
                b.backoff = None;
            }
            if !record.late_usage && !record.dropped_usage_unknown {
                b.attempts.remove(&call);
            }
            return Ok(());
        };
        let bad = |what: String| Err(violation("retry", format!("{call}: {what}: {record:?}")));
        let status = match b.prov.get(&call) {
            Some(Prov { result: ProviderResult::Err { status: Some(s), .. }, cancelled: false, .. }) => *s,
            _ => return bad("a retry announced for an attempt that did not fail with a status".into()),
        };
        if !retryable_status(status) || record.http_status != Some(status) {
            return bad(format!("a retry after HTTP {status}"));
        }
        let Some(a) = b.attempts.get(&call) else { return bad("a retry of a call never started".into()) };
        if a.n > b.max_retries || record.attempt != Some(a.n) {
            return Err(violation(
                "retry_count",
                format!("{call}: retry after attempt {} with max_retries {}: {record:?}", a.n, b.max_retries),
            ));
        }
        let delay = delay_ms.saturating_mul(1_000);
        let floor = b.retry_base.saturating_mul(1 << (a.n - 1).min(20)).min(b.retry_cap);
        // The record's ms are rounded down.
        if delay > b.retry_cap || delay + 1_000 <= floor {
            return bad(format!("a back-off of {delay_ms} ms, want {floor} µs to {} µs", b.retry_cap));
        }
        if now + delay >= a.deadline {
            return Err(violation(
                "retry_deadline",
                format!("{call}: back-off to {} µs, deadline {}", now + delay, a.deadline),
            ));
        }
        b.backoff = Some((call, now + delay));
        Ok(())
    }

    /// The machine says the advisory budget was passed: once, never under
    /// `enforce_budget`, with the charges this checker recomputed.
    pub(super) fn on_budget_passed(&mut self, initial: Money, charged: Money) -> Check {
        let Some(b) = self.broker.as_mut() else {
            return Err(violation("policy", "budget passed without a broker".into()));
        };
        if b.said_passed || b.enforce || initial.as_pico() != b.initial || charged.as_pico() != b.charged {
            return Err(violation(
                "budget_said",
                format!(
                    "BudgetPassed {initial}, {charged}: said before: {}, enforce: {}, checker: {} of {}",
                    b.said_passed, b.enforce, b.charged, b.initial
                ),
            ));
        }
        b.said_passed = true;
        Ok(())
    }

    pub(super) fn on_cancel_provider(&mut self, call: CallId) -> Check {
        let now = self.now;
        let delay = self.rng.gen_range(0..3_000);
        let partial = self.rng.gen_bool(0.5);
        let Some(b) = self.broker.as_mut() else {
            return Err(violation("one_call_in_flight", format!("cancel of {call}, which is not in flight")));
        };
        let share = b.bill_rng.as_mut().map_or(0, |r| r.gen_range(0..=100u64));
        let Some(p) = b.prov.get_mut(&call) else {
            return Err(violation("one_call_in_flight", format!("cancel of {call}, which is not in flight")));
        };
        if p.cancelled || p.done {
            // A timer due with the report fires first in the machine: it
            // gives up on the call before reading the report. Nothing to
            // drop any more.
            if p.done && !p.cancelled {
                p.cancelled = true;
                return Ok(());
            }
            return Err(violation("one_call_in_flight", format!("{call} cancelled twice")));
        }
        p.cancelled = true;
        // The provider bills what it generated until the request was
        // dropped: the prompt, and some of the completion. A dropped
        // request ends soon, reporting that usage or none.
        let generated = p.billable.map(|u| {
            let completion = u.completion_tokens * share / 100;
            Usage { completion_tokens: completion, total_tokens: u.prompt_tokens + completion, ..u }
        });
        p.result = ProviderResult::error(generated.filter(|_| partial), "request dropped");
        p.due = Some(p.due.map_or(now + delay, |d| d.min(now + delay)));
        let bill = generated.and_then(|u| charge(&p.model, &u)).unwrap_or(0);
        b.billed = b.billed.saturating_add(bill);
        Ok(())
    }

    /// A response to a broker op of client `i`.
    pub(super) fn on_broker_response(&mut self, i: usize, id: &str, op: BOp, v: &Value) -> Check {
        let ok = v.get("ok").and_then(Value::as_bool).unwrap_or(false);
        let code = v.pointer("/error/code").and_then(Value::as_str).unwrap_or("");
        let expected = self.broker.as_ref().map(BrokerSim::expected_remaining);
        let Some(b) = self.broker.as_mut() else { return Ok(()) };
        let Some(r) = b.reqs.remove(&(i, id.to_owned())) else {
            return Err(violation("one_response_per_request", format!("broker answer to unknown {id}: {v}")));
        };
        if let Some(seq) = r.seq {
            b.waiting.remove(&seq);
        }
        // Answered: a call backing off is over, and never starts again.
        let key = (i, id.to_owned());
        if b.backoff.is_some_and(|(c, _)| b.attempts.get(&c).is_some_and(|a| a.key == key)) {
            b.backoff = None;
        }
        b.attempts.retain(|_, a| a.key != key);
        if r.delivered.is_none() {
            return Err(violation(
                "one_response_per_request",
                format!("{id} answered before it arrived: {v}"),
            ));
        }
        let mut seen = Vec::new();
        strings(v, &mut seen);
        if seen.iter().any(|s| b.oracle.reveals(s)) {
            return Err(violation("secret_leaked", format!("{id}: the API key is in a decoded string")));
        }
        let enforce = b.enforce;
        let bad = |what: String| Err(violation("broker_answer", format!("{id}: {what}: {v}")));
        let brief = || {
            let mut s = v.to_string();
            s.truncate(300);
            s
        };
        match op {
            BOp::Llm { known: false, .. } => {
                // A flood may fill the queue before the model is looked at.
                if code != "E_ARG" && code != "queue_full" {
                    return bad("an unknown model must be E_ARG".into());
                }
            }
            BOp::Llm { known: true, .. } => match (ok, code) {
                (true, _) if !r.started => return bad("succeeded without a provider call".into()),
                (true, _) => {
                    let Some(messages) = v.pointer("/result/messages") else {
                        return bad("result without messages".into());
                    };
                    if !messages.is_array() {
                        return bad("result without messages".into());
                    }
                    if count_values(messages) > SIM_REPLY_LIMITS.max_values + 1 {
                        return Err(violation(
                            "bounded_resources",
                            format!(
                                "{id}: a reply of more than {} values reached a child: {}",
                                SIM_REPLY_LIMITS.max_values,
                                brief()
                            ),
                        ));
                    }
                }
                (false, "queue_full") if r.started => return bad("queue_full, yet it started".into()),
                (false, "queue_full") => {}
                (false, "budget_exhausted") if r.started => {
                    return bad("budget_exhausted, yet it started".into())
                }
                (false, "budget_exhausted") if !enforce => {
                    return bad("a preflight denial without enforce_budget".into())
                }
                (false, "budget_exhausted") => {}
                (false, "queue_timeout" | "cancelled_before_start") if r.started => {
                    return bad("answered as never started, yet it started".into())
                }
                (false, "queue_timeout" | "cancelled_before_start") => {}
                (false, "provider_timeout" | "provider_error" | "cancelled_after_start") if !r.started => {
                    return bad("a provider failure for a call that never started".into())
                }
                (false, "provider_timeout" | "provider_error" | "cancelled_after_start") => {}
                _ => return bad("unexpected failure".into()),
            },
            BOp::Quota { known } => {
                if ok != known {
                    return bad(format!("QUOTA of a {} model", if known { "known" } else { "unknown" }));
                }
                if ok {
                    let got = v.pointer("/result/remaining_units").and_then(Value::as_f64);
                    let want = expected.unwrap_or(0) as f64 / 1e12;
                    if !got.is_some_and(|g| (g - want).abs() <= want.abs() * 1e-12 + 1e-15) {
                        return bad(format!("remaining_units {got:?}, recomputed {want}"));
                    }
                }
            }
            BOp::Cancel => {
                let state = v.pointer("/result/state").and_then(Value::as_str);
                if !ok || !matches!(state, Some("before_start" | "after_start" | "not_found")) {
                    return bad("CANCEL must succeed with a state".into());
                }
            }
        }
        Ok(())
    }

    /// The checks that run after every step.
    pub(super) fn broker_check(&self) -> Check {
        let Some(b) = &self.broker else { return Ok(()) };
        let m = &self.levels[0].m;
        // Bounded queue: by the machine's own count, and by this checker's
        // lower bound of what the waiting calls hold.
        let (held_n, held_bytes) = m.broker().map_or((0, 0), |x| (x.queued(), x.pending_bytes()));
        let mine: u64 = b
            .waiting
            .values()
            .filter_map(|k| match b.reqs.get(k).map(|r| r.op) {
                Some(BOp::Llm { bytes, .. }) => Some(bytes),
                _ => None,
            })
            .sum();
        if held_n > b.max_pending || b.waiting.len() > b.max_pending {
            return Err(violation(
                "bounded_resources",
                format!(
                    "{held_n} calls wait ({} by the checker), max_pending {}",
                    b.waiting.len(),
                    b.max_pending
                ),
            ));
        }
        if held_bytes > b.max_pending_bytes || mine > b.max_pending_bytes {
            return Err(violation(
                "bounded_resources",
                format!(
                    "waiting calls hold {held_bytes} bytes (at least {mine} by the checker), max_pending_bytes {}",
                    b.max_pending_bytes
                ),
            ));
        }
        if b.enforce && b.charged > b.initial {
            return Err(violation(
                "budget",
                format!("enforce_budget, honest usage, yet {} pico-USD charged of {}", b.charged, b.initial),
            ));
        }
        // Invariant 15: what the provider billed, cancelled and timed-out
        // calls included, stays within an enforced budget.
        if b.enforce && b.billed > b.initial {
            return Err(violation(
                "budget_bound",
                format!(
                    "enforce_budget, yet the provider billed {} pico-USD of a budget of {} ({} charged)",
                    b.billed, b.initial, b.charged
                ),
            ));
        }
        // Advisory mode says, once, when the charges pass the budget.
        if !b.enforce && b.said_passed != (b.charged > b.initial) {
            return Err(violation(
                "budget_said",
                format!(
                    "{} pico-USD charged of {}, yet the passing was{} said",
                    b.charged,
                    b.initial,
                    if b.said_passed { "" } else { " not" }
                ),
            ));
        }
        let remaining = m.broker().map(|x| x.remaining().as_pico());
        if remaining != Some(b.expected_remaining()) {
            return Err(violation(
                "quota",
                format!(
                    "broker holds {remaining:?} pico-USD; initial {} minus recomputed charges {} is {}",
                    b.initial,
                    b.charged,
                    b.expected_remaining()
                ),
            ));
        }
        let bound = b.qmw + b.rt + SLACK_US;
        for ((i, id), r) in &b.reqs {
            if let Some((t, jumped)) = r.delivered {
                let waited = (self.now - t).saturating_sub(b.jumped - jumped);
                if waited > bound {
                    return Err(at(
                        violation(
                            "liveness",
                            format!("{id} ({:?}) unanswered after {waited} µs (bound {bound})", r.op),
                        ),
                        0,
                        self.clients[*i].id,
                    ));
                }
            }
        }
        Ok(())
    }

    /// At the end of the run: nothing left with the broker.
    pub(super) fn broker_final_check(&self) -> Check {
        let Some(b) = &self.broker else { return Ok(()) };
        let idle = self.levels[0].m.broker().is_some_and(|x| x.is_idle());
        if !idle || !b.prov.is_empty() || self.levels[0].m.broker_requests_pending() != 0 {
            return Err(violation("liveness", "broker work left at the end of the run".into()));
        }
        Ok(())
    }
}

fn b_rt(b: &Option<BrokerSim>) -> u64 {
    b.as_ref().map_or(0, |b| b.rt)
}

/// Note request `id` (just sent) for the broker checkers.
fn track(c: &mut Client, id: String) {
    if let Some(Kind::Broker(op)) = c.order.get(&id).map(|s| s.kind.clone()) {
        c.bpending.push_back((c.out.pushed, id.clone()));
        c.bnew.push((id, op));
    }
}

fn issue_llm(c: &mut Client) {
    issue_llm_padded(c, 0);
}

/// An `LLMCMD` whose last message carries its id (the checkers' marker),
/// after a message of `pad` bytes when `pad > 0`.
fn issue_llm_padded(c: &mut Client, pad: usize) {
    let id = next_id(c);
    let model = MODELS[c.rng.gen_range(0..MODELS.len())];
    let known = model.is_none_or(|m| prices(m).is_some());
    let mut params = json!({ "messages": [{ "role": "user", "content": id.clone() }] });
    if pad > 0 {
        params["messages"] = json!([{ "role": "user", "content": "p".repeat(pad) }, { "role": "user", "content": id.clone() }]);
    }
    let bytes = json_len(&params["messages"]);
    if let Some(m) = model {
        params["model"] = m.into();
    }
    if c.rng.gen_bool(0.7) {
        params["max_tokens"] = c.rng.gen_range(1..=8_000u32).into();
    }
    if c.rng.gen_bool(0.5) {
        params["temperature"] = json!(0.5);
    }
    let live = live_tokens(c);
    let token = match c.rng.gen_range(0..10) {
        0..6 => {
            c.next_token += 1;
            Some(format!("k{}", c.next_token))
        }
        // A token of a call already answered is free again.
        6 => c.tokens_used.iter().find(|t| !live.contains(t)).cloned(),
        _ => None,
    };
    if let Some(t) = &token {
        params["cancel_token"] = t.clone().into();
        c.tokens_used.push(t.clone());
        if c.tokens_used.len() > 16 {
            c.tokens_used.remove(0);
        }
    }
    send(c, id.clone(), req(&id, "LLMCMD", params), Kind::Broker(BOp::Llm { known, bytes }), None);
    c.llm_tokens.insert(id.clone(), token);
    track(c, id);
}

/// The length of `v`'s compact text (what `v.to_string()` gives), counted
/// as it is written rather than kept: a flood's messages run to kilobytes.
fn json_len(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

/// Tokens of this client's `LLMCMD`s not yet answered.
fn live_tokens(c: &Client) -> Vec<String> {
    c.llm_tokens.values().flatten().cloned().collect()
}

fn pick_cancel_token(c: &mut Client) -> String {
    let live = live_tokens(c);
    if !live.is_empty() && c.rng.gen_bool(0.7) {
        live[c.rng.gen_range(0..live.len())].clone()
    } else {
        format!("nope{}", c.rng.gen_range(0..5))
    }
}

fn issue_cancel(c: &mut Client, token: String) {
    let id = next_id(c);
    send(
        c,
        id.clone(),
        req(&id, "CANCEL", json!({ "cancel_token": token })),
        Kind::Broker(BOp::Cancel),
        None,
    );
    track(c, id);
}

/// A file op on the client's own virtual file, modelled by the generic
/// checkers.
fn issue_file_op(c: &mut Client) {
    let key = format!("v/c{}.txt", c.idx);
    let usable = c.handles.usable();
    let id = next_id(c);
    if usable.is_empty() || usable.len() < 3 && c.rng.gen_bool(0.2) {
        let mode = [Mode::Write, Mode::Append, Mode::ReadWrite, Mode::Read][c.rng.gen_range(0..4)];
        let payload = request::open(&id, &key, mode.as_str());
        send(c, id, payload, Kind::Open { key: Some(key), mode, host: false }, None);
        return;
    }
    let h = usable[c.rng.gen_range(0..usable.len())];
    let mode = c.handles[&h].mode;
    if c.rng.gen_bool(0.2) {
        c.handles.set_closing(&h, true);
        send(c, id.clone(), request::close(&id, h), Kind::Close { h }, None);
    } else if mode.writable() && (!mode.readable() || c.rng.gen_bool(0.5)) {
        let data = super::draw::bytes(&mut c.rng, 0..64);
        let payload = request::write(&id, h, &data, None);
        send(c, id, payload, Kind::Write { h, data }, None);
    } else {
        let max = c.rng.gen_range(1..256);
        send(c, id.clone(), request::read(&id, h, max), Kind::Read { h, max }, None);
    }
}

/// A usage object as an OpenAI-compatible provider reports it.
fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

/// The key as the text of a JSON string literal, in one of the shapes a
/// JSON reader decodes back to the key: verbatim, every character
/// `\u`-escaped, split by an escape, or escaped twice (what a string
/// holding JSON holds, decoding to the key only on the second read).
fn encoded_key(how: u32) -> String {
    let esc = |c: char| format!("\\u{:04x}", c as u32);
    match how % 4 {
        0 => SIM_KEY.to_owned(),
        1 => SIM_KEY.chars().map(esc).collect(),
        2 => SIM_KEY.chars().enumerate().map(|(i, c)| if i == 9 { esc(c) } else { c.to_string() }).collect(),
        _ => SIM_KEY.chars().map(|c| format!("\\\\u{:04x}", c as u32)).collect(),
    }
}

/// Ways the lying provider leaks the key.
const LEAKS: u32 = 8;

/// A reply carrying the key: in the content, an object key, a tool call's
/// arguments, the model name, an error message (JSON or plain text), or a
/// usage field whose error message quotes it. Returns status and body.
fn leaky_reply(how: u32, status: u16, body: &str, rng: &mut ChaCha8Rng) -> (u16, String) {
    let enc = encoded_key(rng.gen_range(0..4));
    let content = |extra: &str| {
        format!(
            r#"{{"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"leak {enc} here"{extra}}}}}]}}"#
        )
    };
    match how {
        0 => (200, content("")),
        1 => (200, content(&format!(r#","meta":{{"{enc}":true}}"#))),
        2 => {
            // The arguments string holds JSON, so its key is escaped once
            // more: `\"` around it, and a `\u` escape becomes `\\u`.
            let inner = enc.replace('\\', "\\\\");
            let args = format!(r#"{{\"token\":\"{inner}\"}}"#);
            (
                200,
                content(&format!(
                    r#","tool_calls":[{{"id":"t1","type":"function","function":{{"name":"f","arguments":"{args}"}}}}]"#
                )),
            )
        }
        3 => (
            200,
            format!(r#"{{"model":"{enc}","choices":[{{"message":{{"role":"assistant","content":"x"}}}}]}}"#),
        ),
        4 => (401, format!(r#"{{"error":{{"message":"Incorrect API key provided: {enc}","type":"auth"}}}}"#)),
        5 => (401, format!("invalid api key {SIM_KEY}; body was {}", &body[..body.len().min(40)])),
        6 => (
            200,
            format!(
                r#"{{"choices":[{{"message":{{"role":"assistant"}}}}],"usage":{{"prompt_tokens":"{enc}"}}}}"#
            ),
        ),
        _ => (status, body.replacen("from provider", &format!("from provider ({enc})"), 1)),
    }
}

/// A reply of `n` small values (a content array), with the key at its end
/// when `leak`.
fn huge_reply(n: usize, model: &str, leak: bool, usage: &Value) -> String {
    let mut values = String::with_capacity(n * 3);
    for i in 0..n {
        values.push_str(&(i % 10).to_string());
        values.push(',');
    }
    let tail = if leak { format!("\"{}\"", encoded_key(n as u32)) } else { "0".into() };
    format!(
        r#"{{"model":"{model}","choices":[{{"message":{{"role":"assistant","content":[{values}{tail}]}}}}],"usage":{usage}}}"#
    )
}

/// Every string in `v`, keys included.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                strings(x, out);
            }
        }
        _ => {}
    }
}

fn count_values(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(count_values).sum::<usize>(),
        Value::Object(m) => 1 + m.iter().map(|(_, x)| 1 + count_values(x)).sum::<usize>(),
        _ => 1,
    }
}

impl World {
    /// Bytes about to reach a child: the key must not be in them, as
    /// written or in any escaped form.
    pub(super) fn broker_check_sent(&self, data: &[u8]) -> Check {
        let Some(b) = &self.broker else { return Ok(()) };
        if b.oracle.reveals(&String::from_utf8_lossy(data)) {
            return Err(violation("secret_leaked", "the API key is in bytes sent to a child".into()));
        }
        Ok(())
    }

    /// A flood of `LLMCMD`s from one client, some of them big, to fill
    /// the queue past its count and its bytes.
    pub(super) fn queue_flood(&mut self) {
        let live: Vec<usize> = (0..self.clients.len()).filter(|&i| !self.clients[i].gone).collect();
        if live.is_empty() {
            return;
        }
        self.count(FaultKind::QueueFlood);
        let i = live[self.rng.gen_range(0..live.len())];
        let n = self.rng.gen_range(4..=24);
        // Big, but within a frame, so the flood is refused by the broker
        // and not by the frame decoder.
        let most = self.swarm.max_frame.saturating_sub(1024).clamp(1, 12_000);
        let c = &mut self.clients[i];
        for _ in 0..n {
            let pad = if c.rng.gen_bool(0.6) { c.rng.gen_range(1..=most) } else { 0 };
            issue_llm_padded(c, pad);
        }
        self.register_broker_requests(i);
    }
}

#[cfg(test)]
mod tests {
    use super::json_len;
    use serde_json::json;

    #[test]
    fn json_len_is_the_length_of_the_text() {
        for v in [
            json!([]),
            json!([{ "role": "user", "content": "p".repeat(5000) }, { "role": "user", "content": "c1-2" }]),
            json!({ "k": "é\"\\\n\u{1}", "n": [1, -2, 2.5, null, true] }),
        ] {
            assert_eq!(json_len(&v), v.to_string().len() as u64, "{v}");
        }
    }
}
