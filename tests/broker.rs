//! The LLM broker in the real binary: `airlock run --config` with a
//! `[broker]` section, real python children speaking LLMCMD / QUOTA /
//! CANCEL over the FS proxy, and a fake OpenAI-compatible server on
//! loopback that records what reached it.
//!
//! The fake is steered by the last message's content, a list of
//! `key=value` words: `tag` (a name to find the request by), `delay` (ms
//! before answering), `status`, `prompt`, `cached`, `completion` (the usage
//! reported), `usage=none`, `echo_auth` (the error message quotes the
//! Authorization header, as real providers do for a bad key), `leak=N`
//! (the reply carries the bearer key in shape N: see `leaky`), `huge=N`
//! (a reply of N small JSON values), `fail=N` (the first N requests of
//! the tag get `status`, 429 if none is named, and the rest succeed),
//! `retry_after=V` (sent as a `Retry-After` header with every failure).

mod common;

use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ fake --

#[derive(Debug, Clone)]
struct Seen {
    tag: String,
    model: String,
    max_tokens: Option<u64>,
    auth: Option<String>,
    body: Value,
    arrived: Instant,
    ended: Option<Instant>,
    /// The request was dropped (its connection closed) before the fake
    /// answered it.
    dropped: bool,
}

#[derive(Default)]
struct FakeState {
    seen: Vec<Seen>,
    in_flight: usize,
    max_in_flight: usize,
}

struct Fake {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
}

impl Fake {
    fn start() -> Fake {
        let state: Arc<Mutex<FakeState>> = Arc::default();
        let st = state.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // Its own runtime on its own thread; it lives as long as the test
        // process (each test has its own fake on its own port).
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("addr")).expect("send addr");
                while let Ok((stream, _)) = listener.accept().await {
                    let st = st.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| handle(st.clone(), req));
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                    });
                }
            });
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("fake started");
        Fake { addr, state }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    fn max_in_flight(&self) -> usize {
        self.state.lock().unwrap().max_in_flight
    }

    /// Wait (bounded) until `pred` holds of what the fake saw.
    fn wait_for(&self, what: &str, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = self.seen();
            if pred(&seen) {
                return seen;
            }
            assert!(Instant::now() < deadline, "fake never saw {what}: {seen:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Marks its request ended when dropped: on completion, or when hyper
/// drops the service future because the client closed the connection.
struct InFlight {
    state: Arc<Mutex<FakeState>>,
    index: usize,
    answered: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight -= 1;
            let seen = &mut s.seen[self.index];
            seen.ended = Some(Instant::now());
            seen.dropped = !self.answered;
        }
    }
}

fn words(content: &str) -> std::collections::BTreeMap<String, String> {
    content
        .split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

async fn handle(
    state: Arc<Mutex<FakeState>>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
    let path = req.uri().path().to_string();
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let content = body
        .pointer("/messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let w = words(&content);
    let num = |k: &str, d: u64| w.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let tag = w.get("tag").cloned().unwrap_or_default();
    let earlier;
    let mut guard = {
        let mut s = state.lock().unwrap();
        earlier = s.seen.iter().filter(|x| x.tag == tag).count() as u64;
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
        s.seen.push(Seen {
            tag: tag.clone(),
            model: body["model"].as_str().unwrap_or("").to_string(),
            max_tokens: body["max_tokens"].as_u64(),
            auth: auth.clone(),
            body: body.clone(),
            arrived: Instant::now(),
            ended: None,
            dropped: false,
        });
        InFlight { state: state.clone(), index: s.seen.len() - 1, answered: false }
    };
    tokio::time::sleep(Duration::from_millis(num("delay", 0))).await;
    let usage = json!({
        "prompt_tokens": num("prompt", 10),
        "completion_tokens": num("completion", 5),
        "total_tokens": num("prompt", 10) + num("completion", 5),
        "prompt_tokens_details": {"cached_tokens": num("cached", 0)},
    });
    let status = match w.get("fail") {
        Some(_) if earlier < num("fail", 0) => num("status", 429) as u16,
        Some(_) => 200,
        None => num("status", 200) as u16,
    };
    let reply = if path != "/v1/chat/completions" {
        json!({"error": {"message": format!("no route {path}")}})
    } else if status != 200 {
        let message = if w.contains_key("echo_auth") {
            format!("Incorrect API key provided: {}", auth.as_deref().unwrap_or("none"))
        } else {
            format!("fake failure for {tag}")
        };
        json!({"error": {"message": message, "type": "fake"}, "usage": usage})
    } else {
        let mut r = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": format!("{}-fake", body["model"].as_str().unwrap_or("")),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant",
                "content": format!("tag={tag} max_tokens={}", body["max_tokens"]),
            }}],
        });
        if w.get("usage").map(String::as_str) != Some("none") {
            r["usage"] = usage;
        }
        r
    };
    let status = if path != "/v1/chat/completions" { 404 } else { status };
    let key = auth.as_deref().and_then(|a| a.strip_prefix("Bearer ")).unwrap_or("");
    let (status, text) = match (w.get("leak"), w.get("huge")) {
        (Some(n), _) => leaky(n.parse().unwrap_or(0), key),
        (None, Some(n)) => (200, huge(n.parse().unwrap_or(0), num("width", 0) as usize)),
        _ => (status, reply.to_string()),
    };
    guard.answered = true;
    drop(guard);
    let mut resp = hyper::Response::builder().status(status).header("content-type", "application/json");
    if let Some(v) = w.get("retry_after").filter(|_| status != 200) {
        resp = resp.header("retry-after", v.as_str());
    }
    Ok(resp.body(Full::new(Bytes::from(text))).unwrap())
}

/// A reply that gives `key` back in shape `n`: verbatim in the content
/// (0), every character `\u`-escaped (1), split by one escape (2), escaped
/// twice inside a tool call's JSON arguments (3), in an error message (4),
/// as an object key and the model name (5).
fn leaky(n: u32, key: &str) -> (u16, String) {
    let esc: String = key.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
    let split: String = key
        .chars()
        .enumerate()
        .map(|(i, c)| if i == 5 { format!("\\u{:04x}", c as u32) } else { c.to_string() })
        .collect();
    let twice = esc.replace('\\', "\\\\");
    let msg = |extra: &str, content: &str| {
        format!(
            r#"{{"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"{extra}}}}}],"usage":{{"prompt_tokens":1,"completion_tokens":1}}}}"#
        )
    };
    match n {
        0 => (200, msg("", &format!("here: {key}"))),
        1 => (200, msg("", &format!("here: {esc}"))),
        2 => (200, msg("", &format!("here: {split}"))),
        3 => (
            200,
            msg(
                &format!(
                    r#","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":"{{\"k\":\"{twice}\"}}"}}}}]"#
                ),
                "",
            ),
        ),
        4 => (401, format!(r#"{{"error":{{"message":"Incorrect API key provided: {esc}","type":"auth"}}}}"#)),
        _ => (
            200,
            format!(
                r#"{{"model":"{split}","choices":[{{"message":{{"role":"assistant","{esc}":1,"content":"x"}}}}]}}"#
            ),
        ),
    }
}

/// A reply whose one message holds `n` small values: `0`s, or strings of
/// `width` characters.
fn huge(n: usize, width: usize) -> String {
    let one = if width == 0 { "0,".to_string() } else { format!("\"{}\",", "y".repeat(width)) };
    let mut values = one.repeat(n);
    values.pop();
    format!(
        r#"{{"model":"m","choices":[{{"message":{{"role":"assistant","content":[{values}]}}}}],"usage":{{"prompt_tokens":1,"completion_tokens":1}}}}"#
    )
}

// ---------------------------------------------------------------- runner --

/// Run `airlock run --config airlock.toml --report … [extra] -- cmd` in
/// `dir` with `env` added, killed if it outlives `limit`.
fn run_broker(dir: &Path, config: &str, extra: &[&str], cmd: &[String], env: &[(&str, &str)]) -> Run {
    run_broker_peak(dir, config, extra, cmd, env).0
}

/// [`run_broker`], with airlock's peak resident memory in KiB (`VmHWM`,
/// sampled while it runs).
fn run_broker_peak(
    dir: &Path,
    config: &str,
    extra: &[&str],
    cmd: &[String],
    env: &[(&str, &str)],
) -> (Run, u64) {
    std::fs::write(dir.join("airlock.toml"), config).unwrap();
    let report = dir.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut command = Command::new(airlock());
    command
        .current_dir(dir)
        .args(["run", "--config", "airlock.toml", "--report"])
        .arg(&report)
        // The tests' Python client library, read directly by the child.
        .arg("--sandbox-ro")
        .arg(support(""))
        .args(extra)
        .arg("--")
        .args(cmd)
        .env_remove("AIRLOCK_FD")
        .env("SUPPORT", support(""))
        .env("PYTHONPATH", support(""))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let start = Instant::now();
    let (output, peak) = output_within(command, Duration::from_secs(60));
    let elapsed = start.elapsed();
    let report = match std::fs::read_to_string(&report) {
        Ok(text) => serde_json::from_str(&text).expect("report is JSON"),
        Err(_) => Value::Null,
    };
    (Run { output, report, elapsed }, peak)
}

/// `VmHWM` of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `Command::output`, but killed (and the test failed) past `limit`.
fn output_within(mut command: Command, limit: Duration) -> (std::process::Output, u64) {
    let mut child = command.spawn().expect("airlock starts");
    let mut peak = 0;
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut v);
        v
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(kib) = peak_rss_kib(child.id()) {
            peak = peak.max(kib);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("airlock ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (std::process::Output { status, stdout: out_t.join().unwrap(), stderr: err_t.join().unwrap() }, peak)
}

fn config(fake: &Fake, extra: &str) -> String {
    format!("[broker]\nbase_url = \"{}\"\n{extra}", fake.base_url())
}

fn ok(run: &Run) {
    assert_eq!(run.code(), Some(0), "stdout: {}\nstderr: {}", run.stdout(), run.stderr());
}

fn telemetry(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("telemetry.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad telemetry line {l:?}: {e}")))
        .collect()
}

// ----------------------------------------------------------------- tests --

#[test]
fn calls_from_several_processes_are_serialized_in_admission_order() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    // Each worker attaches a connection of its own, then sends at T0 +
    // 150 ms × i (T0 leaves a second for every interpreter to start), so
    // admission order is worker order however the processes were scheduled.
    let worker = r#"
import sys, time
from fsclient import *
i = int(sys.argv[1])
fd, _ = attach()
time.sleep(max(0.0, T0 + 0.15 * i - time.time()))
r = llm("tag=w%d delay=600" % i, fd=fd, max_tokens=50)
out({"i": i, "resp": r})
"#;
    let main = format!(
        "import time\nt0 = time.time() + 1.0\ncodes = workers('T0 = %r\\n' % t0 + {worker:?}, 4)\nassert codes == [0, 0, 0, 0], codes\n"
    );
    let run =
        run_broker(dir.path(), &config(&fake, "telemetry = \"telemetry.jsonl\"\n"), &[], &python(&main), &[]);
    ok(&run);
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for l in &lines {
        let i = l["i"].as_u64().unwrap();
        assert_eq!(l["resp"]["ok"], true, "{l}");
        let content = l["resp"]["result"]["messages"][0]["content"].as_str().unwrap();
        assert_eq!(content, format!("tag=w{i} max_tokens=50"));
        assert_eq!(l["resp"]["result"]["model"], "gpt-4o-mini-fake");
    }
    let seen = fake.seen();
    let order: Vec<&str> = seen.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(order, ["w0", "w1", "w2", "w3"]);
    assert_eq!(fake.max_in_flight(), 1);
    for pair in seen.windows(2) {
        let ended = pair[0].ended.expect("first ended");
        assert!(pair[1].arrived >= ended, "overlap: {pair:#?}");
    }
    // All four were queued while w0 ran: each found the earlier ones waiting.
    let t = telemetry(dir.path());
    assert_eq!(t.len(), 4, "{t:?}");
    let queued: Vec<u64> = t.iter().map(|r| r["queue_length_at_enqueue"].as_u64().unwrap()).collect();
    assert_eq!(queued, [0, 0, 1, 2]);
    assert!(t[3]["wait_duration_ms"].as_u64().unwrap() >= 1000, "{}", t[3]);
    let b = &run.report["broker"];
    assert_eq!(
        (b["submitted"].as_u64(), b["started"].as_u64(), b["succeeded"].as_u64()),
        (Some(4), Some(4), Some(4))
    );
    run.assert_no_leaks();
}

#[test]
fn a_waiter_past_max_wait_gets_queue_timeout_and_no_provider_call() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "[broker.queue]\nmax_wait_seconds = 0.3\n"),
        &[],
        &python(
            r#"
import time
send({"id": "slow", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=slow delay=1500"}]}})
time.sleep(0.1)
t0 = time.monotonic()
send({"id": "late", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=late"}]}})
first = recv()
waited = time.monotonic() - t0
second = recv()
out({"first": first, "waited": waited, "second": second})
"#,
        ),
        &[],
    );
    ok(&run);
    let l = &run.lines()[0];
    assert_eq!(l["first"]["id"], "late", "{l}");
    assert_eq!(l["first"]["error"]["code"], "queue_timeout", "{l}");
    let waited = l["waited"].as_f64().unwrap();
    assert!((0.25..1.2).contains(&waited), "answered after {waited}s");
    assert_eq!(l["second"]["id"], "slow");
    assert_eq!(l["second"]["ok"], true, "{l}");
    let tags: Vec<String> = fake.seen().into_iter().map(|s| s.tag).collect();
    assert_eq!(tags, ["slow"]);
    assert_eq!(run.report["broker"]["errors_by_code"]["queue_timeout"], 1, "{}", run.report);
}

#[test]
fn a_hanging_provider_times_out_and_its_request_is_dropped() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "[broker.request]\ntimeout_seconds = 0.5\n"),
        &[],
        &python(
            r#"
import time
t0 = time.monotonic()
r = llm("tag=hang delay=30000")
out({"resp": r, "took": time.monotonic() - t0})
# Stay alive, so the drop below is the timeout's and not airlock's exit.
time.sleep(1.5)
"#,
        ),
        &[],
    );
    ok(&run);
    let l = &run.lines()[0];
    assert_eq!(l["resp"]["error"]["code"], "provider_timeout", "{l}");
    let took = l["took"].as_f64().unwrap();
    assert!((0.45..1.5).contains(&took), "answered after {took}s");
    let seen = fake.wait_for("the request dropped", |s| s.len() == 1 && s[0].ended.is_some());
    assert!(seen[0].dropped, "{seen:#?}");
    let held = seen[0].ended.unwrap() - seen[0].arrived;
    assert!(held < Duration::from_millis(1300), "request held {held:?} after a 0.5 s timeout");
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

#[test]
fn cancel_before_start_makes_no_call_and_telemetry_has_a_line_per_request() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "telemetry = \"telemetry.jsonl\"\n"),
        &[],
        &python(
            r#"
send({"id": "a", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=a delay=400 prompt=30 completion=7"}], "max_tokens": 64}})
send({"id": "b", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=b"}], "cancel_token": "tb"}})
send({"id": "c", "op": "CANCEL", "params": {"cancel_token": "tb"}})
out(recv_ids({"a", "b", "c"}))
"#,
        ),
        &[],
    );
    ok(&run);
    let got = &run.lines()[0];
    assert_eq!(got["c"]["result"], json!({"cancelled": true, "state": "before_start"}), "{got}");
    assert_eq!(got["b"]["error"]["code"], "cancelled_before_start", "{got}");
    assert_eq!(got["a"]["ok"], true, "{got}");
    let tags: Vec<String> = fake.seen().into_iter().map(|s| s.tag).collect();
    assert_eq!(tags, ["a"]);

    let t = telemetry(dir.path());
    assert_eq!(t.len(), 2, "{t:?}");
    for r in &t {
        for key in [
            "model",
            "queue_length_at_enqueue",
            "wait_duration_ms",
            "effective_max_tokens",
            "provider_latency_ms",
            "usage",
            "trim_applied",
            "error_code",
        ] {
            assert!(r.get(key).is_some(), "telemetry record lacks {key}: {r}");
        }
        assert_eq!(r["model"], "gpt-4o-mini");
    }
    let (ra, rb) = if t[0]["error_code"].is_null() { (&t[0], &t[1]) } else { (&t[1], &t[0]) };
    assert_eq!(ra["effective_max_tokens"], 64);
    assert!(ra["provider_latency_ms"].as_u64().unwrap() >= 350, "{ra}");
    assert_eq!(ra["usage"]["prompt_tokens"], 30);
    assert_eq!(ra["usage"]["completion_tokens"], 7);
    assert_eq!(ra["trim_applied"], false);
    assert_eq!(rb["error_code"], "cancelled_before_start");
    assert!(rb["effective_max_tokens"].is_null(), "{rb}");
    assert!(rb["usage"].is_null(), "{rb}");
}

#[test]
fn quota_reflects_the_exact_charge_and_the_session_replays() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prices.json"), r#"{"m": {"input": 2.0, "cached": 0.5, "output": 8.0}}"#)
        .unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "pricing = \"prices.json\"\ndefault_model = \"m\"\ninitial_units = 1.0\n"),
        &["--record", "trace.jsonl"],
        &python(
            r#"
out(call("QUOTA"))
out(llm("tag=q prompt=1000 cached=400 completion=100"))
out(call("QUOTA"))
out(llm("tag=e status=400 prompt=500 completion=0"))
out(call("QUOTA"))
"#,
        ),
        &[],
    );
    ok(&run);
    let l = run.lines();
    let before = &l[0]["result"];
    assert_eq!(before["remaining_units"], 1.0, "{before}");
    assert_eq!(before["weights"], json!({"input": 2.0, "cached": 0.5, "output": 8.0}));
    assert_eq!(before["currency"], "USD");
    assert_eq!(before["unit"], "per_1M_tokens");
    assert!(before["session_id"].as_str().is_some_and(|s| !s.is_empty()), "{before}");
    let usage = &l[1]["result"]["usage"];
    assert_eq!((usage["prompt_tokens"].as_u64(), usage["cached_tokens"].as_u64()), (Some(1000), Some(400)));
    // (600 × 2 + 400 × 0.5 + 100 × 8) / 1e6 = 0.0022: cached tokens are
    // inside prompt_tokens and charged once, at the cached price.
    assert_eq!(l[2]["result"]["remaining_units"], 0.9978, "{}", l[2]);
    // An error with reported usage is charged too: 500 × 2 / 1e6 (a 400,
    // which is not retried).
    assert_eq!(l[3]["error"]["code"], "provider_error", "{}", l[3]);
    assert!(l[3]["error"]["message"].as_str().unwrap().contains("HTTP 400"), "{}", l[3]);
    assert_eq!(l[4]["result"]["remaining_units"], 0.9968, "{}", l[4]);
    let b = &run.report["broker"];
    assert_eq!(b["remaining_units"], 0.9968, "{b}");
    assert_eq!(b["initial_units"], 1.0);
    assert_eq!(b["errors_by_code"]["provider_error"], 1);

    // The recorded trace replays against the core, provider results and all.
    let replay =
        Command::new(airlock()).current_dir(dir.path()).args(["replay", "trace.jsonl"]).output().unwrap();
    assert!(
        replay.status.success(),
        "replay failed: {}{}",
        String::from_utf8_lossy(&replay.stdout),
        String::from_utf8_lossy(&replay.stderr)
    );
    let trace = std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap();
    assert!(
        trace.contains("start_provider") && trace.contains("provider_done"),
        "trace lacks the provider calls"
    );
}

#[test]
fn a_small_budget_trims_max_tokens() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prices.json"), r#"{"m": {"input": 2.0, "cached": 0.5, "output": 8.0}}"#)
        .unwrap();
    // safe_out = floor(0.001 / 8 × 1e6 × 0.9) = 112 tokens.
    let run = run_broker(
        dir.path(),
        &config(&fake, "pricing = \"prices.json\"\ndefault_model = \"m\"\ninitial_units = 0.001\n"),
        &[],
        &python(r#"out(llm("tag=t", max_tokens=1000)); out(llm("tag=u", max_tokens=50))"#),
        &[],
    );
    ok(&run);
    let l = run.lines();
    let meta = &l[0]["result"]["metadata"];
    assert_eq!(meta["trim_applied"], true, "{}", l[0]);
    let seen = fake.seen();
    assert_eq!(seen[0].max_tokens, Some(112), "{:?}", seen[0].body);
    assert_eq!(seen[0].model, "m");
    // Under the bound, the request is left alone.
    assert_eq!(seen[1].max_tokens, Some(50));
    assert!(!matches!(l[1]["result"]["metadata"].get("trim_applied"), Some(Value::Bool(true))), "{}", l[1]);
    assert_eq!(run.report["broker"]["trims"], 1);
}

#[test]
fn the_api_key_reaches_the_provider_and_never_a_child() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let key = "sk-test-0123456789abcdef";
    let run = run_broker(
        dir.path(),
        &config(&fake, "api_key_env = \"AIRLOCK_TEST_KEY\"\n"),
        &[],
        &python(
            r#"
import os
out({"env": os.environ.get("AIRLOCK_TEST_KEY"), "other": os.environ.get("AIRLOCK_TEST_OTHER")})
out(llm("tag=k"))
out(llm("tag=bad status=401 echo_auth=1"))
"#,
        ),
        &[("AIRLOCK_TEST_KEY", key), ("AIRLOCK_TEST_OTHER", "kept")],
    );
    ok(&run);
    let l = run.lines();
    assert_eq!(l[0], json!({"env": null, "other": "kept"}));
    assert_eq!(l[1]["ok"], true, "{}", l[1]);
    let seen = fake.seen();
    assert_eq!(seen[0].auth.as_deref(), Some(format!("Bearer {key}").as_str()));
    // The provider quoted the key back; the child sees it redacted.
    let msg = l[2]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("Incorrect API key provided: Bearer [redacted]"), "{msg}");
    assert!(!run.stdout().contains(key), "the key reached the child: {}", run.stdout());
    assert!(!run.stderr().contains("warning"), "a set key is not warned about: {}", run.stderr());
}

#[test]
fn without_an_api_key_no_authorization_is_sent() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "api_key_env = \"AIRLOCK_TEST_UNSET_KEY\"\n"),
        &[],
        &python(r#"out(llm("tag=n"))"#),
        &[],
    );
    ok(&run);
    assert_eq!(run.lines()[0]["ok"], true);
    assert_eq!(fake.seen()[0].auth, None);
    let warning = "airlock: warning: AIRLOCK_TEST_UNSET_KEY (broker.api_key_env) is not set (or not UTF-8): provider calls are sent without an Authorization header";
    assert!(run.stderr().contains(warning), "{}", run.stderr());
    // Empty is as good as unset, and warned about too.
    let run = run_broker(
        dir.path(),
        &config(&fake, "api_key_env = \"AIRLOCK_TEST_EMPTY_KEY\"\n"),
        &[],
        &python(r#"out(llm("tag=e"))"#),
        &[("AIRLOCK_TEST_EMPTY_KEY", "")],
    );
    ok(&run);
    assert!(
        run.stderr().contains("AIRLOCK_TEST_EMPTY_KEY (broker.api_key_env) is empty"),
        "{}",
        run.stderr()
    );
    assert_eq!(fake.seen()[1].auth, None);
}

#[test]
fn cancel_after_start_drops_the_provider_request() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, ""),
        &[],
        &python(
            r#"
import time
send({"id": "a", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=long delay=5000"}], "cancel_token": "t"}})
time.sleep(0.3)
send({"id": "c", "op": "CANCEL", "params": {"cancel_token": "t"}})
out(recv_ids({"a", "c"}))
time.sleep(1.0)
"#,
        ),
        &[],
    );
    ok(&run);
    let got = &run.lines()[0];
    assert_eq!(got["c"]["result"], json!({"cancelled": true, "state": "after_start"}), "{got}");
    assert_eq!(got["a"]["error"]["code"], "cancelled_after_start", "{got}");
    let seen = fake.wait_for("the cancelled request dropped", |s| s.len() == 1 && s[0].ended.is_some());
    assert!(seen[0].dropped, "{seen:#?}");
    let held = seen[0].ended.unwrap() - seen[0].arrived;
    assert!(held < Duration::from_millis(1200), "request held {held:?} after its cancel");
}

#[test]
fn a_child_dying_mid_call_ends_the_session_at_once() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, "telemetry = \"telemetry.jsonl\"\n"),
        &[],
        &python(
            r#"
import os, signal, time
send({"id": "a", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=orphan delay=5000"}]}})
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGKILL)
"#,
        ),
        &[],
    );
    assert_eq!(run.code(), Some(128 + 9), "{}", run.stderr());
    // Nobody is left to answer: airlock drops the call and exits rather
    // than wait out the provider.
    assert!(run.elapsed < Duration::from_secs(3), "{:?}", run.elapsed);
    let seen = fake.wait_for("the orphaned request dropped", |s| s.len() == 1 && s[0].ended.is_some());
    assert!(seen[0].dropped, "{seen:#?}");
    let t = telemetry(dir.path());
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(run.report["broker"]["started"], 1, "{}", run.report);
    run.assert_no_leaks();
}

#[test]
fn config_errors_exit_125_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        ("[broker]\nbase_url = \"http://127.0.0.1:9/v1\"\nmax_wait_seconds = 3\n", "max_wait_seconds"),
        ("[broker]\nbase_url = \"http://127.0.0.1:9/v1\"\nsafety_factor = \"high\"\n", "safety_factor"),
        ("[broker]\napi_key_env = \"K\"\n", "base_url"),
        ("[broker]\nbase_url = \"http://127.0.0.1:9/v1\"\ndefault_model = \"nope\"\n", "nope"),
    ] {
        let run = run_broker(dir.path(), text, &[], &sh("echo child ran"), &[]);
        assert_eq!(run.code(), Some(125), "{text}: {}", run.stderr());
        assert!(run.stderr().contains(needle), "{text}: {}", run.stderr());
        assert!(run.stderr().contains("airlock.toml"), "{}", run.stderr());
        assert_eq!(run.stdout(), "", "the child must not start");
    }
}

#[test]
fn without_a_broker_section_the_ops_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
for op in ["LLMCMD", "QUOTA", "CANCEL"]:
    out(code(call(op, messages=[{"role": "user", "content": "x"}]) if op == "LLMCMD" else call(op)))
"#;
    let run = run_broker(dir.path(), "# nothing configured\n", &[], &python(script), &[]);
    ok(&run);
    assert_eq!(run.lines(), [json!("E_UNSUPPORTED"), json!("E_UNSUPPORTED"), json!("E_UNSUPPORTED")]);
    assert!(run.report.get("broker").is_none(), "{}", run.report);
    // And with no --config at all.
    let run = run_in(dir.path(), &[], &python(script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.lines(), [json!("E_UNSUPPORTED"), json!("E_UNSUPPORTED"), json!("E_UNSUPPORTED")]);
}

#[test]
fn a_nested_airlock_forwards_llmcmd_to_the_outer_broker() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    // The inner level is confined too: its report goes through the outer
    // proxy, so the outer must allow it.
    let inner = r#""$AIRLOCK" run --sandbox-ro "$SUPPORT" --report inner.json -- python3 -c "
import os
from fsclient import *
out({'key': os.environ.get('AIRLOCK_TEST_KEY')})
out(llm('tag=deep', max_tokens=9))
out(call('QUOTA'))
""#;
    let run = run_broker(
        dir.path(),
        &config(&fake, "api_key_env = \"AIRLOCK_TEST_KEY\"\n"),
        &["--allow-rw", "inner.json"],
        &sh(inner),
        &[("AIRLOCK_TEST_KEY", "sk-nested-secret-value")],
    );
    ok(&run);
    let l = run.lines();
    assert_eq!(l[0], json!({"key": null}));
    assert_eq!(l[1]["ok"], true, "{}", l[1]);
    assert_eq!(l[1]["result"]["messages"][0]["content"], "tag=deep max_tokens=9");
    assert_eq!(l[2]["result"]["currency"], "USD", "{}", l[2]);
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].auth.as_deref(), Some("Bearer sk-nested-secret-value"));
    assert_eq!(run.report["broker"]["succeeded"], 1, "{}", run.report);
    let inner: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("inner.json")).unwrap()).unwrap();
    assert!(inner.get("broker").is_none(), "the inner level runs no broker: {inner}");
}

// ------------------------------------------------ hardening (issue 7) --

/// 33 frames of about 1 MiB each (thousands of small messages, the shape
/// that costs fifty times its bytes as a parsed tree, as many as
/// `--max-frame-values` lets one frame hold) queued behind a slow
/// call: the queue takes what `max_pending_bytes` allows, the rest are
/// refused `queue_full` at once and never reach the provider, and airlock's
/// memory stays far below the 1.7 GB this once took.
#[test]
fn a_flood_of_big_llmcmds_is_refused_queue_full_with_bounded_memory() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let (run, peak_kib) = run_broker_peak(
        dir.path(),
        &config(&fake, ""),
        &[],
        &python(
            r#"
import json, struct, os
send({"id": "slow", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=slow delay=30000"}], "cancel_token": "s"}})
# 18 000 messages: 54 000 values, under --max-frame-values (65 536),
# which refuses a frame of more before its tree is built.
small = [{"role": "user", "content": "x" * 20}] * 18000
for i in range(33):
    msgs = small + [{"role": "user", "content": "tag=q%d" % i}]
    payload = json.dumps({"id": "q%d" % i, "op": "LLMCMD", "params": {"messages": msgs}}).encode()
    assert len(payload) < (1 << 20), len(payload)
    send_raw(payload)
# Frames are served in order: by the time this CANCEL is, every LLMCMD
# above has been admitted or refused while "slow" held the lock.
send({"id": "c", "op": "CANCEL", "params": {"cancel_token": "s"}})
got = recv_ids(["slow", "c"] + ["q%d" % i for i in range(33)])
del got["c"]
codes = {k: (v.get("error") or {}).get("code", "ok") for k, v in got.items()}
out({"codes": codes, "size": len(payload)})
"#,
        ),
        &[],
    );
    ok(&run);
    let l = &run.lines()[0];
    let codes = l["codes"].as_object().unwrap();
    let full: Vec<&String> = codes.iter().filter(|(_, c)| *c == "queue_full").map(|(k, _)| k).collect();
    let okd: Vec<&String> = codes.iter().filter(|(_, c)| *c == "ok").map(|(k, _)| k).collect();
    assert!(full.len() >= 20, "{l}");
    assert_eq!(codes["slow"], "cancelled_after_start", "{l}");
    assert_eq!(full.len() + okd.len(), 33, "{l}");
    // Exactly the calls answered ok (and "slow") reached the provider;
    // none refused did.
    let seen: Vec<String> = fake.seen().into_iter().map(|s| s.tag).collect();
    assert_eq!(seen.len(), okd.len() + 1, "{seen:?}");
    for k in &full {
        assert!(!seen.contains(k), "{k} was refused yet reached the provider");
    }
    eprintln!("flood: airlock peaked at {} MiB", peak_kib / 1024);
    assert!(peak_kib < 256 * 1024, "airlock peaked at {} MiB", peak_kib / 1024);
    assert_eq!(run.report["broker"]["errors_by_code"]["queue_full"], full.len(), "{}", run.report);
}

/// A reply near the 16 MiB body cap made of millions of small values is
/// refused (more values than `DEFAULT_MAX_REPLY_VALUES`) without being
/// built as a tree; one of a million 13-character strings (16 MiB) passes
/// to the child, as text. Either way
/// airlock's memory stays a small multiple of the body, not the 380 MB
/// (24×) this once took.
#[test]
fn a_huge_many_valued_reply_keeps_memory_bounded() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let (run, peak_kib) = run_broker_peak(
        dir.path(),
        &config(&fake, ""),
        &[],
        &python(
            r#"
r = llm("tag=h huge=8000000")
out({"code": (r.get("error") or {}).get("code"), "msg": (r.get("error") or {}).get("message", "")[:200]})
r = llm("tag=h2 huge=1000000 width=13")
n = len(r["result"]["messages"][0]["content"]) if r.get("ok") else r
out({"n": n})
"#,
        ),
        &[],
    );
    ok(&run);
    let l = run.lines();
    assert_eq!(l[0]["code"], "provider_error", "{}", l[0]);
    assert!(l[0]["msg"].as_str().unwrap().contains("values"), "{}", l[0]);
    assert_eq!(l[1]["n"], 1_000_000, "{}", l[1]);
    eprintln!("huge reply: airlock peaked at {} MiB", peak_kib / 1024);
    assert!(peak_kib < 128 * 1024, "airlock peaked at {} MiB", peak_kib / 1024);
}

/// Every shape of the key a lying provider sends back — verbatim, fully
/// `\u`-escaped, split by an escape, escaped twice in tool-call
/// arguments, in an error message, as an object key and the model name —
/// reaches the child as `[redacted]`, in the raw frames and in every
/// decoded string (decoding JSON found inside strings once more).
#[test]
fn escaped_and_split_keys_never_reach_the_child() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let key = "sk-test-0123456789abcdef";
    let run = run_broker(
        dir.path(),
        &config(&fake, "api_key_env = \"AIRLOCK_TEST_KEY\"\n"),
        &[],
        &python(
            r#"
for n in range(6):
    out(llm("tag=l%d leak=%d" % (n, n)))
"#,
        ),
        &[("AIRLOCK_TEST_KEY", key)],
    );
    ok(&run);
    let lines = run.lines();
    assert_eq!(lines.len(), 6);
    fn strings(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => {
                out.push(s.clone());
                if let Ok(inner) = serde_json::from_str::<Value>(s) {
                    strings(&inner, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(m) => m.iter().for_each(|(k, x)| {
                out.push(k.clone());
                strings(x, out)
            }),
            _ => {}
        }
    }
    let oracle = airlock_core::broker::Redactor::with_secret(key).unwrap();
    for l in &lines {
        let mut all = Vec::new();
        strings(l, &mut all);
        assert!(all.iter().all(|s| !s.contains(key) && !oracle.reveals(s)), "the key reached the child: {l}");
        assert!(l.to_string().contains("[redacted]"), "nothing was redacted in {l}");
    }
    assert!(!oracle.reveals(&run.stdout()), "{}", run.stdout());
    assert_eq!(fake.seen().len(), 6);
}

/// `enforce_budget = true`: a call the remaining budget cannot cover is
/// refused `budget_exhausted` with no provider call; the default (the
/// seed's "no preflight denials") lets the same call go out.
#[test]
fn enforce_budget_refuses_without_a_call_and_the_default_does_not() {
    let script = r#"out(llm("tag=b", max_tokens=4000))"#;
    // 0.00001 USD: the prompt's bound alone nearly takes it, leaving no
    // room for even the 16-token floor at 0.6 USD per 1M output tokens.
    let budget = "initial_units = 0.00001\n";
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let run = run_broker(
        dir.path(),
        &config(&fake, &format!("{budget}enforce_budget = true\n")),
        &[],
        &python(script),
        &[],
    );
    ok(&run);
    let l = &run.lines()[0];
    assert_eq!(l["error"]["code"], "budget_exhausted", "{l}");
    assert!(l["error"]["message"].as_str().unwrap().contains("enforce_budget"), "{l}");
    assert!(fake.seen().is_empty(), "{:?}", fake.seen());

    let fake = Fake::start();
    let run = run_broker(dir.path(), &config(&fake, budget), &[], &python(script), &[]);
    ok(&run);
    assert_eq!(run.lines()[0]["ok"], true, "{}", run.lines()[0]);
    assert_eq!(fake.seen().len(), 1);
}

// ------------------------------------------------------ airlock llm CLI --

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

#[test]
fn airlock_llm_prints_the_answer_the_json_result_and_the_quota() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
"$AIRLOCK" llm --max-tokens 50 "tag=plain"; echo "rc=$?"
"$AIRLOCK" llm --json --system "be brief" --model gpt-4o-mini "tag=json prompt=1000000 completion=0"
echo "tag=stdin" | "$AIRLOCK" llm -; echo "rc=$?"
"$AIRLOCK" quota; echo "rc=$?"
"$AIRLOCK" quota --json
"#;
    let run = run_broker(dir.path(), &config(&fake, ""), &[], &sh(script), &[]);
    ok(&run);
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "tag=plain max_tokens=50", "{out}");
    assert_eq!(lines[1], "rc=0", "{out}");
    let result: Value = serde_json::from_str(lines[2]).expect("--json prints one JSON object");
    assert_eq!(result["messages"][0]["content"], "tag=json max_tokens=4096", "{result}");
    assert_eq!(result["model"], "gpt-4o-mini-fake");
    assert_eq!(result["usage"]["prompt_tokens"], 1_000_000);
    assert_eq!(lines[3], "tag=stdin max_tokens=4096", "{out}");
    assert_eq!(lines[4], "rc=0", "{out}");
    // 5 USD less 1M input tokens at 0.15 and the small calls' usage.
    assert!(
        lines[5].contains(" USD remaining (model gpt-4o-mini, window session, session airlock-"),
        "{out}"
    );
    assert_eq!(lines[6], "rc=0", "{out}");
    let quota: Value = serde_json::from_str(lines[7]).expect("quota --json");
    let remaining = quota["remaining_units"].as_f64().unwrap();
    assert!(remaining < 4.86 && remaining > 4.8, "{quota}");
    assert_eq!(quota["currency"], "USD");
    // The system message went first, the prompt as the user's.
    let seen = fake.seen();
    let json_call = seen.iter().find(|s| s.tag == "json").expect("json call");
    assert_eq!(
        json_call.body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "tag=json prompt=1000000 completion=0"}])
    );
    let stdin_call = seen.iter().find(|s| s.tag == "stdin").expect("stdin call");
    assert_eq!(stdin_call.body["messages"], json!([{"role": "user", "content": "tag=stdin\n"}]));
}

#[test]
fn airlock_llm_exits_with_a_status_per_error_code() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
"$AIRLOCK" llm --model no-such-model "tag=x"; echo "unpriced=$?"
"$AIRLOCK" llm "tag=fail status=500"; echo "provider_error=$?"
"$AIRLOCK" llm "tag=slow delay=3000"; echo "provider_timeout=$?"
"$AIRLOCK" llm "tag=hold delay=1900" >/dev/null &
sleep 0.5
"$AIRLOCK" llm "tag=late"; echo "queue_timeout=$?"
wait
"$AIRLOCK" llm --max-tokens 0 "tag=zero"; echo "zero=$?"
"$AIRLOCK" llm --no-such-flag x; echo "usage=$?"
"#;
    let cfg = config(&fake, "[broker.queue]\nmax_wait_seconds = 1\n[broker.request]\ntimeout_seconds = 2\n");
    let run = run_broker(dir.path(), &cfg, &[], &sh(script), &[]);
    ok(&run);
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        ["unpriced=3", "provider_error=16", "provider_timeout=15", "queue_timeout=10", "zero=3", "usage=2"],
        "stderr: {}",
        run.stderr()
    );
    let err = run.stderr();
    assert!(err.contains("airlock llm: E_ARG: unknown model"), "{err}");
    assert!(err.contains("airlock llm: provider_error:"), "{err}");
    assert!(err.contains("airlock llm: queue_timeout:"), "{err}");
    // A 500 is retried (after 0.5 s and 1 s of back-off) until the next
    // back-off would pass the 2 s timeout.
    let tags: Vec<String> = fake.seen().into_iter().map(|s| s.tag).collect();
    assert_eq!(tags, ["fail", "fail", "fail", "slow", "hold"]);
}

#[test]
fn a_429_is_retried_after_retry_after_holding_the_lock_and_each_attempt_is_recorded() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    // The first two attempts of `r` get 429 with `Retry-After: 1`; a call
    // made meanwhile waits for the lock until `r` is answered.
    let script = r#"
{ "$AIRLOCK" llm "tag=r fail=2 retry_after=1"; echo "r=$?"; } &
sleep 0.3
"$AIRLOCK" llm "tag=next"; echo "next=$?"
wait
"#;
    let cfg = config(&fake, "telemetry = \"telemetry.jsonl\"\n[broker.request]\nretry_base_ms = 100\n");
    let run = run_broker(dir.path(), &cfg, &[], &sh(script), &[]);
    ok(&run);
    let out = run.stdout();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["next=0", "r=0", "tag=next max_tokens=4096", "tag=r max_tokens=4096"],
        "{}",
        run.stderr()
    );
    let seen = fake.seen();
    let tags: Vec<&str> = seen.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(tags, ["r", "r", "r", "next"], "the waiter starts only once r is done");
    assert_eq!(fake.max_in_flight(), 1);
    // Each back-off honoured Retry-After (1 s, over the 100 ms base).
    for pair in seen[..3].windows(2) {
        let gap = pair[1].arrived.duration_since(pair[0].ended.expect("answered"));
        assert!(gap >= Duration::from_millis(950), "retried after {gap:?}");
    }
    let t = telemetry(dir.path());
    let r: Vec<&Value> = t.iter().filter(|x| x["call_id"] == t[0]["call_id"]).collect();
    assert_eq!(r.len(), 3, "{t:#?}");
    for (i, rec) in r.iter().enumerate() {
        assert_eq!(rec["attempt"], i + 1, "{rec}");
    }
    for rec in &r[..2] {
        assert_eq!(
            (&rec["http_status"], &rec["retry_after_ms"], &rec["retry_delay_ms"], &rec["error_code"]),
            (&json!(429), &json!(1000), &json!(1000), &json!("provider_error")),
            "{rec}"
        );
    }
    assert_eq!(r[2]["error_code"], Value::Null, "{}", r[2]);
    assert!(r[2].get("retry_delay_ms").is_none(), "{}", r[2]);
    // Usage the failed attempts reported is charged too.
    for rec in &r {
        assert!(rec["charged_pico"].as_u64().unwrap() > 0, "{rec}");
    }
}

#[test]
fn retries_that_would_outrun_the_timeout_end_in_provider_error() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    // The provider asks for 2 s; the call has 1 s in all.
    let script = r#"
"$AIRLOCK" llm "tag=busy fail=5 status=503 retry_after=2"; echo "rc=$?"
"#;
    let cfg = config(&fake, "telemetry = \"telemetry.jsonl\"\n[broker.request]\ntimeout_seconds = 1\n");
    let run = run_broker(dir.path(), &cfg, &[], &sh(script), &[]);
    ok(&run);
    assert_eq!(run.stdout().trim(), "rc=16", "{}", run.stderr());
    let err = run.stderr();
    assert!(err.contains("airlock llm: provider_error: HTTP 503"), "{err}");
    assert!(err.contains("would start past the request timeout"), "{err}");
    assert_eq!(fake.seen().len(), 1, "no attempt started that could not finish in time");
    let t = telemetry(dir.path());
    assert_eq!(t.len(), 1, "{t:#?}");
    assert_eq!((&t[0]["http_status"], &t[0]["retry_after_ms"]), (&json!(503), &json!(2000)));
    assert!(t[0].get("retry_delay_ms").is_none());
}

#[test]
fn airlock_cancel_from_another_process_cancels_a_queued_and_a_running_call() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
"$AIRLOCK" llm --cancel-token run "tag=run delay=5000" >/dev/null 2>&1 & run=$!
sleep 0.5
"$AIRLOCK" llm --cancel-token queued "tag=queued" >/dev/null 2>&1 & queued=$!
sleep 0.5
"$AIRLOCK" cancel queued; echo "cancel_queued=$?"
wait $queued; echo "queued=$?"
"$AIRLOCK" cancel queued; echo "again=$?"
"$AIRLOCK" cancel run; echo "cancel_run=$?"
wait $run; echo "run=$?"
"#;
    let run = run_broker(dir.path(), &config(&fake, ""), &[], &sh(script), &[]);
    ok(&run);
    let out = run.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "before_start",
            "cancel_queued=0",
            "queued=13",
            "not_found",
            "again=6",
            "after_start",
            "cancel_run=0",
            "run=14"
        ],
        "stderr: {}",
        run.stderr()
    );
    assert!(run.elapsed < Duration::from_secs(4), "the running call was not dropped: {:?}", run.elapsed);
    let seen = fake.wait_for("the running call dropped", |s| s.iter().any(|s| s.tag == "run" && s.dropped));
    let tags: Vec<&str> = seen.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(tags, ["run"]);
}

#[test]
fn airlock_llm_without_a_broker_exits_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
"$AIRLOCK" llm hi; echo "llm=$?"
"$AIRLOCK" quota; echo "quota=$?"
"$AIRLOCK" cancel t; echo "cancel=$?"
"#;
    let run = run_broker(dir.path(), "# nothing configured\n", &[], &sh(script), &[]);
    ok(&run);
    assert_eq!(run.stdout().lines().collect::<Vec<_>>(), ["llm=4", "quota=4", "cancel=4"]);
    assert!(run.stderr().contains("airlock llm: E_UNSUPPORTED"), "{}", run.stderr());
}

#[test]
fn airlock_llm_outside_airlock_exits_1() {
    let out = Command::new(airlock())
        .args(["llm", "hi"])
        .env_remove("AIRLOCK_FD")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is this process running under `airlock run`?"));
}

#[test]
fn openai_parameters_reach_the_provider_in_the_models_max_tokens_field() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
r = llm("tag=all", model="gpt-5-mini", max_completion_tokens=77, temperature=1, top_p=0.5, stop=["END"], seed=42,
        response_format={"type": "json_object"}, tools=tools, tool_choice="auto", n=1, user="u-1")
out(code(r))
out(code(llm("tag=old", max_completion_tokens=33)))
r = llm("tag=n2", n=2)
out([code(r), r["error"]["message"]])
r = llm("tag=typo", top_k=3)
out([code(r), r["error"]["message"]])
"#;
    let run = run_broker(dir.path(), &config(&fake, ""), &[], &python(script), &[]);
    ok(&run);
    let lines = run.lines();
    assert_eq!(lines[0], Value::Null, "{lines:?}");
    assert_eq!(lines[1], Value::Null, "{lines:?}");
    assert_eq!(lines[2][0], "E_ARG");
    assert!(lines[2][1].as_str().unwrap().contains("n = 2 is refused"), "{lines:?}");
    assert_eq!(lines[3][0], "E_ARG");
    assert!(lines[3][1].as_str().unwrap().starts_with("unknown param \"top_k\""), "{lines:?}");
    let seen = fake.seen();
    let tags: Vec<&str> = seen.iter().map(|s| s.tag.as_str()).collect();
    assert_eq!(tags, ["all", "old"]);
    let all = &seen[0].body;
    assert_eq!(all["model"], "gpt-5-mini");
    assert_eq!(all["max_completion_tokens"], 77);
    assert!(all.get("max_tokens").is_none(), "{all}");
    for (k, v) in [
        ("temperature", json!(1.0)),
        ("top_p", json!(0.5)),
        ("stop", json!(["END"])),
        ("seed", json!(42)),
        ("response_format", json!({"type": "json_object"})),
        ("tool_choice", json!("auto")),
        ("n", json!(1)),
        ("user", json!("u-1")),
    ] {
        assert_eq!(all[k], v, "{k} in {all}");
    }
    assert_eq!(all["tools"][0]["function"]["name"], "f");
    // A model without a field in the catalog gets max_tokens, whichever name the child used.
    let old = &seen[1].body;
    assert_eq!(old["max_tokens"], 33, "{old}");
    assert!(old.get("max_completion_tokens").is_none(), "{old}");
}

/// What each of `pid`'s descriptors is (`socket:[INODE]`, a path, …);
/// a directory that cannot be read fails the test.
fn descriptor_targets(pid: u32) -> std::collections::BTreeSet<String> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("cannot list airlock's descriptors: {e}"));
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.display().to_string())
        .collect()
}

/// The TCP connections of `pid`'s network namespace to `port` on
/// loopback, as `socket:[INODE]`.
fn tcp_sockets_to(pid: u32, port: u16) -> Vec<String> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[2] == remote).then(|| format!("socket:[{}]", f[9]))
        })
        .collect()
}

/// Descriptors counted in `/proc/<airlock>/fd`, not modelled: a flood of
/// provider calls (timed out, retried, cancelled after start) and of
/// connections each queueing a call keeps airlock within
/// `--max-descriptors` of what it held when the child started, and once
/// every call has ended it holds what it held then.
#[test]
fn a_provider_call_flood_keeps_descriptors_within_max_descriptors() {
    let fake = Fake::start();
    let dir = tempfile::tempdir().unwrap();
    // 16 of the 48 kept for files and provider calls: 32 for connections.
    let (max, reserve) = (48u64, 16u64);
    let script = r#"
import os, time
out("started")
time.sleep(0.3)
# Timed out: each call's provider connection is dropped at the timeout.
for i in range(8):
    r = llm("tag=t%d delay=30000" % i, id="t%d" % i)
    assert r["error"]["code"] == "provider_timeout", r
# Retried: two 429s, then an answer; three provider requests each.
for i in range(8):
    r = llm("tag=r%d fail=2 retry_after=0" % i, id="r%d" % i)
    assert r["ok"], r
# Cancelled after the provider request started.
for i in range(8):
    send({"id": "c%d" % i, "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=c%d delay=30000" % i}], "cancel_token": "k%d" % i}})
    time.sleep(0.1)
    send({"id": "x%d" % i, "op": "CANCEL", "params": {"cancel_token": "k%d" % i}})
    got = recv_ids(["c%d" % i, "x%d" % i])
    assert got["c%d" % i]["error"]["code"] == "cancelled_after_start", got
# Connections, each with a call queued behind a slow one, past the bound.
send({"id": "slow", "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=slow delay=30000"}], "cancel_token": "s"}})
conns, refused = [], 0
for i in range(100):
    try:
        fd, resp = attach()
    except EOFError:
        refused += 1
        continue
    send({"id": "q%d" % i, "op": "LLMCMD", "params": {"messages": [{"role": "user", "content": "tag=q%d" % i}]}}, fd=fd)
    conns.append(fd)
out({"attached": len(conns), "refused": refused})
out("flooded")
time.sleep(0.5)
send({"id": "cs", "op": "CANCEL", "params": {"cancel_token": "s"}})
# fd 3 carries each refused attach's answer, then the two awaited here.
refusals, got = [], {}
while len(got) < 2:
    r = recv()
    if r["id"] == "a":
        refusals.append(r["error"]["message"])
    else:
        got[r["id"]] = r
codes = {}
for fd in conns:
    c = (recv(fd).get("error") or {}).get("code", "ok")
    codes[c] = codes.get(c, 0) + 1
    os.close(fd)
out({"slow": got["slow"]["error"]["code"], "codes": codes, "limit": sum("--max-descriptors" in m for m in refusals)})
time.sleep(1)
out("drained")
time.sleep(1)
"#;
    std::fs::write(
        dir.path().join("airlock.toml"),
        config(&fake, "[broker.request]\ntimeout_seconds = 0.2\nretry_base_ms = 10\n"),
    )
    .unwrap();
    let mut child = Command::new(airlock())
        .current_dir(dir.path())
        .args(["run", "--config", "airlock.toml", "--sandbox-ro"])
        .arg(support(""))
        .args(["--max-descriptors", &max.to_string(), "--descriptor-reserve", &reserve.to_string()])
        .args(["--max-clients", "1000", "--"])
        .args(python(script))
        .env_remove("AIRLOCK_FD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlock starts");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut stderr = child.stderr.take().unwrap();
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let (mut start, mut peak, mut after) = (None, 0, None);
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        // Once airlock has exited its descriptors are gone: a count then
        // is no sample. While the child runs, each must read something.
        let now = try_descriptors(pid);
        while let Ok(line) = rx.try_recv() {
            match line.as_str() {
                "\"started\"" => start = Some((descriptors(pid), descriptor_targets(pid))),
                "\"drained\"" => {
                    after = Some((
                        descriptors(pid),
                        descriptor_targets(pid),
                        tcp_sockets_to(pid, fake.addr.port()),
                    ))
                }
                _ => {}
            }
            lines.push(line);
        }
        if start.is_some() && after.is_none() {
            match now {
                Ok(n) => peak = peak.max(n),
                // Between "started" and "drained" airlock is running.
                Err(e) => panic!("cannot count airlock's descriptors during the flood: {e}"),
            }
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "airlock ran past 60 s: {lines:?}");
        std::thread::sleep(Duration::from_millis(2));
    };
    let stderr = err_t.join().unwrap();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
        lines.push(line);
    }
    assert_eq!(status.code(), Some(0), "{lines:?}\n{stderr}");
    let (start, at_start) = start.expect("the child started");
    let (after, at_end, to_provider) = after.expect("the child drained");
    eprintln!("descriptors: {start} at start, {peak} at peak, {after} after (--max-descriptors {max})");
    assert!(
        peak <= start + max,
        "airlock held {peak} descriptors, {start} at start, --max-descriptors {max}"
    );
    // What is left over is at most the provider client's one idle
    // keep-alive connection (calls run one at a time, so it reuses one).
    let new: Vec<&String> = at_end.difference(&at_start).collect();
    assert!(
        new.len() <= 1 && new.iter().all(|t| to_provider.contains(t)),
        "airlock holds {new:?} after the flood that it did not at start; its connections to the provider: {to_provider:?}"
    );
    assert!(after <= start + 1, "{after} descriptors after the flood, {start} before");
    let flood: Value = serde_json::from_str(&lines[1]).unwrap();
    let end: Value = serde_json::from_str(&lines[3]).unwrap();
    assert!(flood["refused"].as_u64().unwrap() > 0 && end["limit"].as_u64().unwrap() > 0, "{lines:?}");
    assert!(flood["attached"].as_u64().unwrap() > 0, "{lines:?}");
    // Its 0.2 s may run out before the attaches are done.
    assert!(
        ["cancelled_after_start", "provider_timeout"].contains(&end["slow"].as_str().unwrap_or("")),
        "{lines:?}"
    );
    let answered: u64 = end["codes"].as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert_eq!(Some(answered), flood["attached"].as_u64(), "every queued call is answered: {lines:?}");
    let seen = fake.seen();
    let count = |p: &str| seen.iter().filter(|s| s.tag.starts_with(p)).count();
    assert_eq!((count("t"), count("r"), count("c")), (8, 24, 8), "{seen:#?}");
    assert!(seen.iter().filter(|s| s.tag.starts_with('t') || s.tag.starts_with('c')).all(|s| s.dropped));
}
