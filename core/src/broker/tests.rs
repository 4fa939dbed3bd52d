use super::check::{self, Setup, Step};
use super::quota::{self, parse_decimal_scaled, DecimalError};
use super::wire;
use super::*;
use proptest::prelude::*;
use serde_json::json;

const A: ClientId = ClientId(1);
const B: ClientId = ClientId(2);

fn t(ms: u64) -> Instant {
    Instant::from_micros(ms * 1000)
}

fn usd(s: &str) -> Money {
    Money::from_usd_str(s).expect("test amount")
}

fn weights(input: &str, cached: &str, output: &str) -> Weights {
    let p = |s| Price::parse(s).expect("test price");
    Weights { input: p(input), cached: p(cached), output: p(output), ..Weights::default() }
}

fn req() -> LlmRequest {
    LlmRequest::new(vec![json!({"role": "user", "content": "hi"})])
}

fn req_max(max: u32) -> LlmRequest {
    LlmRequest { max_tokens: Some(max), ..req() }
}

fn broker(initial: &str) -> Broker {
    Broker::new(BrokerConfig::default(), PricingCatalog::builtin(), usd(initial), "s1")
        .expect("default config")
}

fn drain(b: &mut Broker) -> Vec<BrokerOutput> {
    std::iter::from_fn(|| b.poll_output()).collect()
}

fn submit(
    b: &mut Broker,
    now: Instant,
    call: u64,
    owner: ClientId,
    request: LlmRequest,
    token: Option<&str>,
) {
    b.handle(
        now,
        BrokerInput::Submit {
            call: CallId(call),
            owner,
            scope: owner,
            request,
            cancel_token: token.map(Into::into),
        },
    );
}

fn ok(usage: Option<Usage>) -> ProviderResult {
    ProviderResult::Ok {
        messages: RawJson::from_value(&json!([{"role": "assistant", "content": "x"}])),
        usage,
        model: "gpt-4o-mini".into(),
    }
}

fn usage(prompt: u64, cached: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

fn started(out: &[BrokerOutput]) -> Vec<(CallId, u32)> {
    out.iter()
        .filter_map(|o| match o {
            BrokerOutput::StartProvider { call, request, .. } => Some((*call, request.max_tokens)),
            _ => None,
        })
        .collect()
}

fn replies(out: &[BrokerOutput]) -> Vec<(CallId, Result<LlmResult, BrokerError>)> {
    out.iter()
        .filter_map(|o| match o {
            BrokerOutput::Reply { call, outcome, .. } => Some((*call, outcome.clone())),
            _ => None,
        })
        .collect()
}

fn codes(out: &[BrokerOutput]) -> Vec<(CallId, Option<BrokerErrorCode>)> {
    replies(out).into_iter().map(|(c, r)| (c, r.err().map(|e| e.code))).collect()
}

// ---- money, prices, formulas ------------------------------------------------

#[test]
fn decimals_parse_exactly_or_not_at_all() {
    assert_eq!(parse_decimal_scaled("0.075", 6), Ok(75_000));
    assert_eq!(parse_decimal_scaled("1e-7", 12), Ok(100_000));
    assert_eq!(parse_decimal_scaled("2.50000000", 6), Ok(2_500_000));
    assert_eq!(parse_decimal_scaled("10", 6), Ok(10_000_000));
    assert_eq!(parse_decimal_scaled("0", 6), Ok(0));
    assert_eq!(parse_decimal_scaled("-0.0", 6), Ok(0));
    assert_eq!(parse_decimal_scaled("0.0000001", 6), Err(DecimalError::TooPrecise));
    assert_eq!(parse_decimal_scaled("-1", 6), Err(DecimalError::Negative));
    assert_eq!(parse_decimal_scaled("1e30", 6), Err(DecimalError::TooLarge));
    assert_eq!(parse_decimal_scaled("abc", 6), Err(DecimalError::Malformed));
    assert_eq!(parse_decimal_scaled(".", 6), Err(DecimalError::Malformed));
    assert_eq!(Money::from_usd_str("0.0100"), Some(Money::from_pico(10_000_000_000)));
    assert_eq!(Money::from_usd_f64(0.01), Some(Money::from_pico(10_000_000_000)));
    assert_eq!(Money::from_usd_f64(-1.0), None);
    assert_eq!(usd("1.5").to_string(), "1.500000000000 USD");
}

#[test]
fn prices_round_trip_through_serde_exactly() {
    for s in ["0.075", "0.15", "2.5", "0.000001", "1234.567891"] {
        let p = Price::parse(s).expect("price");
        let text = serde_json::to_string(&p).expect("serialize");
        let back: Price = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back, p, "{s} -> {text}");
    }
}

#[test]
fn seed_worked_example_soft_trim() {
    // remaining 0.0100 USD, output 4.0 USD/1M, factor 0.9:
    // 0.01 / 4 × 1e6 × 0.9 = 2250 tokens.
    let w = weights("1.0", "0.25", "4.0");
    let safe = quota::safe_output_tokens(usd("0.0100"), w.output, quota::factor_ppm(0.9));
    assert_eq!(safe, Some(2250));
    let t = quota::soft_trim(2000, safe, 16);
    assert_eq!((t.effective, t.trim_applied), (2000, false));
    let t = quota::soft_trim(3000, safe, 16);
    assert_eq!((t.effective, t.trim_applied, t.floor_applied), (2250, true, false));
}

#[test]
fn trim_floor_and_free_output() {
    let w = weights("1.0", "0.25", "4.0");
    // 0.00001 USD buys 2.5 output tokens; 2 after the factor: floor wins.
    let safe = quota::safe_output_tokens(usd("0.00001"), w.output, quota::factor_ppm(0.9));
    assert_eq!(safe, Some(2));
    let t = quota::soft_trim(500, safe, 16);
    assert_eq!((t.effective, t.trim_applied, t.floor_applied), (16, true, true));
    // Never raised to the floor.
    let t = quota::soft_trim(5, safe, 16);
    assert_eq!((t.effective, t.trim_applied), (5, false));
    // Nothing left at all.
    assert_eq!(quota::safe_output_tokens(Money::ZERO, w.output, 900_000), Some(0));
    // Free output is never trimmed.
    assert_eq!(quota::safe_output_tokens(Money::ZERO, Price::from_micros(0), 900_000), None);
    assert_eq!(quota::soft_trim(9000, None, 16).effective, 9000);
}

#[test]
fn charge_counts_cached_tokens_once() {
    let w = weights("1.0", "0.25", "4.0");
    // 1000 prompt of which 400 cached, 100 completion:
    // 600×1 + 400×0.25 + 100×4 = 1100 USD per 1M = 0.0011 USD.
    assert_eq!(quota::charge(&usage(1000, 400, 100), &w), usd("0.0011"));
    // Cached beyond the prompt is capped.
    assert_eq!(quota::charge(&usage(10, 50, 0), &w), quota::charge(&usage(10, 10, 0), &w));
    // Exact where f64 is not: 3 × 0.1 USD per token-million.
    let w = weights("0.1", "0.1", "0.1");
    assert_eq!(quota::charge(&usage(3, 0, 0), &w), Money::from_pico(300_000));
}

#[test]
fn usage_from_openai_shapes() {
    let u = Usage::from_openai(&json!({
        "prompt_tokens": 1000, "completion_tokens": 50, "total_tokens": 1050,
        "prompt_tokens_details": {"cached_tokens": 800, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 10}
    }))
    .expect("openai usage");
    assert_eq!(u, usage(1000, 800, 50));
    // The seed's own shape, and a missing total.
    let u = Usage::from_openai(&json!({"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 5}))
        .expect("seed usage");
    assert_eq!(u, usage(10, 4, 5));
    // Partial usage on an error: prompt only.
    assert_eq!(Usage::from_openai(&json!({"prompt_tokens": 7})).expect("partial"), usage(7, 0, 0));
    // Capped cached count.
    assert_eq!(
        Usage::from_openai(&json!({"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 9}}))
            .expect("capped")
            .cached_tokens,
        3
    );
    for bad in
        [json!(null), json!([]), json!({}), json!({"prompt_tokens": -1}), json!({"prompt_tokens": "10"})]
    {
        assert!(Usage::from_openai(&bad).is_err(), "{bad} accepted");
    }
}

// ---- catalog ----------------------------------------------------------------

#[test]
fn builtin_catalog_is_the_sample_and_parses() {
    let c = PricingCatalog::from_json(SAMPLE_CATALOG_JSON).expect("sample catalog parses");
    assert_eq!(c, PricingCatalog::builtin());
    let w = c.get(DEFAULT_MODEL).expect("default model priced");
    assert_eq!(*w, weights("0.15", "0.075", "0.6"));
    assert!(c.models().count() >= 5);
}

#[test]
fn catalog_errors_name_model_and_key() {
    let e = |s: &str| PricingCatalog::from_json(s).expect_err(s).to_string();
    assert!(e("[1]").contains("not a JSON object"));
    assert!(e("{}").contains("no model"));
    assert!(e("nope").contains("not JSON"));
    assert!(e(r#"{"m": 1}"#).contains("\"m\""));
    let msg = e(r#"{"m": {"input": 1}}"#);
    assert!(msg.contains("\"m\"") && msg.contains("output"), "{msg}");
    let msg = e(r#"{"m": {"input": 1, "output": -2}}"#);
    assert!(msg.contains("output price -2") && msg.contains("negative"), "{msg}");
    let msg = e(r#"{"m": {"input": 0.0000001, "output": 1}}"#);
    assert!(msg.contains("input") && msg.contains("decimal places"), "{msg}");
    let msg = e(r#"{"m": {"input": "1", "output": 1}}"#);
    assert!(msg.contains("not a number"), "{msg}");
    let msg = e(r#"{"m": {"input": 1, "output": 1, "outptu": 1}}"#);
    assert!(msg.contains("outptu"), "{msg}");
    // cached defaults to the input price.
    let c = PricingCatalog::from_json(r#"{"m": {"input": 1.5, "output": 2}}"#).expect("no cached");
    assert_eq!(c.get("m").map(|w| w.cached), Some(Price::parse("1.5").expect("price")));
}

#[test]
fn config_is_validated() {
    let new = |c: BrokerConfig| Broker::new(c, PricingCatalog::builtin(), Money::ZERO, "s").err();
    assert_eq!(new(BrokerConfig::default()), None);
    let c = BrokerConfig { queue_max_wait: Duration::ZERO, ..Default::default() };
    assert_eq!(new(c), Some(ConfigError::ZeroQueueWait));
    for f in [0.0, 1.5, f64::NAN, 1e-9] {
        let c = BrokerConfig { safety_factor: f, ..Default::default() };
        assert!(matches!(new(c), Some(ConfigError::SafetyFactor(_))), "{f}");
    }
    let c = BrokerConfig { default_model: "nope".into(), ..Default::default() };
    assert_eq!(new(c), Some(ConfigError::DefaultModelNotPriced("nope".into())));
    let c = BrokerConfig { retry_base: Duration::from_nanos(999), ..Default::default() };
    assert_eq!(new(c), Some(ConfigError::ZeroRetryBase));
    let c = BrokerConfig { retry_after_max: Duration::from_millis(499), ..Default::default() };
    assert_eq!(new(c), Some(ConfigError::RetryCapBelowBase));
    let c = BrokerConfig { max_retries: 0, ..Default::default() };
    assert_eq!(new(c), None, "retries may be off");
}

// ---- wire -------------------------------------------------------------------

fn params(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().cloned().expect("object")
}

#[test]
fn llmcmd_params_parse_and_refuse() {
    let p = wire::parse_llmcmd(&params(json!({
        "messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o", "max_tokens": 100,
        "temperature": 0.5, "metadata": {"k": 1}, "cancel_token": "c1"
    })))
    .expect("valid");
    assert_eq!(p.request.model.as_deref(), Some("gpt-4o"));
    assert_eq!(p.request.max_tokens, Some(100));
    assert_eq!(p.cancel_token.as_deref(), Some("c1"));
    let bad = [
        json!({}),
        json!({"messages": []}),
        json!({"messages": "hi"}),
        json!({"messages": [1]}),
        json!({"messages": [{"content": "x"}]}),
        json!({"messages": [{"role": "user"}], "max_tokens": 0}),
        json!({"messages": [{"role": "user"}], "max_tokens": -5}),
        json!({"messages": [{"role": "user"}], "max_tokens": 5_000_000_000u64}),
        json!({"messages": [{"role": "user"}], "temperature": 3}),
        json!({"messages": [{"role": "user"}], "model": 4}),
        json!({"messages": [{"role": "user"}], "cancel_token": ""}),
        json!({"messages": [{"role": "user"}], "max_token": 5}),
    ];
    for b in bad {
        assert!(wire::parse_llmcmd(&params(b.clone())).is_err(), "{b} accepted");
    }
    assert_eq!(wire::parse_cancel(&params(json!({"cancel_token": "x"}))), Ok("x".into()));
    assert!(wire::parse_cancel(&params(json!({}))).is_err());
    assert_eq!(wire::parse_quota(&params(json!({}))), Ok(None));
    assert!(wire::parse_quota(&params(json!({"x": 1}))).is_err());
}

#[test]
fn quota_wire_shape() {
    let b = broker("5");
    let q = b.quota().to_wire();
    assert_eq!(
        serde_json::Value::Object(q),
        json!({"remaining_units": 5.0, "weights": {"input": 0.15, "cached": 0.075, "output": 0.6},
               "window": "session", "session_id": "s1", "currency": "USD", "unit": "per_1M_tokens",
               "model": "gpt-4o-mini"})
    );
    assert_eq!(b.quota_for(Some("gpt-4o")).map(|q| q.weights.output), Ok(Price::parse("10").expect("p")));
    assert_eq!(b.quota_for(Some("nope")).map_err(|e| e.code), Err(BrokerErrorCode::InvalidRequest));
}

#[test]
fn error_codes_render_canonically() {
    for c in BrokerErrorCode::ALL {
        let json = serde_json::to_value(c).expect("code");
        assert_eq!(json, json!(c.as_str()));
        assert_eq!(BrokerErrorCode::parse(c.as_str()), Some(c));
    }
}

// ---- the machine --------------------------------------------------------------

#[test]
fn one_call_at_a_time_fifo_and_exactly_one_wakeup() {
    let mut b = broker("5");
    for i in 0..3 {
        submit(&mut b, t(i), i, A, req(), None);
    }
    let out = drain(&mut b);
    assert_eq!(started(&out).len(), 1);
    assert_eq!(b.running(), Some(CallId(0)));
    assert_eq!(b.queued(), 2);
    b.handle(t(10), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(10, 0, 5))) });
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), None)]);
    assert_eq!(started(&out), [(CallId(1), DEFAULT_MAX_TOKENS)], "exactly the next waiter woken");
    b.handle(t(11), BrokerInput::ProviderDone { call: CallId(1), result: ok(None) });
    assert_eq!(started(&drain(&mut b)), [(CallId(2), DEFAULT_MAX_TOKENS)]);
    let tel: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            BrokerOutput::Telemetry(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(tel.len(), 1);
    assert_eq!(tel[0].model, "gpt-4o-mini");
    assert_eq!(tel[0].provider_latency_ms, Some(10));
    assert_eq!(tel[0].usage, Some(usage(10, 0, 5)));
    // 10 × 0.15 + 5 × 0.6 = 4.5 USD per 1M.
    assert_eq!(tel[0].charged, usd("0.0000045"));
}

#[test]
fn queue_timeout_makes_no_call_and_charges_nothing() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(1), 1, B, req(), None);
    drain(&mut b);
    assert_eq!(b.poll_timeout(), Some(t(1).saturating_add(DEFAULT_QUEUE_MAX_WAIT)));
    // One microsecond early: still waiting.
    let deadline = t(1).saturating_add(DEFAULT_QUEUE_MAX_WAIT);
    b.handle(Instant::from_micros(deadline.as_micros() - 1), BrokerInput::Tick);
    assert!(drain(&mut b).is_empty());
    b.handle(deadline, BrokerInput::Tick);
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(1), Some(BrokerErrorCode::QueueTimeout))]);
    assert!(started(&out).is_empty());
    assert_eq!(b.remaining(), usd("5"));
    let rec = out.iter().find_map(|o| match o {
        BrokerOutput::Telemetry(r) => Some(r),
        _ => None,
    });
    assert_eq!(rec.map(|r| (r.wait_duration_ms, r.queue_length_at_enqueue)), Some((30_000, 0)));
}

#[test]
fn provider_timeout_releases_the_lock_and_late_usage_is_charged() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(0), 1, A, req(), None);
    drain(&mut b);
    // The first waiter times out at 30 s; one queued later outlives the
    // provider deadline at 60 s.
    b.handle(t(30_000), BrokerInput::Tick);
    assert_eq!(codes(&drain(&mut b)), [(CallId(1), Some(BrokerErrorCode::QueueTimeout))]);
    submit(&mut b, t(31_000), 2, B, req(), None);
    drain(&mut b);
    b.handle(t(60_000), BrokerInput::Tick);
    let out = drain(&mut b);
    assert!(matches!(out[0], BrokerOutput::CancelProvider { call: CallId(0) }), "{out:?}");
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::ProviderTimeout))]);
    assert_eq!(started(&out).first().map(|s| s.0), Some(CallId(2)), "no retry, next waiter instead");
    // The dropped request's result still charges what it reports, and
    // changes nothing else.
    b.handle(
        t(60_001),
        BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(1_000_000, 0, 0))) },
    );
    let out = drain(&mut b);
    assert!(replies(&out).is_empty() && started(&out).is_empty());
    assert_eq!(b.remaining(), usd("4.85"));
    assert_eq!(b.running(), Some(CallId(2)));
    assert_eq!(b.stats().late_results, 1);
    // A second result for it, or one for a call never started: ignored.
    b.handle(
        t(60_002),
        BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(1_000_000, 0, 0))) },
    );
    b.handle(
        t(60_002),
        BrokerInput::ProviderDone { call: CallId(77), result: ok(Some(usage(1_000_000, 0, 0))) },
    );
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.remaining(), usd("4.85"));
    assert_eq!(b.stats().stray_results, 2);
}

#[test]
fn a_dropped_call_ending_without_usage_is_usage_unknown_not_a_late_result() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    b.handle(t(60_000), BrokerInput::Tick);
    let out = drain(&mut b);
    assert!(matches!(out[0], BrokerOutput::CancelProvider { call: CallId(0) }), "{out:?}");
    b.handle(t(60_001), BrokerInput::ProviderDone { call: CallId(0), result: ok(None) });
    let records: Vec<TelemetryRecord> = drain(&mut b)
        .into_iter()
        .filter_map(|o| match o {
            BrokerOutput::Telemetry(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert!(records[0].dropped_usage_unknown && !records[0].late_usage, "{records:?}");
    assert_eq!(records[0].usage, None);
    assert_eq!((b.stats().late_results, b.stats().dropped_usage_unknown), (0, 1));
    assert_eq!(b.remaining(), usd("5"));
}

// ---- retries ----------------------------------------------------------------

fn status(code: u16, hint_ms: Option<u64>, usage: Option<Usage>) -> ProviderResult {
    ProviderResult::Err {
        usage,
        message: format!("HTTP {code}: busy"),
        status: Some(code),
        retry_after_ms: hint_ms,
    }
}

fn records(out: &[BrokerOutput]) -> Vec<TelemetryRecord> {
    out.iter()
        .filter_map(|o| match o {
            BrokerOutput::Telemetry(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn deadlines(out: &[BrokerOutput]) -> Vec<Instant> {
    out.iter()
        .filter_map(|o| match o {
            BrokerOutput::StartProvider { deadline, .. } => Some(*deadline),
            _ => None,
        })
        .collect()
}

#[test]
fn a_429_or_5xx_is_retried_after_its_back_off_and_the_lock_stays_taken() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(0), 1, B, req(), None);
    let first = drain(&mut b);
    assert_eq!(deadlines(&first), [t(60_000)]);
    // 429 asking for no wait: the base back-off, 500 ms. Its usage is charged.
    b.handle(
        t(100),
        BrokerInput::ProviderDone {
            call: CallId(0),
            result: status(429, Some(0), Some(usage(1_000_000, 0, 0))),
        },
    );
    let out = drain(&mut b);
    assert!(replies(&out).is_empty() && started(&out).is_empty(), "{out:?}");
    let r = &records(&out)[0];
    assert_eq!(
        (r.attempt, r.http_status, r.retry_after_ms, r.retry_delay_ms),
        (Some(1), Some(429), Some(0), Some(500))
    );
    assert_eq!((r.error_code, r.charged), (Some(BrokerErrorCode::ProviderError), usd("0.15")));
    assert_eq!(b.remaining(), usd("4.85"));
    assert_eq!((b.running(), b.backing_off()), (Some(CallId(0)), Some((CallId(0), t(600)))));
    assert_eq!(b.poll_timeout(), Some(t(600)));
    // Nothing starts during the back-off, not even the waiter behind it.
    b.handle(t(599), BrokerInput::Tick);
    assert!(drain(&mut b).is_empty());
    b.handle(t(600), BrokerInput::Tick);
    let out = drain(&mut b);
    assert_eq!(started(&out), [(CallId(0), 4096)]);
    assert_eq!(deadlines(&out), [t(60_000)], "the deadline spans every attempt");
    // 503 without Retry-After: the back-off doubles. A hint longer than
    // that wins.
    b.handle(t(700), BrokerInput::ProviderDone { call: CallId(0), result: status(503, None, None) });
    assert_eq!(records(&drain(&mut b))[0].retry_delay_ms, Some(1_000));
    b.handle(t(1_700), BrokerInput::Tick);
    assert_eq!(started(&drain(&mut b)).len(), 1);
    b.handle(t(1_800), BrokerInput::ProviderDone { call: CallId(0), result: status(500, Some(3_000), None) });
    assert_eq!(records(&drain(&mut b))[0].retry_delay_ms, Some(3_000));
    b.handle(t(4_800), BrokerInput::Tick);
    assert_eq!(started(&drain(&mut b)).len(), 1);
    // The fourth attempt succeeds: the call is answered, its last record
    // names the attempt, and the next waiter gets the lock.
    b.handle(t(5_000), BrokerInput::ProviderDone { call: CallId(0), result: ok(None) });
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), None)]);
    let r = &records(&out)[0];
    assert_eq!((r.attempt, r.retry_delay_ms, r.provider_latency_ms), (Some(4), None, Some(5_000)));
    assert_eq!(started(&out).first().map(|s| s.0), Some(CallId(1)));
    assert_eq!(b.stats().retries, 3);
}

#[test]
fn retries_stop_at_max_retries_and_at_the_deadline() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    for (i, at) in [(1, 0), (2, 500), (3, 1_500)] {
        b.handle(t(at + 1), BrokerInput::ProviderDone { call: CallId(0), result: status(502, None, None) });
        let r = &records(&drain(&mut b))[0];
        assert_eq!(r.attempt, Some(i));
        b.handle(t(at + 1 + r.retry_delay_ms.unwrap_or(0)), BrokerInput::Tick);
        assert_eq!(started(&drain(&mut b)).len(), 1);
    }
    // The fourth attempt is the last (1 + max_retries).
    b.handle(t(4_000), BrokerInput::ProviderDone { call: CallId(0), result: status(502, None, None) });
    let out = drain(&mut b);
    let e = replies(&out)[0].1.clone().expect_err("fails");
    assert_eq!(e.code, BrokerErrorCode::ProviderError);
    assert!(e.message.starts_with("HTTP 502: busy; not retried: 4 attempts made"), "{}", e.message);
    assert_eq!((records(&out)[0].attempt, records(&out)[0].http_status), (Some(4), Some(502)));
    assert!(b.is_idle());

    // A back-off that would end at or past the deadline: no retry, the
    // provider's error with the reason.
    let config = BrokerConfig { request_timeout: Duration::from_secs(2), ..BrokerConfig::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("5"), "s").expect("config");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    b.handle(t(1_500), BrokerInput::ProviderDone { call: CallId(0), result: status(429, Some(500), None) });
    let out = drain(&mut b);
    let e = replies(&out)[0].1.clone().expect_err("fails");
    assert!(e.message.contains("would start past the request timeout"), "{}", e.message);
    assert_eq!(records(&out)[0].attempt, None, "one attempt made");
    assert!(b.is_idle() && started(&out).is_empty());
}

#[test]
fn a_huge_retry_after_is_capped() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    b.handle(t(0), BrokerInput::ProviderDone { call: CallId(0), result: status(429, Some(u64::MAX), None) });
    assert_eq!(records(&drain(&mut b))[0].retry_delay_ms, Some(20_000));
    assert_eq!(b.backing_off(), Some((CallId(0), t(20_000))));
}

#[test]
fn other_failures_are_not_retried() {
    for result in [
        status(400, Some(0), None),
        status(401, None, None),
        status(404, Some(0), None),
        // A connection error, before any response: surfaced (seed 002).
        ProviderResult::error(None, "connection refused"),
    ] {
        let mut b = broker("5");
        submit(&mut b, t(0), 0, A, req(), None);
        drain(&mut b);
        b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: result.clone() });
        let out = drain(&mut b);
        assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::ProviderError))], "{result:?}");
        assert!(b.is_idle());
    }
    // Retries off.
    let config = BrokerConfig { max_retries: 0, ..BrokerConfig::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("5"), "s").expect("config");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: status(503, None, None) });
    let e = replies(&drain(&mut b))[0].1.clone().expect_err("fails");
    assert_eq!(e.message, "HTTP 503: busy");
}

#[test]
fn a_cancel_or_a_departure_during_the_back_off_wins_at_once() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), Some("k"));
    submit(&mut b, t(0), 1, B, req(), None);
    drain(&mut b);
    b.handle(t(10), BrokerInput::ProviderDone { call: CallId(0), result: status(429, None, None) });
    drain(&mut b);
    b.handle(t(20), BrokerInput::Cancel { request: CallId(100), owner: A, token: "k".into() });
    let out = drain(&mut b);
    assert!(
        !out.iter().any(|o| matches!(o, BrokerOutput::CancelProvider { .. })),
        "nothing in flight: {out:?}"
    );
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::CancelledAfterStart))]);
    assert!(out.contains(&BrokerOutput::CancelResult {
        request: CallId(100),
        owner: A,
        outcome: CancelOutcome::AfterStart
    }));
    assert_eq!(records(&out)[0].attempt, Some(1));
    assert_eq!(started(&out).iter().map(|s| s.0).collect::<Vec<_>>(), [CallId(1)], "the waiter, not a retry");
    // A result for the cancelled call now is stray: nothing was in flight.
    b.handle(t(30), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(10, 0, 0))) });
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.stats().stray_results, 1);

    // The owner dies during the back-off: dropped unanswered, lock handed on.
    submit(&mut b, t(40), 2, A, req(), None);
    b.handle(t(50), BrokerInput::ProviderDone { call: CallId(1), result: status(500, None, None) });
    drain(&mut b);
    b.handle(t(60), BrokerInput::OwnerGone { owner: B });
    let out = drain(&mut b);
    assert!(replies(&out).is_empty(), "{out:?}");
    assert_eq!(records(&out)[0].error_code, Some(BrokerErrorCode::CancelledAfterStart));
    assert_eq!(started(&out).iter().map(|s| s.0).collect::<Vec<_>>(), [CallId(2)]);
    // A departure during an attempt: the attempt runs out, is not retried.
    b.handle(t(70), BrokerInput::OwnerGone { owner: A });
    b.handle(t(80), BrokerInput::ProviderDone { call: CallId(2), result: status(503, None, None) });
    let out = drain(&mut b);
    assert!(replies(&out).is_empty() && started(&out).is_empty(), "{out:?}");
    assert!(b.is_idle());
}

#[test]
fn a_clock_jump_past_the_deadline_during_the_back_off_times_out() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    drain(&mut b);
    b.handle(t(59_000), BrokerInput::ProviderDone { call: CallId(0), result: status(429, None, None) });
    assert_eq!(b.backing_off(), Some((CallId(0), t(59_500))));
    b.handle(t(61_000), BrokerInput::Tick);
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::ProviderTimeout))]);
    assert!(
        started(&out).is_empty() && !out.iter().any(|o| matches!(o, BrokerOutput::CancelProvider { .. }))
    );
}

#[test]
fn under_enforce_budget_a_retry_must_still_fit() {
    let config = BrokerConfig { enforce_budget: true, ..BrokerConfig::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("0.01"), "s").expect("config");
    submit(&mut b, t(0), 0, A, req_max(1_000), None);
    let first = drain(&mut b);
    assert_eq!(started(&first), [(CallId(0), 1_000)], "{first:?}");
    // The failed attempt reports usage that eats the budget.
    b.handle(
        t(1),
        BrokerInput::ProviderDone { call: CallId(0), result: status(429, None, Some(usage(66_000, 0, 0))) },
    );
    let out = drain(&mut b);
    let e = replies(&out)[0].1.clone().expect_err("fails");
    assert!(e.message.contains("no longer covers another attempt"), "{}", e.message);
    assert!(b.is_idle());
}

#[test]
fn a_retry_transcript() {
    let config = BrokerConfig { request_timeout: Duration::from_secs(5), ..BrokerConfig::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("1"), "s").expect("config");
    let mut log = Vec::new();
    let mut feed = |b: &mut Broker, now: Instant, input: BrokerInput| {
        log.push(json!({"now_us": now.as_micros(), "input": input}));
        b.handle(now, input);
        for o in drain(b) {
            log.push(json!({"output": o}));
        }
    };
    let submit_input = |call: u64, owner: ClientId, token: Option<&str>| BrokerInput::Submit {
        call: CallId(call),
        owner,
        scope: owner,
        request: req_max(100),
        cancel_token: token.map(Into::into),
    };
    feed(&mut b, t(0), submit_input(0, A, None));
    feed(&mut b, t(0), submit_input(1, B, Some("b")));
    feed(
        &mut b,
        t(200),
        BrokerInput::ProviderDone {
            call: CallId(0),
            result: status(429, Some(1_000), Some(usage(10, 0, 0))),
        },
    );
    feed(&mut b, t(1_200), BrokerInput::Tick);
    feed(&mut b, t(1_300), BrokerInput::ProviderDone { call: CallId(0), result: status(503, None, None) });
    feed(&mut b, t(2_300), BrokerInput::Tick);
    feed(&mut b, t(2_400), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(10, 0, 5))) });
    feed(
        &mut b,
        t(2_500),
        BrokerInput::ProviderDone { call: CallId(1), result: status(500, Some(4_000), None) },
    );
    feed(&mut b, t(2_600), BrokerInput::Cancel { request: CallId(9), owner: B, token: "b".into() });
    insta::assert_json_snapshot!(log);
}

#[test]
fn cancel_before_and_after_start() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), Some("x"));
    submit(&mut b, t(0), 1, A, req(), Some("y"));
    submit(&mut b, t(0), 2, B, req(), Some("y"));
    drain(&mut b);
    // Tokens are per owner: B cannot cancel A's "y".
    b.handle(t(1), BrokerInput::Cancel { request: CallId(100), owner: B, token: "x".into() });
    let out = drain(&mut b);
    assert_eq!(
        out,
        [BrokerOutput::CancelResult { request: CallId(100), owner: B, outcome: CancelOutcome::NotFound }]
    );
    b.handle(t(1), BrokerInput::Cancel { request: CallId(101), owner: A, token: "y".into() });
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(1), Some(BrokerErrorCode::CancelledBeforeStart))]);
    assert!(out.contains(&BrokerOutput::CancelResult {
        request: CallId(101),
        owner: A,
        outcome: CancelOutcome::BeforeStart
    }));
    assert_eq!(b.queued(), 1);
    // After start: the provider request is dropped first, the call answered,
    // and the lock handed on.
    b.handle(t(2), BrokerInput::Cancel { request: CallId(102), owner: A, token: "x".into() });
    let out = drain(&mut b);
    assert!(matches!(out[0], BrokerOutput::CancelProvider { call: CallId(0) }), "{out:?}");
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::CancelledAfterStart))]);
    assert_eq!(started(&out).first().map(|s| s.0), Some(CallId(2)));
    // The token is free again.
    submit(&mut b, t(3), 3, A, req(), Some("x"));
    assert!(replies(&drain(&mut b)).is_empty());
    assert_eq!(b.remaining(), usd("5"), "nothing charged without reported usage");
}

#[test]
fn refusals_before_queueing() {
    let mut b = broker("5");
    let unknown = LlmRequest { model: Some("gpt-0".into()), ..req() };
    submit(&mut b, t(0), 0, A, unknown, None);
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::InvalidRequest))]);
    assert!(started(&out).is_empty());
    submit(&mut b, t(0), 1, A, req(), Some("k"));
    submit(&mut b, t(0), 2, A, req(), Some("k"));
    submit(&mut b, t(0), 1, B, req(), None);
    let out = drain(&mut b);
    assert_eq!(
        codes(&out),
        [
            (CallId(2), Some(BrokerErrorCode::InvalidRequest)),
            (CallId(1), Some(BrokerErrorCode::InvalidRequest))
        ]
    );
    assert_eq!(b.running(), Some(CallId(1)));
    assert_eq!(b.queued(), 0);
}

#[test]
fn owner_death_while_queued_and_mid_call() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(0), 1, A, req(), None);
    submit(&mut b, t(0), 2, B, req(), None);
    drain(&mut b);
    b.handle(t(1), BrokerInput::OwnerGone { owner: A });
    let out = drain(&mut b);
    assert!(replies(&out).is_empty(), "nothing is sent to a departed owner");
    assert_eq!(b.queued(), 1, "A's waiter left the queue");
    assert_eq!(b.running(), Some(CallId(0)), "A's running call runs to its end");
    b.handle(t(5), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(0, 0, 1_000_000))) });
    let out = drain(&mut b);
    assert!(replies(&out).is_empty());
    assert_eq!(started(&out).first().map(|s| s.0), Some(CallId(2)));
    assert_eq!(b.remaining(), usd("4.4"), "its usage is still charged");
    assert_eq!(b.stats().dropped_owner_gone, 1);
}

#[test]
fn partial_usage_on_error_is_charged() {
    let mut b = broker("1");
    submit(&mut b, t(0), 0, A, req(), None);
    b.handle(
        t(1),
        BrokerInput::ProviderDone {
            call: CallId(0),
            result: ProviderResult::error(Some(usage(1_000_000, 0, 0)), "rate limited"),
        },
    );
    let out = drain(&mut b);
    let r = replies(&out);
    let e = r[0].1.as_ref().expect_err("error reply");
    assert_eq!((e.code, e.message.as_str()), (BrokerErrorCode::ProviderError, "rate limited"));
    assert_eq!(b.remaining(), usd("0.85"));
}

#[test]
fn quota_clamps_at_zero() {
    let mut b = broker("0.000001");
    submit(&mut b, t(0), 0, A, req(), None);
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(1_000_000, 0, 0))) });
    drain(&mut b);
    assert_eq!(b.remaining(), Money::ZERO);
    assert_eq!(b.stats().charged, usd("0.15"));
}

#[test]
fn trim_applies_in_the_machine_and_shows_in_metadata() {
    // gpt-4o-mini output 0.6/1M: 0.0006 USD pays 1000 tokens, 900 after
    // the factor.
    let mut b = broker("0.0006");
    submit(&mut b, t(0), 0, A, req_max(2000), None);
    let out = drain(&mut b);
    assert_eq!(started(&out), [(CallId(0), 900)]);
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(0, 0, 900))) });
    let out = drain(&mut b);
    let r = replies(&out);
    let res = r[0].1.as_ref().expect("success");
    assert_eq!(res.metadata.get("trim_applied"), Some(&json!(true)));
    assert_eq!(res.metadata.get("effective_max_tokens"), Some(&json!(900)));
    let wire = res.to_wire().to_value();
    assert_eq!(wire["usage"], json!({"prompt_tokens": 0, "completion_tokens": 900, "total_tokens": 900}));
    // 900 × 0.6 = 540 USD per 1M: 0.00006 left, 100 tokens, 90 after the factor.
    submit(&mut b, t(2), 1, A, req_max(100), None);
    assert_eq!(started(&drain(&mut b)), [(CallId(1), 90)]);
    b.handle(t(3), BrokerInput::ProviderDone { call: CallId(1), result: ok(Some(usage(0, 0, 100))) });
    drain(&mut b);
    // Exhausted: the floor still lets a minimal completion through.
    submit(&mut b, t(4), 2, A, req(), None);
    assert_eq!(started(&drain(&mut b)), [(CallId(2), DEFAULT_MIN_OUTPUT_TOKENS)]);
    b.handle(t(5), BrokerInput::ProviderDone { call: CallId(2), result: ok(None) });
    let out = drain(&mut b);
    let r = replies(&out);
    let md = &r[0].1.as_ref().expect("success").metadata;
    assert_eq!(md.get("quota_floor_applied"), Some(&json!(true)));
    assert_eq!(b.stats().trims, 3);
}

#[test]
fn remaining_context_is_injected_when_asked() {
    let config = BrokerConfig { inject_remaining_context: true, ..Default::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("0.0006"), "s").expect("config");
    submit(&mut b, t(0), 0, A, req(), None);
    let out = drain(&mut b);
    let Some(BrokerOutput::StartProvider { request, .. }) = out.first() else { panic!("{out:?}") };
    let messages = request.messages.to_value();
    assert_eq!(messages.as_array().map(Vec::len), Some(2));
    assert_eq!(messages[0]["role"], "system");
    let note = messages[0]["content"].as_str().unwrap_or_default();
    assert!(note.contains("0.000600 USD") && note.contains("900"), "{note}");
}

/// The seed's race: the lock frees at the very instant the next waiter's
/// queue deadline falls. Rule: timers fire first, so that waiter has timed
/// out, and the lock goes to the next live waiter, or stays free.
#[test]
fn handoff_at_the_instant_a_waiter_times_out() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(0), 1, B, req(), None);
    submit(&mut b, t(1), 2, B, req(), None);
    drain(&mut b);
    let deadline = t(0).saturating_add(DEFAULT_QUEUE_MAX_WAIT);
    assert_eq!(b.poll_timeout(), Some(deadline));
    b.handle(deadline, BrokerInput::ProviderDone { call: CallId(0), result: ok(None) });
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(1), Some(BrokerErrorCode::QueueTimeout)), (CallId(0), None)]);
    assert_eq!(started(&out).first().map(|s| s.0), Some(CallId(2)), "lock handed to the next live waiter");
    // Same, with nobody left behind it: the lock is simply free.
    b.handle(t(1).saturating_add(DEFAULT_QUEUE_MAX_WAIT), BrokerInput::Tick);
    submit(&mut b, t(31_000), 3, A, req(), None);
    drain(&mut b);
    let deadline = t(31_000).saturating_add(DEFAULT_QUEUE_MAX_WAIT);
    b.handle(deadline, BrokerInput::ProviderDone { call: CallId(2), result: ok(None) });
    let out = drain(&mut b);
    assert!(codes(&out).contains(&(CallId(3), Some(BrokerErrorCode::QueueTimeout))));
    assert!(b.is_idle());
    submit(&mut b, deadline, 4, A, req(), None);
    assert_eq!(started(&drain(&mut b)).first().map(|s| s.0), Some(CallId(4)), "the lock was not lost");
}

/// The other half of the race: the head is cancelled at the instant the
/// lock frees, in either order.
#[test]
fn handoff_and_cancel_at_the_same_instant() {
    for cancel_first in [true, false] {
        let mut b = broker("5");
        submit(&mut b, t(0), 0, A, req(), None);
        submit(&mut b, t(0), 1, B, req(), Some("c"));
        submit(&mut b, t(0), 2, B, req(), None);
        drain(&mut b);
        let cancel = BrokerInput::Cancel { request: CallId(9), owner: B, token: "c".into() };
        let done = BrokerInput::ProviderDone { call: CallId(0), result: ok(None) };
        let (first, second) = if cancel_first { (cancel, done) } else { (done, cancel) };
        b.handle(t(5), first);
        b.handle(t(5), second);
        let out = drain(&mut b);
        let starts: Vec<CallId> = started(&out).into_iter().map(|s| s.0).collect();
        if cancel_first {
            assert_eq!(starts, [CallId(2)]);
            assert!(codes(&out).contains(&(CallId(1), Some(BrokerErrorCode::CancelledBeforeStart))));
        } else {
            assert_eq!(starts, [CallId(1), CallId(2)]);
            assert!(codes(&out).contains(&(CallId(1), Some(BrokerErrorCode::CancelledAfterStart))));
        }
        assert_eq!(b.running(), Some(CallId(2)), "the lock went to a live waiter");
        assert_eq!(b.queued(), 0);
    }
}

/// A provider result arriving at exactly the provider deadline loses to
/// the timeout; its usage is still charged.
#[test]
fn result_at_the_provider_deadline() {
    let mut b = broker("5");
    submit(&mut b, t(0), 0, A, req(), None);
    let out = drain(&mut b);
    let Some(BrokerOutput::StartProvider { deadline, .. }) = out.first().cloned() else { panic!("{out:?}") };
    b.handle(
        deadline,
        BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(1_000_000, 0, 0))) },
    );
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::ProviderTimeout))]);
    assert_eq!(b.remaining(), usd("4.85"));
}

#[test]
fn clock_never_runs_backward() {
    let mut b = broker("5");
    submit(&mut b, t(1000), 0, A, req(), None);
    submit(&mut b, t(5), 1, A, req(), None);
    drain(&mut b);
    assert_eq!(b.poll_timeout(), Some(t(1000).saturating_add(DEFAULT_QUEUE_MAX_WAIT)));
}

#[test]
fn inputs_and_outputs_round_trip_through_serde() {
    let mut b = broker("5");
    let input = BrokerInput::Submit {
        call: CallId(0),
        owner: A,
        scope: A,
        request: req_max(7),
        cancel_token: Some("k".into()),
    };
    let text = serde_json::to_string(&input).expect("serialize");
    assert_eq!(serde_json::from_str::<BrokerInput>(&text).expect("deserialize"), input);
    b.handle(t(0), input);
    let done = BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(3, 1, 2))) };
    let text = serde_json::to_string(&done).expect("serialize");
    assert_eq!(serde_json::from_str::<BrokerInput>(&text).expect("deserialize"), done);
    b.handle(t(1), done);
    for out in drain(&mut b) {
        let text = serde_json::to_string(&out).expect("serialize");
        assert_eq!(serde_json::from_str::<BrokerOutput>(&text).expect("deserialize"), out, "{text}");
    }
    let config = BrokerConfig::default();
    let text = serde_json::to_string(&config).expect("serialize");
    assert_eq!(serde_json::from_str::<BrokerConfig>(&text).expect("deserialize"), config);
}

#[test]
fn many_waiters_keep_fifo_and_bounded_timers() {
    let config = BrokerConfig { max_pending: 5000, ..Default::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("1000"), "s").expect("config");
    for i in 0..5000 {
        submit(&mut b, Instant::from_micros(i), i, ClientId(i % 7), req(), Some(&format!("k{i}")));
    }
    drain(&mut b);
    // Every third owner leaves; the rest start in admission order.
    b.handle(Instant::from_micros(5000), BrokerInput::OwnerGone { owner: ClientId(3) });
    let mut order = Vec::new();
    while let Some(call) = b.running() {
        order.push(call.0);
        b.handle(Instant::from_micros(6000), BrokerInput::ProviderDone { call, result: ok(None) });
        drain(&mut b);
    }
    let expected: Vec<u64> = (0..5000).filter(|i| i % 7 != 3 || *i == 0).collect();
    assert_eq!(order, expected);
}

// ---- the checker, and properties over random sessions ---------------------------

/// The checker must be able to fail: a broker that starts two calls at
/// once is caught.
#[test]
#[should_panic(expected = "started while")]
fn checker_catches_two_calls_in_flight() {
    let mut c = check::Checker::new(Setup::from_byte(0b1000));
    c.step(&Step::Submit { slot: 0, model: 0, max_tokens: None, token: None });
    c.step(&Step::Submit { slot: 1, model: 0, max_tokens: None, token: None });
    // Force a second start by poking the broker behind the checker's back:
    // a fresh broker with the second call's id.
    let mut rogue = broker("5");
    submit(&mut rogue, t(0), 1, ClientId(1), req(), None);
    c.broker = rogue;
    c.step(&Step::Tick);
}

#[test]
#[should_panic(expected = "quota differs")]
fn checker_catches_a_wrong_quota() {
    let mut c = check::Checker::new(Setup::from_byte(0b1000));
    c.step(&Step::Submit { slot: 0, model: 0, max_tokens: None, token: None });
    c.step(&Step::ProviderOk { usage: None });
    // A broker whose quota is not what the checker computed.
    c.broker = broker("5");
    c.step(&Step::Tick);
}

fn usage_strategy() -> impl Strategy<Value = Option<Usage>> {
    prop_oneof![
        1 => Just(None),
        4 => (0u64..200_000, 0u64..250_000, 0u64..20_000).prop_map(|(p, c, o)| Some(usage(p, c, o))),
    ]
}

/// A failed attempt with an HTTP status, mostly retryable, with a
/// `Retry-After` from none to far past any deadline.
fn retry_status_strategy() -> impl Strategy<Value = Step> {
    let status = prop_oneof![4 => Just(429u16), 4 => 500u16..600, 1 => 400u16..500];
    let hint = prop_oneof![2 => Just(None), 2 => (0u64..5).prop_map(Some), 2 => (0u64..120_000).prop_map(Some), 1 => any::<u64>().prop_map(Some)];
    (status, hint, usage_strategy()).prop_map(|(status, retry_after_ms, usage)| Step::ProviderStatus {
        usage,
        status,
        retry_after_ms,
    })
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..3, 0u8..5, proptest::option::of(1u32..5000), proptest::option::of(0u8..4))
            .prop_map(|(slot, model, max_tokens, token)| Step::Submit { slot, model, max_tokens, token }),
        2 => (0u8..3, 0u8..4).prop_map(|(slot, token)| Step::Cancel { slot, token }),
        1 => (0u8..3).prop_map(|slot| Step::OwnerGone { slot }),
        4 => usage_strategy().prop_map(|usage| Step::ProviderOk { usage }),
        2 => usage_strategy().prop_map(|usage| Step::ProviderErr { usage }),
        2 => retry_status_strategy(),
        1 => (any::<u16>(), usage_strategy()).prop_map(|(pick, usage)| Step::LateDone { pick, usage }),
        3 => (0u64..4_000, any::<bool>()).prop_map(|(micros, ticks)| Step::Advance { micros, ticks }),
        1 => (0u64..100_000_000, any::<bool>()).prop_map(|(micros, ticks)| Step::Advance { micros, ticks }),
        2 => Just(Step::ToDeadline),
        1 => Just(Step::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_sessions_keep_the_invariants(setup in any::<u8>(), steps in proptest::collection::vec(step_strategy(), 0..120)) {
        check::run(Setup::from_byte(setup), &steps);
    }

    /// Sessions of failing attempts: the checker asserts after every step
    /// that retries start only after their back-off, before the deadline,
    /// at most `max_retries` times, and with the lock held throughout.
    #[test]
    fn retries_never_pass_the_deadline_or_the_maximum(
        setup in any::<u8>(),
        steps in proptest::collection::vec(prop_oneof![
            3 => retry_status_strategy(),
            1 => (0u8..3, 0u8..5, proptest::option::of(0u8..4))
                .prop_map(|(slot, model, token)| Step::Submit { slot, model, max_tokens: None, token }),
            1 => (0u8..3, 0u8..4).prop_map(|(slot, token)| Step::Cancel { slot, token }),
            1 => (0u8..3).prop_map(|slot| Step::OwnerGone { slot }),
            1 => usage_strategy().prop_map(|usage| Step::ProviderOk { usage }),
            3 => (0u64..3_000_000, Just(true)).prop_map(|(micros, ticks)| Step::Advance { micros, ticks }),
            1 => (0u64..100_000_000, any::<bool>()).prop_map(|(micros, ticks)| Step::Advance { micros, ticks }),
            1 => Just(Step::ToDeadline),
        ], 0..120)
    ) {
        check::run(Setup::from_byte(setup), &steps);
    }

    #[test]
    fn charge_is_exact_and_additive(a in usage_strategy(), b in usage_strategy()) {
        let w = weights("0.15", "0.075", "0.6");
        let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
        let sum = usage(a.prompt_tokens + b.prompt_tokens, a.cached_tokens.min(a.prompt_tokens) + b.cached_tokens.min(b.prompt_tokens), a.completion_tokens + b.completion_tokens);
        prop_assert_eq!(
            quota::charge(&a, &w).as_pico() + quota::charge(&b, &w).as_pico(),
            quota::charge(&sum, &w).as_pico()
        );
    }

    #[test]
    fn trim_is_bounded(requested in 1u32..100_000, remaining in 0u64..10_000_000_000_000, out in 0u64..100_000_000, floor in 0u32..64) {
        let safe = quota::safe_output_tokens(Money::from_pico(remaining), Price::from_micros(out), 900_000);
        let t = quota::soft_trim(requested, safe, floor);
        prop_assert!(t.effective <= requested);
        prop_assert!(t.effective >= requested.min(floor));
        prop_assert_eq!(t.trim_applied, t.effective < requested);
        if let Some(s) = safe {
            // What the trim allows never costs more than the factor's share.
            if t.effective as u64 > floor as u64 {
                prop_assert!(u128::from(t.effective) * u128::from(out) * 1_000_000 <= u128::from(remaining) * 900_000);
            }
            prop_assert!(u64::from(t.effective) <= s.max(u64::from(floor)));
        }
    }
}

// ---- queue bounds, budget enforcement, secrets ------------------------------

fn big_req(bytes: usize) -> LlmRequest {
    LlmRequest::new(vec![json!({"role": "user", "content": "x".repeat(bytes)})])
}

#[test]
fn the_queue_is_bounded_by_count_and_by_bytes() {
    let config = BrokerConfig { max_pending: 3, max_pending_bytes: 10_000, ..Default::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("1000"), "s").expect("config");
    // Call 0 runs; 1..=3 wait; 4 is one too many.
    for i in 0..5 {
        submit(&mut b, t(0), i, A, req(), None);
    }
    let out = drain(&mut b);
    assert_eq!(started(&out).len(), 1);
    assert_eq!(codes(&out), [(CallId(4), Some(BrokerErrorCode::QueueFull))]);
    assert_eq!(b.queued(), 3);
    assert!(b.pending_bytes() <= 10_000);
    // Bytes: a call that would pass the byte bound is refused even with
    // room in the count.
    b.handle(t(1), BrokerInput::OwnerGone { owner: A });
    drain(&mut b);
    assert_eq!((b.queued(), b.pending_bytes()), (0, 0));
    submit(&mut b, t(2), 10, B, big_req(6_000), None);
    submit(&mut b, t(2), 11, B, big_req(6_000), None);
    let out = drain(&mut b);
    let r = codes(&out);
    assert_eq!(r, [(CallId(11), Some(BrokerErrorCode::QueueFull))], "{out:?}");
    let Err(e) = &replies(&out)[0].1 else { panic!() };
    assert!(e.message.contains("max_pending_bytes"), "{}", e.message);
    assert!(b.pending_bytes() > 6_000 && b.pending_bytes() <= 10_000);
    // A refused call never reaches the provider.
    assert!(!started(&out).iter().any(|(c, _)| *c == CallId(11)));
}

#[test]
fn planted_missing_byte_bound_lets_bytes_pile_up() {
    let config = BrokerConfig { max_pending: 100, max_pending_bytes: 10_000, ..Default::default() };
    let mut b = Broker::new(config, PricingCatalog::builtin(), usd("1000"), "s").expect("config");
    b.plant_bug(BrokerBug::NoPendingByteBound);
    for i in 0..5 {
        submit(&mut b, t(0), i, A, big_req(6_000), None);
    }
    assert!(b.pending_bytes() > 10_000);
}

#[test]
fn enforce_budget_refuses_what_it_cannot_cover_and_trims_what_it_can() {
    // gpt-4o-mini: input 0.15, output 0.6 USD per 1M tokens.
    let enforce = BrokerConfig { enforce_budget: true, ..Default::default() };
    let mut b = Broker::new(enforce.clone(), PricingCatalog::builtin(), usd("0.0001"), "s").expect("config");
    let r = req_max(1000);
    let prompt = r.messages.len() as u64;
    submit(&mut b, t(0), 0, A, r, None);
    let out = drain(&mut b);
    // 0.0001 USD = 100_000_000 pico; prompt ≤ `prompt` tokens at 150_000
    // pico each; the rest at 600_000 per output token.
    let left = 100_000_000 - prompt * 150_000;
    // The soft trim (0.9 of the remaining, all for output) bites first here.
    let soft = 100_000_000 * 9 / 10 / 600_000;
    assert_eq!(started(&out), [(CallId(0), (left / 600_000).min(soft).min(1000) as u32)]);
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: ok(Some(usage(prompt, 0, 100))) });
    drain(&mut b);
    // Nothing left: refused, no provider call.
    let mut b = Broker::new(enforce, PricingCatalog::builtin(), Money::ZERO, "s").expect("config");
    submit(&mut b, t(0), 0, A, req(), None);
    let out = drain(&mut b);
    assert!(started(&out).is_empty(), "{out:?}");
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::BudgetExhausted))]);
    // The default (the seed): no preflight denial.
    let mut b = broker("0");
    submit(&mut b, t(0), 0, A, req(), None);
    assert_eq!(started(&drain(&mut b)).len(), 1);
}

#[test]
fn abandoned_calls_keep_their_reserve_until_their_usage_comes() {
    let enforce = BrokerConfig { enforce_budget: true, ..Default::default() };
    let mut b = Broker::new(enforce, PricingCatalog::builtin(), usd("0.001"), "s").expect("config");
    submit(&mut b, t(0), 0, A, req_max(1000), Some("k"));
    drain(&mut b);
    b.handle(t(1), BrokerInput::Cancel { request: CallId(99), owner: A, token: "k".into() });
    drain(&mut b);
    assert!(b.reserved() > Money::ZERO);
    b.handle(t(2), BrokerInput::ProviderDone { call: CallId(0), result: ok(None) });
    drain(&mut b);
    assert_eq!(b.reserved(), Money::ZERO);
}

#[test]
fn the_key_is_scrubbed_from_every_result_the_broker_answers() {
    let mut b = broker("1");
    b.set_redactor(Redactor::with_secret("sk-abcdef012345").unwrap());
    submit(&mut b, t(0), 0, A, req(), None);
    submit(&mut b, t(0), 1, A, req(), None);
    drain(&mut b);
    let leaky =
        RawJson::from_text(r#"[{"role":"assistant","content":"\u0073k-abcdef012345"}]"#.into()).unwrap();
    let result = ProviderResult::Ok { messages: leaky, usage: None, model: "sk-abcdef012345".into() };
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result });
    let err = ProviderResult::error(None, "bad key sk-abcdef012345");
    b.handle(t(2), BrokerInput::ProviderDone { call: CallId(1), result: err });
    let out = drain(&mut b);
    let text = format!("{:?}", replies(&out));
    assert!(!text.contains("abcdef012345") && text.contains("[redacted]"), "{text}");
}

proptest! {
    /// Under `enforce_budget`, with usage no larger than the call's bound
    /// (prompt ≤ its bytes, completion ≤ the `max_tokens` sent), the quota
    /// never clamps: no admitted call costs more than what was left.
    #[test]
    fn enforced_budget_never_clamps_with_honest_usage(
        budget in 0u64..2_000_000_000,
        calls in proptest::collection::vec((1u32..5000, 0u64..100, any::<bool>()), 1..20),
    ) {
        let enforce = BrokerConfig { enforce_budget: true, ..Default::default() };
        let mut b = Broker::new(enforce, PricingCatalog::builtin(), Money::from_pico(budget), "s").expect("config");
        let mut charged = 0u64;
        for (i, (max, pct, cancel)) in calls.into_iter().enumerate() {
            let i = i as u64;
            submit(&mut b, t(i * 10), i, A, req_max(max), Some(&format!("k{i}")));
            let out = drain(&mut b);
            let Some((_, sent)) = started(&out).first().copied() else { continue };
            let Some(BrokerOutput::StartProvider { request, .. }) = out.iter().find(|o| matches!(o, BrokerOutput::StartProvider { .. })) else { continue };
            let prompt = request.prompt_bytes() * pct / 100;
            let u = usage(prompt, 0, u64::from(sent) * pct / 100);
            if cancel {
                b.handle(t(i * 10 + 1), BrokerInput::Cancel { request: CallId(1000 + i), owner: A, token: format!("k{i}") });
                drain(&mut b);
            }
            b.handle(t(i * 10 + 2), BrokerInput::ProviderDone { call: CallId(i), result: ok(Some(u)) });
            drain(&mut b);
            charged += 150_000 * u.prompt_tokens + 600_000 * u.completion_tokens;
            prop_assert!(charged <= budget, "charged {} of {}", charged, budget);
        }
    }
}

/// Processes of one child's tree (attached from one connection) share a
/// token scope: one may cancel another's call, a process of another tree
/// may not, and a token names one live call across the whole scope.
#[test]
fn cancel_tokens_are_scoped_to_the_tree_not_the_connection() {
    const ROOT: ClientId = ClientId(1);
    const P1: ClientId = ClientId(1001);
    const P2: ClientId = ClientId(1002);
    const OTHER: ClientId = ClientId(7);
    let mut b = broker("5");
    let sub = |b: &mut Broker, call: u64, owner: ClientId, scope: ClientId| {
        let input = BrokerInput::Submit {
            call: CallId(call),
            owner,
            scope,
            request: req(),
            cancel_token: Some("k".into()),
        };
        b.handle(t(0), input);
    };
    sub(&mut b, 0, P1, ROOT); // runs
    sub(&mut b, 1, P2, ROOT); // same token, same tree: refused
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(1), Some(BrokerErrorCode::InvalidRequest))], "{out:?}");
    sub(&mut b, 2, OTHER, OTHER); // another tree may use it
    drain(&mut b);
    b.handle(t(1), BrokerInput::Cancel { request: CallId(100), owner: ClientId(9), token: "k".into() });
    let out = drain(&mut b);
    assert!(out.contains(&BrokerOutput::CancelResult {
        request: CallId(100),
        owner: ClientId(9),
        outcome: CancelOutcome::NotFound
    }));
    // P2's scope is ROOT: it finds P1's running call.
    b.handle(t(1), BrokerInput::Cancel { request: CallId(101), owner: ROOT, token: "k".into() });
    let out = drain(&mut b);
    assert_eq!(codes(&out), [(CallId(0), Some(BrokerErrorCode::CancelledAfterStart))], "{out:?}");
    // P1 going away does not touch OTHER's call, now running.
    b.handle(t(2), BrokerInput::OwnerGone { owner: P1 });
    assert_eq!(b.running(), Some(CallId(2)));
}

fn with_messages(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    let mut p = serde_json::Map::new();
    p.insert("messages".into(), json!([{"role": "user", "content": "hi"}]));
    if let serde_json::Value::Object(m) = v {
        p.extend(m);
    }
    p
}

#[test]
fn passthrough_params_are_checked_and_errors_name_the_param() {
    let bad = |v: serde_json::Value| wire::parse_llmcmd(&with_messages(v)).expect_err("refused").0;
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    assert!(bad(json!({"top_p": 1.5})).contains("top_p"));
    assert!(bad(json!({"top_p": "x"})).contains("top_p"));
    assert!(bad(json!({"stop": 3})).contains("stop"));
    assert!(bad(json!({"stop": ["a", "b", "c", "d", "e"]})).contains("at most 4"));
    assert!(bad(json!({"stop": ["a", 1]})).contains("stop"));
    assert!(bad(json!({"seed": 1.5})).contains("seed"));
    assert!(bad(json!({"response_format": "json"})).contains("response_format"));
    assert!(bad(json!({"response_format": {"kind": "json"}})).contains("response_format"));
    assert!(bad(json!({"tool_choice": "sometimes", "tools": tools})).contains("tool_choice"));
    assert!(bad(json!({"tool_choice": "auto"})).contains("tool_choice given without tools"));
    let n = bad(json!({"n": 2}));
    assert!(n.contains("n = 2 is refused"), "{n}");
    assert!(bad(json!({"n": 0})).contains("invalid n"));
    assert!(bad(json!({"user": 7})).contains("user"));
    assert!(bad(json!({"max_completion_tokens": 0})).contains("max_completion_tokens must be at least 1"));
    assert!(bad(json!({"max_completion_tokens": -1})).contains("invalid max_completion_tokens"));
    assert!(bad(json!({"max_tokens": 5, "max_completion_tokens": 6})).contains("disagree"));
    let unknown = bad(json!({"frequency_penaltyy": 1}));
    assert!(unknown.starts_with("unknown param \"frequency_penaltyy\""), "{unknown}");
    // Good ones pass, in a canonical order; nulls are dropped.
    let ok = wire::parse_llmcmd(&with_messages(json!({
        "n": 1, "user": "u", "seed": 4, "stop": "x", "top_p": 0, "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": tools, "response_format": null, "max_completion_tokens": 12, "max_tokens": 12,
    })))
    .expect("valid");
    assert_eq!(ok.request.max_tokens, Some(12));
    assert_eq!(
        ok.request.options.expect("options").to_value(),
        json!({"n": 1, "user": "u", "seed": 4, "stop": "x", "top_p": 0, "tool_choice": {"type": "function", "function": {"name": "f"}}})
    );
    let none = wire::parse_llmcmd(&with_messages(json!({}))).expect("valid");
    assert_eq!(none.request.options, None);
}

#[test]
fn max_completion_tokens_is_trimmed_and_sent_in_the_models_field() {
    // 0.0006 USD at gpt-5-mini's 2.0/1M output, safety 0.9: 270 tokens.
    let mut b =
        Broker::new(BrokerConfig::default(), PricingCatalog::builtin(), usd("0.0006"), "s").expect("config");
    let p = wire::parse_llmcmd(&with_messages(json!({"model": "gpt-5-mini", "max_completion_tokens": 1000})))
        .expect("valid");
    b.handle(
        t(0),
        BrokerInput::Submit { call: CallId(0), owner: A, scope: A, request: p.request, cancel_token: None },
    );
    let out = drain(&mut b);
    let request = out
        .iter()
        .find_map(|o| match o {
            BrokerOutput::StartProvider { request, .. } => Some(request.clone()),
            _ => None,
        })
        .expect("started");
    assert_eq!(request.max_tokens_field, MaxTokensField::MaxCompletionTokens);
    assert_eq!(request.max_tokens, 270);
    let body: serde_json::Value = serde_json::from_str(&openai::request_body(&request)).expect("JSON");
    assert_eq!(body["max_completion_tokens"], 270);
    assert!(body.get("max_tokens").is_none(), "{body}");
    // And the default field for a model that names none.
    assert_eq!(
        PricingCatalog::builtin().get("gpt-4o-mini").map(|w| w.max_tokens_field),
        Some(MaxTokensField::MaxTokens)
    );
    let e = PricingCatalog::from_json(r#"{"m": {"input": 1, "output": 2, "max_tokens_field": "max_len"}}"#)
        .expect_err("bad field")
        .to_string();
    assert!(e.contains("max_tokens_field \"max_len\""), "{e}");
}

/// The fuzz corpus inputs written for retries do reach them: a corpus
/// that decoded into something else would pass its replay vacuously.
#[test]
fn the_retry_corpus_inputs_back_off() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/broker_events");
    for (name, retries) in [
        ("retry_429_then_ok", 1),
        ("retries_until_max", 3),
        ("cancel_during_backoff", 0),
        ("owner_dies_during_backoff", 0),
        ("deadline_during_backoff_after_a_jump", 0),
        ("stray_during_backoff_then_not_retried", 1),
    ] {
        let data = std::fs::read(dir.join(name)).expect("corpus file");
        let (setup, script) = data.split_first().expect("a setup byte");
        let mut c = check::Checker::new(Setup::from_byte(*setup));
        let mut backed_off = false;
        for step in check::decode_steps(script) {
            c.step(&step);
            backed_off |= c.broker.backing_off().is_some();
        }
        c.finish();
        let stats = c.broker.stats();
        assert!(backed_off, "{name} never backs off");
        assert_eq!(stats.retries, retries, "{name}: {stats:?}");
    }
}
