//! A budget that is a bound (issue 40): under `enforce_budget` a call whose
//! usage is unknown is charged its reserve, media parts are priced by a
//! stated bound or refused, and advisory mode says once when the budget
//! is passed.

use super::*;
use proptest::prelude::*;
use serde_json::json;

const A: ClientId = ClientId(1);

fn t(ms: u64) -> Instant {
    Instant::from_micros(ms * 1000)
}

fn usd(s: &str) -> Money {
    Money::from_usd_str(s).expect("test amount")
}

fn enforcing(initial: &str, catalog: PricingCatalog) -> Broker {
    let config = BrokerConfig { enforce_budget: true, ..BrokerConfig::default() };
    Broker::new(config, catalog, usd(initial), "s").expect("config")
}

fn drain(b: &mut Broker) -> Vec<BrokerOutput> {
    std::iter::from_fn(|| b.poll_output()).collect()
}

fn submit(b: &mut Broker, now: Instant, call: u64, request: LlmRequest) {
    let token = Some(format!("k{call}"));
    b.handle(
        now,
        BrokerInput::Submit { call: CallId(call), owner: A, scope: A, request, cancel_token: token },
    );
}

fn cancel(b: &mut Broker, now: Instant, call: u64) {
    b.handle(
        now,
        BrokerInput::Cancel { request: CallId(10_000 + call), owner: A, token: format!("k{call}") },
    );
}

fn req(max: u32) -> LlmRequest {
    LlmRequest { max_tokens: Some(max), ..LlmRequest::new(vec![json!({"role": "user", "content": "hi"})]) }
}

fn ok(usage: Option<Usage>) -> ProviderResult {
    ProviderResult::Ok {
        messages: RawJson::from_value(&json!([{"role": "assistant", "content": "x"}])),
        usage,
        model: "gpt-4o-mini".into(),
    }
}

fn usage(prompt: u64, completion: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        cached_tokens: 0,
        completion_tokens: completion,
        total_tokens: prompt + completion,
    }
}

/// The request of the one `StartProvider` in `out`.
fn started(out: &[BrokerOutput]) -> Option<ProviderRequest> {
    out.iter().find_map(|o| match o {
        BrokerOutput::StartProvider { request, .. } => Some(request.clone()),
        _ => None,
    })
}

fn records(out: &[BrokerOutput]) -> Vec<TelemetryRecord> {
    out.iter()
        .filter_map(|o| match o {
            BrokerOutput::Telemetry(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn error_of(out: &[BrokerOutput]) -> Option<BrokerError> {
    out.iter().find_map(|o| match o {
        BrokerOutput::Reply { outcome: Err(e), .. } => Some(e.clone()),
        _ => None,
    })
}

/// gpt-4o-mini's worst case for `request`: a byte a prompt token at 0.15
/// USD per 1M, `max_tokens` at 0.6.
fn worst(request: &ProviderRequest, media_tokens: u64) -> u64 {
    (request.prompt_bytes() + u64::from(request.media_parts) * media_tokens) * 150_000
        + u64::from(request.max_tokens) * 600_000
}

#[test]
fn a_cancelled_call_without_usage_is_charged_its_reserve() {
    let mut b = enforcing("0.01", PricingCatalog::builtin());
    submit(&mut b, t(0), 0, req(1000));
    let request = started(&drain(&mut b)).expect("started");
    cancel(&mut b, t(1), 0);
    drain(&mut b);
    b.handle(
        t(2),
        BrokerInput::ProviderDone { call: CallId(0), result: ProviderResult::error(None, "dropped") },
    );
    let out = drain(&mut b);
    let r = records(&out).pop().expect("a record");
    assert!(r.dropped_usage_unknown && r.reserve_charged, "{r:?}");
    assert_eq!(r.charged.as_pico(), worst(&request, 0));
    assert_eq!(b.remaining().as_pico(), 10_000_000_000 - worst(&request, 0));
    assert_eq!(b.reserved(), Money::ZERO);
    assert_eq!(b.stats().reserves_charged, 1);
}

#[test]
fn a_timed_out_call_without_usage_is_charged_its_reserve_and_late_usage_its_usage() {
    let mut b = enforcing("0.01", PricingCatalog::builtin());
    submit(&mut b, t(0), 0, req(1000));
    let request = started(&drain(&mut b)).expect("started");
    // Past the request timeout: given up on.
    let late = t(DEFAULT_REQUEST_TIMEOUT.as_millis() as u64 + 1);
    b.handle(late, BrokerInput::Tick);
    drain(&mut b);
    submit(&mut b, late, 1, req(1000));
    assert!(started(&drain(&mut b)).is_some());
    b.handle(
        late,
        BrokerInput::ProviderDone { call: CallId(0), result: ProviderResult::error(None, "dropped") },
    );
    let charged_first = records(&drain(&mut b)).pop().expect("a record").charged;
    assert_eq!(charged_first.as_pico(), worst(&request, 0));
    // The second, started after the first was given up on, times out too,
    // but its usage comes after all: that is what it is charged.
    let late2 = late.saturating_add(DEFAULT_REQUEST_TIMEOUT).saturating_add(Duration::from_millis(1));
    b.handle(late2, BrokerInput::Tick);
    drain(&mut b);
    b.handle(late2, BrokerInput::ProviderDone { call: CallId(1), result: ok(Some(usage(2, 3))) });
    let r = records(&drain(&mut b)).pop().expect("a record");
    assert!(r.late_usage && !r.reserve_charged, "{r:?}");
    assert_eq!(r.charged.as_pico(), 2 * 150_000 + 3 * 600_000);
}

#[test]
fn unknown_usage_is_charged_only_where_the_provider_may_have_billed() {
    let cases = [
        (ok(None), true),
        (ProviderResult::error(None, "connection reset"), true),
        (
            ProviderResult::Err {
                usage: None,
                message: "bad".into(),
                status: Some(200),
                retry_after_ms: None,
            },
            true,
        ),
        (
            ProviderResult::Err {
                usage: None,
                message: "no".into(),
                status: Some(400),
                retry_after_ms: None,
            },
            false,
        ),
        (ok(Some(usage(1, 1))), false),
    ];
    for (result, reserve) in cases {
        let mut b = enforcing("0.01", PricingCatalog::builtin());
        submit(&mut b, t(0), 0, req(100));
        let request = started(&drain(&mut b)).expect("started");
        b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: result.clone() });
        let r = records(&drain(&mut b)).pop().expect("a record");
        assert_eq!(r.reserve_charged, reserve, "{result:?}");
        if reserve {
            assert_eq!(r.charged.as_pico(), worst(&request, 0), "{result:?}");
        }
    }
    // Advisory mode charges what is reported, and nothing else.
    let mut b =
        Broker::new(BrokerConfig::default(), PricingCatalog::builtin(), usd("1"), "s").expect("config");
    submit(&mut b, t(0), 0, req(100));
    drain(&mut b);
    b.handle(t(1), BrokerInput::ProviderDone { call: CallId(0), result: ok(None) });
    assert_eq!(b.stats().charged, Money::ZERO);
}

#[test]
fn the_planted_bug_releases_the_reserve_unpaid() {
    let mut b = enforcing("0.01", PricingCatalog::builtin());
    b.plant_bug(BrokerBug::ReleaseReserveOnCancel);
    submit(&mut b, t(0), 0, req(1000));
    drain(&mut b);
    cancel(&mut b, t(1), 0);
    drain(&mut b);
    b.handle(
        t(2),
        BrokerInput::ProviderDone { call: CallId(0), result: ProviderResult::error(None, "dropped") },
    );
    drain(&mut b);
    assert_eq!(b.remaining(), usd("0.01"));
}

fn image_request() -> LlmRequest {
    let params = json!({
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        ]}],
    });
    let serde_json::Value::Object(params) = params else { unreachable!() };
    wire::parse_llmcmd(&params).expect("valid").request
}

#[test]
fn media_parts_are_counted_and_refused_under_enforce_without_a_bound() {
    assert_eq!(image_request().media_parts, 2);
    let mut b = enforcing("1", PricingCatalog::builtin());
    submit(&mut b, t(0), 0, image_request());
    let out = drain(&mut b);
    assert!(started(&out).is_none(), "{out:?}");
    let e = error_of(&out).expect("refused");
    assert_eq!(e.code, BrokerErrorCode::InvalidRequest);
    assert!(e.message.contains("media_tokens") && e.message.contains("gpt-4o-mini"), "{e:?}");
    // Advisory mode passes them on: nothing to bound.
    let mut b =
        Broker::new(BrokerConfig::default(), PricingCatalog::builtin(), usd("1"), "s").expect("config");
    submit(&mut b, t(0), 0, image_request());
    assert!(started(&drain(&mut b)).is_some());
}

#[test]
fn a_stated_media_bound_is_part_of_the_worst_case() {
    let mut catalog = PricingCatalog::builtin();
    let mut w = *catalog.get("gpt-4o-mini").expect("priced");
    w.media_tokens = Some(40_000);
    catalog.insert("gpt-4o-mini", w);
    let mut b = enforcing("1", catalog.clone());
    submit(&mut b, t(0), 0, image_request());
    let request = started(&drain(&mut b)).expect("started");
    assert_eq!(request.media_parts, 2);
    cancel(&mut b, t(1), 0);
    drain(&mut b);
    b.handle(
        t(2),
        BrokerInput::ProviderDone { call: CallId(0), result: ProviderResult::error(None, "dropped") },
    );
    let r = records(&drain(&mut b)).pop().expect("a record");
    assert_eq!(r.charged.as_pico(), worst(&request, 40_000));
    // A budget that covers the text but not the images refuses the call.
    let tight = Money::from_pico(worst(&request, 0) + 1_000_000);
    let config = BrokerConfig { enforce_budget: true, ..BrokerConfig::default() };
    let mut b = Broker::new(config, catalog, tight, "s").expect("config");
    submit(&mut b, t(0), 0, image_request());
    let out = drain(&mut b);
    assert_eq!(error_of(&out).map(|e| e.code), Some(BrokerErrorCode::BudgetExhausted), "{out:?}");
}

#[test]
fn the_catalog_reads_media_tokens() {
    let c = PricingCatalog::from_json(r#"{"m": {"input": 1, "output": 2, "media_tokens": 1105}}"#).unwrap();
    assert_eq!(c.get("m").unwrap().media_tokens, Some(1105));
    let e = PricingCatalog::from_json(r#"{"m": {"input": 1, "output": 2, "media_tokens": -1}}"#).unwrap_err();
    assert!(e.to_string().contains("media_tokens"), "{e}");
    let e =
        PricingCatalog::from_json(r#"{"m": {"input": 1, "output": 2, "media_tokens": 1.5}}"#).unwrap_err();
    assert!(e.to_string().contains("media_tokens"), "{e}");
}

#[test]
fn advisory_mode_says_once_that_the_budget_is_passed() {
    let mut b = Broker::new(BrokerConfig::default(), PricingCatalog::builtin(), usd("0.000001"), "s")
        .expect("config");
    let mut said = 0;
    for i in 0..4 {
        submit(&mut b, t(i * 10), i, req(100));
        drain(&mut b);
        b.handle(
            t(i * 10 + 1),
            BrokerInput::ProviderDone { call: CallId(i), result: ok(Some(usage(10, 10))) },
        );
        for o in drain(&mut b) {
            if let BrokerOutput::BudgetPassed { initial, charged } = o {
                assert_eq!(initial, usd("0.000001"));
                assert!(charged > initial);
                said += 1;
            }
        }
    }
    assert_eq!(said, 1);
    assert!(b.stats().budget_passed);
    // Under enforce_budget the budget is never passed, and never said.
    let mut b = enforcing("0.000001", PricingCatalog::builtin());
    submit(&mut b, t(0), 0, req(100));
    let out = drain(&mut b);
    assert!(!out.iter().any(|o| matches!(o, BrokerOutput::BudgetPassed { .. })));
}

proptest! {
    /// Invariant 15 for one broker: calls that complete (reporting their
    /// usage or not) or are cancelled (the provider billing what it had
    /// generated, reporting it or not), each billing no more than its
    /// worst case: the provider never bills more than the budget.
    #[test]
    fn the_provider_never_bills_past_an_enforced_budget(
        budget in 0u64..3_000_000_000,
        calls in proptest::collection::vec((1u32..3000, 0u64..=100, 0u8..4), 1..25),
    ) {
        let mut b = Broker::new(
            BrokerConfig { enforce_budget: true, ..BrokerConfig::default() },
            PricingCatalog::builtin(),
            Money::from_pico(budget),
            "s",
        ).expect("config");
        let mut billed = 0u64;
        for (i, (max, pct, how)) in calls.into_iter().enumerate() {
            let i = i as u64;
            submit(&mut b, t(i * 10), i, req(max));
            let Some(request) = started(&drain(&mut b)) else { continue };
            let generated = usage(request.prompt_bytes(), u64::from(request.max_tokens) * pct / 100);
            billed += generated.prompt_tokens * 150_000 + generated.completion_tokens * 600_000;
            let result = match how {
                0 => ok(Some(generated)),
                1 => ok(None),
                2 => {
                    cancel(&mut b, t(i * 10 + 1), i);
                    drain(&mut b);
                    ProviderResult::error(None, "dropped")
                }
                _ => {
                    cancel(&mut b, t(i * 10 + 1), i);
                    drain(&mut b);
                    ProviderResult::error(Some(generated), "dropped")
                }
            };
            b.handle(t(i * 10 + 2), BrokerInput::ProviderDone { call: CallId(i), result });
            drain(&mut b);
            prop_assert!(billed <= budget, "billed {} of {}", billed, budget);
        }
    }
}
