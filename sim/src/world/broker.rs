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
//! 5. the quota held equals the initial amount minus the sum of charges
//!    recomputed here, with this file's own prices, from the usage the
//!    simulated provider reported, clamped at zero;
//! 6. every broker op is answered within `queue_max_wait +
//!    request_timeout` (plus a step of slack) of simulated time after its
//!    frame reached the machine, not counting clock jumps (a shell that
//!    stalls cannot fire its timers on time).

use super::{at, next_id, req, send, violation, Check, Client, Kind, World};
use crate::swarm::FaultKind;
use airlock_core::broker::{
    BrokerConfig, BrokerSetup, CallId, Money, PricingCatalog, ProviderRequest, ProviderResult, Usage,
};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::fsproxy::Input;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rand::Rng;
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

/// The broker a broker world's machine runs: short timers, so timeouts
/// happen within a run; a budget from none to plenty, so the trim and the
/// clamp at zero are reached.
pub(super) fn setup(rng: &mut ChaCha8Rng) -> BrokerSetup {
    let config = BrokerConfig {
        queue_max_wait: Duration::from_millis(rng.gen_range(20..200)),
        request_timeout: Duration::from_millis(rng.gen_range(50..500)),
        default_model: DEFAULT_MODEL.into(),
        inject_remaining_context: rng.gen_bool(0.3),
        ..BrokerConfig::default()
    };
    const BUDGETS: [u64; 5] = [0, 1_000_000, 100_000_000, 10_000_000_000, 1_000_000_000_000];
    BrokerSetup {
        config,
        // The constant above is valid JSON; a test runs the scenario.
        catalog: PricingCatalog::from_json(CATALOG).unwrap_or_default(),
        initial_units: Money::from_pico(BUDGETS[rng.gen_range(0..BUDGETS.len())]),
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
    Llm { known: bool },
    Cancel,
    Quota { known: bool },
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
}

impl BrokerSim {
    pub(super) fn new(setup: &BrokerSetup) -> Self {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        BrokerSim {
            qmw: micros(setup.config.queue_max_wait),
            rt: micros(setup.config.request_timeout),
            initial: setup.initial_units.as_pico(),
            ..BrokerSim::default()
        }
    }

    fn expected_remaining(&self) -> u64 {
        self.initial.saturating_sub(self.charged)
    }

    /// Nothing running at the provider.
    pub(super) fn provider_idle(&self) -> bool {
        self.prov.is_empty()
    }

    fn next_due(&self) -> Option<u64> {
        self.prov.values().filter_map(|p| p.due).min()
    }
}

/// The request id an `LLMCMD` carries in its last message, so the checker
/// can tell which request a provider call is for.
fn marker(request: &ProviderRequest) -> Option<String> {
    request.messages.last()?.get("content")?.as_str().map(str::to_owned)
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
            let (model, result) = (p.model.clone(), p.result.clone());
            let p = Prov { model, due: None, cancelled: false, done: true, result };
            let usage = match &p.result {
                ProviderResult::Ok { usage, .. } | ProviderResult::Err { usage, .. } => *usage,
            };
            if let Some(u) = usage {
                match charge(&p.model, &u) {
                    Some(delta) => {
                        let b = self.bsim();
                        b.charged = b.charged.saturating_add(delta);
                    }
                    None => {
                        let v = violation("quota", format!("{call} ran unpriced model {:?}", p.model));
                        self.first_violation.get_or_insert(v);
                    }
                }
            }
            self.feed(0, Input::ProviderDone { call, result: p.result });
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
                if r.op == (BOp::Llm { known: true }) {
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
                let known = model.map_or(true, |m| prices(m).is_some());
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
        if deadline != now + b.rt {
            return Err(violation("liveness", format!("{call} deadline {deadline}, want {}", now + b.rt)));
        }
        let id = marker(&request).unwrap_or_default();
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
        if hang {
            *self.faults.entry(FaultKind::ProviderHang).or_default() += 1;
        }
        let latency = self.rng.gen_range(0..=b_rt(&self.broker) * 13 / 10);
        let usage = self.draw_usage(request.max_tokens);
        let result = if malformed {
            *self.faults.entry(FaultKind::ProviderMalformed).or_default() += 1;
            ProviderResult::Err {
                usage: None,
                message: "malformed provider reply: expected value at line 1".into(),
            }
        } else if error {
            *self.faults.entry(FaultKind::ProviderError).or_default() += 1;
            let usage = if self.rng.gen_bool(0.5) { Some(usage) } else { None };
            ProviderResult::Err { usage, message: "HTTP 500 from provider".into() }
        } else {
            let usage = if self.rng.gen_bool(0.95) { Some(usage) } else { None };
            ProviderResult::Ok {
                messages: vec![json!({ "role": "assistant", "content": format!("re {id}") })],
                usage,
                model: request.model.clone(),
            }
        };
        let due = if hang { None } else { Some(now + latency) };
        self.bsim()
            .prov
            .insert(call, Prov { model: request.model, due, cancelled: false, done: false, result });
        Ok(())
    }

    fn draw_usage(&mut self, max_tokens: u32) -> Usage {
        let prompt = self.rng.gen_range(1..5_000u64);
        let cached = if self.rng.gen_bool(0.5) { self.rng.gen_range(0..=prompt) } else { 0 };
        let completion = self.rng.gen_range(0..=u64::from(max_tokens));
        Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }

    pub(super) fn on_cancel_provider(&mut self, call: CallId) -> Check {
        let now = self.now;
        let delay = self.rng.gen_range(0..3_000);
        let partial = self.rng.gen_bool(0.5);
        let Some(p) = self.broker.as_mut().and_then(|b| b.prov.get_mut(&call)) else {
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
        // A dropped request ends soon, with whatever usage the provider
        // had counted, if any.
        let usage = match &p.result {
            ProviderResult::Ok { usage, .. } | ProviderResult::Err { usage, .. } => usage.filter(|_| partial),
        };
        p.result = ProviderResult::Err { usage, message: "request dropped".into() };
        p.due = Some(p.due.map_or(now + delay, |d| d.min(now + delay)));
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
        if r.delivered.is_none() {
            return Err(violation(
                "one_response_per_request",
                format!("{id} answered before it arrived: {v}"),
            ));
        }
        let bad = |what: String| Err(violation("broker_answer", format!("{id}: {what}: {v}")));
        match op {
            BOp::Llm { known: false } => {
                if code != "E_ARG" {
                    return bad("an unknown model must be E_ARG".into());
                }
            }
            BOp::Llm { known: true } => match (ok, code) {
                (true, _) if !r.started => return bad("succeeded without a provider call".into()),
                (true, _) => {
                    if v.pointer("/result/messages").and_then(Value::as_array).is_none() {
                        return bad("result without messages".into());
                    }
                }
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
    if let Some(Kind::Broker(op)) = c.outstanding.get(&id).map(|s| s.kind.clone()) {
        c.bpending.push_back((c.out.pushed, id.clone()));
        c.bnew.push((id, op));
    }
}

fn issue_llm(c: &mut Client) {
    let id = next_id(c);
    let model = MODELS[c.rng.gen_range(0..MODELS.len())];
    let known = model.map_or(true, |m| prices(m).is_some());
    let mut params = json!({ "messages": [{ "role": "user", "content": id.clone() }] });
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
    send(c, id.clone(), req(&id, "LLMCMD", params), Kind::Broker(BOp::Llm { known }), None);
    c.llm_tokens.insert(id.clone(), token);
    track(c, id);
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
    let usable: Vec<u64> = c.handles.iter().filter(|(_, h)| !h.closing).map(|(h, _)| *h).collect();
    let id = next_id(c);
    if usable.is_empty() || usable.len() < 3 && c.rng.gen_bool(0.2) {
        let mode = [Mode::Write, Mode::Append, Mode::ReadWrite, Mode::Read][c.rng.gen_range(0..4)];
        let payload = req(&id, "open", json!({ "path": key, "mode": mode.as_str() }));
        send(c, id, payload, Kind::Open { key: Some(key), mode, host: false }, None);
        return;
    }
    let h = usable[c.rng.gen_range(0..usable.len())];
    let mode = c.handles[&h].mode;
    if c.rng.gen_bool(0.2) {
        if let Some(hm) = c.handles.get_mut(&h) {
            hm.closing = true;
        }
        send(c, id.clone(), req(&id, "close", json!({ "h": h })), Kind::Close { h }, None);
    } else if mode.writable() && (!mode.readable() || c.rng.gen_bool(0.5)) {
        let data: Vec<u8> = (0..c.rng.gen_range(0..64)).map(|_| c.rng.gen()).collect();
        let payload = req(&id, "write", json!({ "h": h, "data": STANDARD.encode(&data) }));
        send(c, id, payload, Kind::Write { h, data }, None);
    } else {
        let max = c.rng.gen_range(1..256);
        send(c, id.clone(), req(&id, "read", json!({ "h": h, "max": max })), Kind::Read { h, max }, None);
    }
}
