//! An invariant-checking driver for the broker, shared by the property
//! tests, the fuzz target and the corpus replay, so an invariant checked
//! here is checked everywhere.
//!
//! [`Checker`] plays the shell (and a provider) from a script of
//! [`Step`]s, keeps its own model of what should have happened, and panics
//! (a panic is how a fuzzer learns it found something) when the broker
//! breaks one of DESIGN.md's invariants:
//!
//! 1. at most one call started and not finished; calls start in admission
//!    order; a waiter that timed out, was cancelled or whose owner left
//!    never starts; the lock is never free while someone waits;
//! 3. every submitted call gets exactly one reply, to its own owner, unless
//!    the owner is gone, and nothing is sent to a departed owner;
//! 5. the quota never drops below zero and equals the initial amount minus
//!    the sum of the charges, recomputed here from the usage fed in;
//! 6. no waiter waits past its bound, no call runs past its timeout, and
//!    a timeout never fires early.
//!
//! And for retries: an attempt answered `429` or `5xx` is retried exactly
//! when another attempt is allowed (`max_retries`), would start before the
//! call's deadline and its owner is still there, after the back-off this
//! file computes on its own; the call keeps the lock while it backs off
//! (nothing else starts), no attempt starts at or after its deadline, and
//! a cancel, a departure or a deadline during the back-off ends the call
//! at once, with no `CancelProvider` and no further attempt.

use super::{
    Broker, BrokerConfig, BrokerErrorCode, BrokerInput, BrokerOutput, CallId, LlmRequest, Money,
    PricingCatalog, ProviderResult, Usage, Weights,
};
use crate::handles::ClientId;
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Models a step can name: the default, two priced ones, a free one and
/// one missing from the catalog.
pub const MODELS: [Option<&str>; 5] =
    [None, Some("gpt-4o-mini"), Some("gpt-5"), Some("free"), Some("no-such-model")];
/// Client slots; a slot whose owner leaves gets a fresh client id.
pub const SLOTS: usize = 3;

/// One event of a scripted session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Submit {
        slot: u8,
        model: u8,
        max_tokens: Option<u32>,
        token: Option<u8>,
    },
    Cancel {
        slot: u8,
        token: u8,
    },
    OwnerGone {
        slot: u8,
    },
    /// The running call (or, with none, some earlier call) completes.
    ProviderOk {
        usage: Option<Usage>,
    },
    ProviderErr {
        usage: Option<Usage>,
    },
    /// The running attempt fails with an HTTP status (retried when `429`
    /// or `5xx`) and a `Retry-After` hint.
    ProviderStatus {
        usage: Option<Usage>,
        status: u16,
        retry_after_ms: Option<u64>,
    },
    /// A result for the `pick`-th call ever submitted, whatever its state.
    LateDone {
        pick: u16,
        usage: Option<Usage>,
    },
    /// Move the clock forward, firing every timer on the way as a shell
    /// would (`ticks`), or jumping over them (a stalled shell).
    Advance {
        micros: u64,
        ticks: bool,
    },
    /// Set the clock to exactly the next timer, without telling the
    /// broker: the next step lands on a deadline.
    ToDeadline,
    Tick,
}

/// A session's setup.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    pub config: BrokerConfig,
    pub initial: Money,
}

impl Setup {
    /// Pick a setup from one byte: short or default timers, one of a few
    /// budgets (zero and tiny ones included, so trims and the zero clamp
    /// are reached), remaining-context injection on or off.
    pub fn from_byte(b: u8) -> Setup {
        let mut config = BrokerConfig::default();
        if b & 1 != 0 {
            config.queue_max_wait = Duration::from_micros(1_000);
            config.request_timeout = Duration::from_micros(2_500);
            // Back-offs short enough for a retry or two to fit.
            config.retry_base = Duration::from_micros(200);
            config.retry_after_max = Duration::from_micros(1_000);
        }
        config.inject_remaining_context = b & 2 != 0;
        const BUDGETS: [u64; 5] = [0, 1_000_000, 1_000_000_000, 10_000_000_000, 2_000_000_000_000];
        let initial = Money::from_pico(BUDGETS[usize::from(b >> 2) % BUDGETS.len()]);
        Setup { config, initial }
    }
}

/// The catalog the checker runs with: the built-in one plus a free model.
pub fn catalog() -> PricingCatalog {
    let mut c = PricingCatalog::builtin();
    c.insert("free", Weights::default());
    c
}

#[derive(Debug)]
struct Call {
    owner: ClientId,
    submitted: Instant,
    requested: u32,
    token: Option<String>,
    weights: Option<Weights>,
    admission: Option<u64>,
    started: Option<Instant>,
    /// Replied, dropped with its departed owner, or (if started) finished.
    closed: bool,
    replied: bool,
    done_fed: bool,
    /// Attempts started.
    attempts: u32,
    /// Its provider deadline, set when it first started.
    deadline: Option<Instant>,
    /// Backing off until then.
    retry_at: Option<Instant>,
}

/// Drives one broker through a script and checks it after every step.
#[derive(Debug)]
pub struct Checker {
    pub broker: Broker,
    config: BrokerConfig,
    catalog: PricingCatalog,
    initial: Money,
    now: Instant,
    slots: [ClientId; SLOTS],
    next_client: u64,
    gone: BTreeSet<ClientId>,
    calls: BTreeMap<CallId, Call>,
    order: Vec<CallId>,
    next_call: u64,
    next_admission: u64,
    /// Admitted and neither started nor closed, by admission.
    pending: BTreeMap<u64, CallId>,
    running: Option<CallId>,
    /// Sum of charges, in pico-USD, computed here.
    expected_charged: u128,
    cancels: BTreeSet<CallId>,
    /// `BudgetPassed` was said.
    budget_passed: bool,
}

/// The charge, written out independently of `quota::charge`.
fn expected_charge(u: &Usage, w: &Weights) -> u128 {
    let cached = u128::from(u.cached_tokens.min(u.prompt_tokens));
    let prompt = u128::from(u.prompt_tokens);
    // price micro-USD per 1e6 tokens × tokens = 1e-12 USD per unit.
    (prompt - cached) * u128::from(w.input.micros())
        + cached * u128::from(w.cached.micros())
        + u128::from(u.completion_tokens) * u128::from(w.output.micros())
}

impl Checker {
    pub fn new(setup: Setup) -> Self {
        let catalog = catalog();
        let broker = match Broker::new(setup.config.clone(), catalog.clone(), setup.initial, "check") {
            Ok(b) => b,
            Err(e) => panic!("checker setup refused: {e}"),
        };
        Checker {
            broker,
            config: setup.config,
            catalog,
            initial: setup.initial,
            now: Instant::from_micros(1),
            slots: [ClientId(0), ClientId(1), ClientId(2)],
            next_client: SLOTS as u64,
            gone: BTreeSet::new(),
            calls: BTreeMap::new(),
            order: Vec::new(),
            next_call: 0,
            next_admission: 0,
            pending: BTreeMap::new(),
            running: None,
            expected_charged: 0,
            budget_passed: false,
            cancels: BTreeSet::new(),
        }
    }

    fn slot(&self, s: u8) -> ClientId {
        self.slots[usize::from(s) % SLOTS]
    }

    fn input(&mut self, input: BrokerInput) {
        self.broker.handle(self.now, input);
        self.drain();
        self.check_state();
    }

    pub fn step(&mut self, step: &Step) {
        match step {
            Step::Submit { slot, model, max_tokens, token } => {
                let owner = self.slot(*slot);
                let model = MODELS[usize::from(*model) % MODELS.len()];
                let call = CallId(self.next_call);
                self.next_call += 1;
                let token = token.map(|t| format!("t{}", t % 4));
                let name = model.unwrap_or(&self.config.default_model);
                let weights = self.catalog.get(name).copied();
                // Admitted tentatively: it may start within this very step.
                // A refusal takes the admission back (see `drain`).
                self.next_admission += 1;
                let admission = Some(self.next_admission);
                self.pending.insert(self.next_admission, call);
                self.calls.insert(
                    call,
                    Call {
                        owner,
                        submitted: self.now,
                        requested: max_tokens.unwrap_or(self.config.default_max_tokens),
                        token: token.clone(),
                        weights,
                        admission,
                        started: None,
                        closed: false,
                        replied: false,
                        done_fed: false,
                        attempts: 0,
                        deadline: None,
                        retry_at: None,
                    },
                );
                self.order.push(call);
                // Calls waiting when this one is submitted: due queue
                // timers fire first, so those whose wait ends now are gone.
                let max_wait = self.config.queue_max_wait;
                let waiting = self
                    .pending
                    .values()
                    .filter(|&&c| c != call && self.now < self.calls[&c].submitted.saturating_add(max_wait))
                    .count();
                let queue_full = waiting >= self.config.max_pending;
                let mut request = LlmRequest::new(vec![serde_json::json!({"role": "user", "content": "hi"})]);
                request.model = model.map(str::to_owned);
                request.max_tokens = *max_tokens;
                self.input(BrokerInput::Submit {
                    call,
                    owner,
                    scope: owner,
                    request,
                    cancel_token: token.clone(),
                });
                // Timers fire before the submit, so a token is busy only if
                // its call is still open after this step.
                let token_busy = token.as_ref().is_some_and(|t| {
                    self.calls.iter().any(|(id, c)| {
                        *id != call && c.owner == owner && !c.closed && c.token.as_ref() == Some(t)
                    })
                });
                let refused = self.calls[&call].admission.is_none();
                // Requests here are a few bytes, far below the pending-byte
                // bound, so only the count can fill the queue.
                assert_eq!(
                    refused,
                    weights.is_none() || token_busy || queue_full,
                    "{call}: refusal does not match an unknown model, a busy cancel token or a full queue"
                );
            }
            Step::Cancel { slot, token } => {
                let owner = self.slot(*slot);
                let request = CallId(u64::MAX - self.cancels.len() as u64);
                self.cancels.insert(request);
                self.input(BrokerInput::Cancel { request, owner, token: format!("t{}", token % 4) });
            }
            Step::OwnerGone { slot } => {
                let idx = usize::from(*slot) % SLOTS;
                let owner = self.slots[idx];
                self.gone.insert(owner);
                for c in self.calls.values_mut().filter(|c| c.owner == owner && c.started.is_none()) {
                    c.closed = true;
                }
                self.pending.retain(|_, call| self.calls[call].owner != owner);
                self.slots[idx] = ClientId(self.next_client);
                self.next_client += 1;
                self.input(BrokerInput::OwnerGone { owner });
            }
            Step::ProviderOk { usage } | Step::ProviderErr { usage } => {
                let call = match self.running.or_else(|| self.order.first().copied()) {
                    Some(c) => c,
                    None => return,
                };
                let result = if let Step::ProviderOk { .. } = step {
                    ProviderResult::Ok {
                        messages: super::RawJson::from_value(
                            &serde_json::json!([{"role": "assistant", "content": "ok"}]),
                        ),
                        usage: *usage,
                        model: "m".into(),
                    }
                } else {
                    ProviderResult::error(*usage, "boom")
                };
                self.done(call, result);
            }
            Step::LateDone { pick, usage } => {
                if self.order.is_empty() {
                    return;
                }
                let call = self.order[usize::from(*pick) % self.order.len()];
                self.done(call, ProviderResult::error(*usage, "late"));
            }
            Step::ProviderStatus { usage, status, retry_after_ms } => {
                let Some(call) = self.running.or_else(|| self.order.first().copied()) else { return };
                let result = ProviderResult::Err {
                    usage: *usage,
                    message: format!("HTTP {status}"),
                    status: Some(*status),
                    retry_after_ms: *retry_after_ms,
                };
                self.done(call, result);
            }
            Step::Advance { micros, ticks } => {
                let target = Instant::from_micros(self.now.as_micros().saturating_add(*micros));
                if *ticks {
                    while let Some(t) = self.broker.poll_timeout().filter(|t| *t <= target) {
                        self.now = self.now.max(t);
                        self.input(BrokerInput::Tick);
                    }
                }
                self.now = target;
            }
            Step::ToDeadline => {
                if let Some(t) = self.broker.poll_timeout() {
                    self.now = self.now.max(t);
                }
            }
            Step::Tick => self.input(BrokerInput::Tick),
        }
    }

    /// Feed a provider result for `call`, charging it in the model iff the
    /// call started and this is its first result.
    fn done(&mut self, call: CallId, result: ProviderResult) {
        // A retry due now starts before the result is read (due timers
        // fire first), so the result is the new attempt's.
        let retry_due = self.calls.get(&call).and_then(|c| c.retry_at).is_some_and(|at| at <= self.now);
        if retry_due && self.running == Some(call) {
            self.input(BrokerInput::Tick);
        }
        let usage = result.usage();
        let retry_status = match &result {
            ProviderResult::Err { status: Some(s), retry_after_ms, .. } if super::retryable_status(*s) => {
                Some(*retry_after_ms)
            }
            _ => None,
        };
        // An attempt in flight, whose result this is.
        let attempt =
            self.running == Some(call) && self.calls.get(&call).is_some_and(|c| c.retry_at.is_none());
        let mut retry_due = None;
        if let Some(c) = self.calls.get_mut(&call) {
            if c.started.is_some() && !c.done_fed {
                c.done_fed = true;
                if let (Some(u), Some(w)) = (usage, c.weights) {
                    self.expected_charged += expected_charge(&u, &w);
                }
            }
            // What the broker must do with it, computed here: due timers
            // fire first, so a result at the deadline finds the call gone.
            if let (true, Some(hint), Some(deadline)) = (attempt, retry_status, c.deadline) {
                let base = self.config.retry_base.as_micros() as u64;
                let cap = self.config.retry_after_max.as_micros() as u64;
                let exp = base.saturating_mul(1u64.checked_shl(c.attempts - 1).unwrap_or(u64::MAX));
                let delay = exp.max(hint.map_or(0, |h| h.saturating_mul(1_000))).min(cap).max(1);
                let at = Instant::from_micros(self.now.as_micros().saturating_add(delay));
                let allowed = c.attempts <= self.config.max_retries;
                if self.now < deadline && allowed && at < deadline && !self.gone.contains(&c.owner) {
                    retry_due = Some(at);
                }
            }
        }
        self.input(BrokerInput::ProviderDone { call, result });
        if let Some(at) = retry_due {
            assert_eq!(self.broker.backing_off(), Some((call, at)), "{call} not retried as it should be");
        } else if attempt {
            // A result at the deadline loses to the timeout; either way the
            // call is over.
            assert_ne!(self.running, Some(call), "{call} still running after its result");
        }
    }

    fn drain(&mut self) {
        let max_wait = self.config.queue_max_wait;
        let timeout = self.config.request_timeout;
        while let Some(out) = self.broker.poll_output() {
            match out {
                BrokerOutput::StartProvider { call, request, deadline } => {
                    let c = self
                        .calls
                        .get_mut(&call)
                        .unwrap_or_else(|| panic!("{call} started, never submitted"));
                    if c.started.is_some() {
                        // A retry: of the call holding the lock, once its
                        // back-off is over, before its deadline.
                        assert_eq!(self.running, Some(call), "{call} retried without the lock");
                        let at = c.retry_at.take().unwrap_or_else(|| panic!("{call} started twice"));
                        assert!(self.now >= at, "{call} retried at {:?}, before {at:?}", self.now);
                        assert_eq!(Some(deadline), c.deadline, "{call}: a retry moved the deadline");
                        assert!(self.now < deadline, "{call}: an attempt started at or past its deadline");
                        assert!(!c.closed && !self.gone.contains(&c.owner), "{call} retried after it ended");
                        c.attempts += 1;
                        assert!(c.attempts <= 1 + self.config.max_retries, "{call}: too many attempts");
                        c.done_fed = false;
                        continue;
                    }
                    assert!(self.running.is_none(), "{call} started while {:?} holds the lock", self.running);
                    assert!(!c.closed, "{call} started after it was answered or dropped");
                    assert!(!self.gone.contains(&c.owner), "{call} of a departed owner started");
                    let a = c.admission.unwrap_or_else(|| panic!("{call} started but was refused"));
                    let head = self.pending.first_key_value().map(|(_, c)| *c);
                    assert_eq!(head, Some(call), "{call} (admission {a}) started out of FIFO order");
                    self.pending.remove(&a);
                    assert!(
                        self.now < c.submitted.saturating_add(max_wait),
                        "{call} started at {:?}, past its queue deadline",
                        self.now
                    );
                    assert_eq!(deadline, self.now.saturating_add(timeout), "{call}: wrong provider deadline");
                    assert!(request.max_tokens <= c.requested, "{call}: trim raised max_tokens");
                    assert!(
                        request.max_tokens >= c.requested.min(self.config.min_output_tokens),
                        "{call}: trim cut below the floor"
                    );
                    c.started = Some(self.now);
                    c.attempts = 1;
                    c.deadline = Some(deadline);
                    self.running = Some(call);
                }
                BrokerOutput::CancelProvider { call } => {
                    assert_eq!(self.running, Some(call), "CancelProvider for {call}, which is not running");
                    assert!(
                        self.calls.get(&call).is_some_and(|c| c.retry_at.is_none()),
                        "CancelProvider for {call} while it backs off, with nothing in flight"
                    );
                    self.running = None;
                    if let Some(c) = self.calls.get_mut(&call) {
                        c.closed = true;
                    }
                }
                BrokerOutput::Reply { call, owner, outcome } => {
                    assert!(!self.gone.contains(&owner), "reply for {call} sent to departed {owner}");
                    let c = self.calls.get_mut(&call).unwrap_or_else(|| panic!("reply for unknown {call}"));
                    assert_eq!(c.owner, owner, "reply for {call} sent to the wrong owner");
                    assert!(!c.replied, "{call} answered twice");
                    c.replied = true;
                    let code = outcome.as_ref().err().map(|e| e.code);
                    match code {
                        Some(BrokerErrorCode::InvalidRequest | BrokerErrorCode::QueueFull) => {
                            assert!(c.started.is_none(), "{call} refused after it started");
                            if let Some(a) = c.admission.take() {
                                self.pending.remove(&a);
                            }
                        }
                        Some(
                            BrokerErrorCode::QueueTimeout
                            | BrokerErrorCode::CancelledBeforeStart
                            | BrokerErrorCode::BudgetExhausted,
                        ) => {
                            assert!(c.started.is_none(), "{call} answered {code:?} after it started");
                            if code == Some(BrokerErrorCode::QueueTimeout) {
                                assert!(
                                    self.now >= c.submitted.saturating_add(max_wait),
                                    "{call} timed out early in the queue"
                                );
                            }
                            if let Some(a) = c.admission {
                                self.pending.remove(&a);
                            }
                        }
                        Some(BrokerErrorCode::ProviderTimeout | BrokerErrorCode::CancelledAfterStart) => {
                            let started =
                                c.started.unwrap_or_else(|| panic!("{call} abandoned before it started"));
                            if c.retry_at.take().is_some() {
                                // Ended while backing off: nothing in flight.
                                assert_eq!(self.running, Some(call), "{call} backed off without the lock");
                                self.running = None;
                            } else {
                                assert!(c.closed, "{call} abandoned without CancelProvider");
                            }
                            if code == Some(BrokerErrorCode::ProviderTimeout) {
                                assert!(
                                    self.now >= started.saturating_add(timeout),
                                    "{call} timed out early"
                                );
                            }
                        }
                        None | Some(BrokerErrorCode::ProviderError) => {
                            assert!(c.started.is_some(), "{call} finished without starting");
                            // Under enforce_budget a retry that no longer
                            // fits ends the back-off with provider_error.
                            if c.retry_at.take().is_some() {
                                assert!(self.config.enforce_budget, "{call} failed while backing off");
                            }
                            assert_eq!(self.running, Some(call), "{call} finished but was not running");
                            self.running = None;
                        }
                    }
                    c.closed = true;
                }
                BrokerOutput::CancelResult { request, owner, outcome: _ } => {
                    assert!(self.cancels.contains(&request), "CancelResult for unknown {request}");
                    assert!(!self.gone.contains(&owner), "CancelResult sent to departed {owner}");
                }
                BrokerOutput::BudgetPassed { initial, charged } => {
                    assert!(!self.budget_passed, "the budget's passing said twice");
                    assert!(!self.config.enforce_budget, "BudgetPassed under enforce_budget");
                    assert_eq!(initial, self.initial);
                    assert!(charged > initial && u128::from(charged.as_pico()) == self.expected_charged);
                    self.budget_passed = true;
                }
                BrokerOutput::Telemetry(r) => {
                    assert!(r.remaining <= self.initial, "telemetry: remaining above the initial amount");
                    // A departed owner's call ends without a reply; its
                    // record is the only sign.
                    if let Some(delay) = r.retry_delay_ms {
                        let c = self
                            .calls
                            .get_mut(&r.call)
                            .unwrap_or_else(|| panic!("record of unknown {}", r.call));
                        assert_eq!(self.running, Some(r.call), "{}: retry record without the lock", r.call);
                        let at = self.broker.backing_off().filter(|(c, _)| *c == r.call).map(|(_, t)| t);
                        let at = at.unwrap_or_else(|| panic!("{}: retry record, yet no back-off", r.call));
                        assert_eq!(delay, at.saturating_duration_since(self.now).as_millis() as u64);
                        assert_eq!(r.attempt, Some(c.attempts), "{}: attempt number", r.call);
                        c.retry_at = Some(at);
                        continue;
                    }
                    if self.running == Some(r.call) && !r.late_usage && !r.dropped_usage_unknown {
                        let c = self
                            .calls
                            .get_mut(&r.call)
                            .unwrap_or_else(|| panic!("record of unknown {}", r.call));
                        assert!(self.gone.contains(&c.owner), "{} ended unanswered", r.call);
                        c.closed = true;
                        c.retry_at = None;
                        self.running = None;
                    }
                }
            }
        }
    }

    fn check_state(&mut self) {
        assert_eq!(self.broker.running(), self.running, "broker and checker disagree on the running call");
        let backing_off = self.running.filter(|c| self.calls.get(c).is_some_and(|c| c.retry_at.is_some()));
        assert_eq!(
            self.broker.backing_off().map(|(c, _)| c),
            backing_off,
            "broker and checker disagree on the call backing off"
        );
        assert!(
            self.broker.running().is_some() || self.broker.queued() == 0,
            "lock free while {} calls wait",
            self.broker.queued()
        );
        assert_eq!(self.broker.queued(), self.pending.len(), "queue length differs from the checker's");
        assert_eq!(
            self.broker.poll_timeout().is_some(),
            !self.broker.is_idle(),
            "a timer is wanted exactly while something waits or runs"
        );
        if let Some(t) = self.broker.poll_timeout() {
            assert!(t > self.now, "timer due at {t:?} still pending after a handle at {:?}", self.now);
        }
        let expected = u128::from(self.initial.as_pico()).saturating_sub(self.expected_charged);
        assert_eq!(
            self.budget_passed,
            self.expected_charged > u128::from(self.initial.as_pico()),
            "the budget's passing said when it did not happen, or not said when it did"
        );
        assert_eq!(
            u128::from(self.broker.remaining().as_pico()),
            expected,
            "quota differs from initial minus the recomputed charges"
        );
    }

    /// Run every timer out and finish every call, then check that every
    /// call was answered unless its owner left.
    pub fn finish(&mut self) {
        let horizon = (self.config.queue_max_wait + self.config.request_timeout).as_micros() as u64 + 1;
        // Each call may back off once more before a success ends it.
        for _ in 0..(self.pending.len() + 2) * 3 {
            if self.broker.is_idle() {
                break;
            }
            self.step(&Step::ProviderOk {
                usage: Some(Usage {
                    prompt_tokens: 10,
                    cached_tokens: 0,
                    completion_tokens: 5,
                    total_tokens: 15,
                }),
            });
            self.step(&Step::Advance { micros: horizon, ticks: true });
        }
        assert!(self.broker.is_idle(), "broker not idle after every timer ran out");
        for (id, c) in &self.calls {
            assert!(c.replied || self.gone.contains(&c.owner), "{id} never answered");
        }
        let stats = self.broker.stats();
        assert_eq!(stats.submitted, self.calls.len() as u64);
    }
}

/// Run `steps` under `setup`, checking after each, then finish.
pub fn run(setup: Setup, steps: &[Step]) {
    let mut checker = Checker::new(setup);
    for step in steps {
        checker.step(step);
    }
    checker.finish();
}

/// Decode a fuzzer's bytes into steps. Each step is a command byte (low
/// nibble: the kind; bits 4 and 5: variants) and its argument bytes;
/// missing bytes read as zero, so every input decodes. See
/// `fuzz/scripts/gen_corpus.py` for the layout written out.
pub fn decode_steps(mut data: &[u8]) -> Vec<Step> {
    // Bounds the work per input: a longer script finds nothing new.
    const MAX_STEPS: usize = 2_000;
    fn byte(data: &mut &[u8]) -> u8 {
        match data.split_first() {
            Some((&b, rest)) => {
                *data = rest;
                b
            }
            None => 0,
        }
    }
    fn word(data: &mut &[u8]) -> u16 {
        u16::from_be_bytes([byte(data), byte(data)])
    }
    fn usage(data: &mut &[u8]) -> Option<Usage> {
        let sel = byte(data);
        if sel == 0 {
            return None;
        }
        let prompt = u64::from(word(data)) * 4;
        let cached = u64::from(byte(data)) * 64;
        let completion = u64::from(word(data));
        Some(Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        })
    }
    let mut steps = Vec::new();
    while !data.is_empty() && steps.len() < MAX_STEPS {
        let cmd = byte(&mut data);
        let step = match cmd & 0x0f {
            0..=3 => {
                let a = byte(&mut data);
                let t = byte(&mut data);
                let max = word(&mut data);
                Step::Submit {
                    slot: a % 3,
                    model: a / 3 % 5,
                    max_tokens: (max != 0).then_some(u32::from(max)),
                    token: (t & 0x80 == 0).then_some(t & 3),
                }
            }
            4 => {
                let a = byte(&mut data);
                Step::Cancel { slot: a % 3, token: a / 3 % 4 }
            }
            5 => Step::OwnerGone { slot: byte(&mut data) % 3 },
            6 | 7 => Step::ProviderOk { usage: usage(&mut data) },
            8 if cmd & 0x10 != 0 => {
                const STATUSES: [u16; 8] = [429, 500, 502, 503, 504, 501, 400, 401];
                let status = STATUSES[usize::from(byte(&mut data)) % STATUSES.len()];
                let hint = byte(&mut data);
                // Quarter seconds up to ~32 s, or none.
                let retry_after_ms = (hint & 0x80 == 0).then_some(u64::from(hint & 0x7f) * 250);
                Step::ProviderStatus { usage: usage(&mut data), status, retry_after_ms }
            }
            8 => Step::ProviderErr { usage: usage(&mut data) },
            9 => {
                let pick = word(&mut data);
                Step::LateDone { pick, usage: usage(&mut data) }
            }
            10 | 11 => {
                let scale = if cmd & 0x10 != 0 { 1_000 } else { 1 };
                Step::Advance { micros: u64::from(word(&mut data)) * scale, ticks: cmd & 0x20 == 0 }
            }
            12 => Step::ToDeadline,
            13 => Step::Tick,
            _ => Step::Advance { micros: u64::from(word(&mut data)) * 1_000_000, ticks: cmd & 0x20 == 0 },
        };
        steps.push(step);
    }
    steps
}
