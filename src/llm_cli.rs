//! `airlock llm`, `airlock quota`, `airlock cancel`: the broker client for
//! scripts running under airlock, each over an attached connection of its
//! own (like `airlock fs`), exiting with a status per error code.

use crate::client::{Client, ClientError};
use airlock_core::fsproxy::wire::ErrorCode;
use serde_json::{Map, Value};
use std::io::{Read, Write};

/// Exit statuses (docs/broker.md, "airlock llm"): one per protocol code a
/// script may want to act on, clear of 2 (clap's usage errors) and of 125+
/// (shells).
pub mod status {
    pub const OK: i32 = 0;
    /// No connection, a broken one, or an answer that made no sense.
    pub const TRANSPORT: i32 = 1;
    /// `E_ARG`: bad params or an unpriced model.
    pub const ARG: i32 = 3;
    /// `E_UNSUPPORTED`: the session runs no broker.
    pub const UNSUPPORTED: i32 = 4;
    /// Any other `E_*` code (`E_IO` from an intermediate whose upstream closed, ...).
    pub const OTHER: i32 = 5;
    /// `airlock cancel`: no live call carries the token.
    pub const NOT_FOUND: i32 = 6;
    pub const QUEUE_TIMEOUT: i32 = 10;
    pub const QUEUE_FULL: i32 = 11;
    pub const BUDGET_EXHAUSTED: i32 = 12;
    pub const CANCELLED_BEFORE_START: i32 = 13;
    pub const CANCELLED_AFTER_START: i32 = 14;
    pub const PROVIDER_TIMEOUT: i32 = 15;
    pub const PROVIDER_ERROR: i32 = 16;
}

/// The exit status for a failed broker op.
pub fn exit_status(e: &ClientError) -> i32 {
    match e.code() {
        None => status::TRANSPORT,
        Some(code) => match code {
            ErrorCode::Arg => status::ARG,
            ErrorCode::Unsupported => status::UNSUPPORTED,
            ErrorCode::QueueTimeout => status::QUEUE_TIMEOUT,
            ErrorCode::QueueFull => status::QUEUE_FULL,
            ErrorCode::BudgetExhausted => status::BUDGET_EXHAUSTED,
            ErrorCode::CancelledBeforeStart => status::CANCELLED_BEFORE_START,
            ErrorCode::CancelledAfterStart => status::CANCELLED_AFTER_START,
            ErrorCode::ProviderTimeout => status::PROVIDER_TIMEOUT,
            ErrorCode::ProviderError => status::PROVIDER_ERROR,
            ErrorCode::NoEnt | ErrorCode::Perm | ErrorCode::Io | ErrorCode::Closed | ErrorCode::Range => {
                status::OTHER
            }
        },
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct LlmArgs {
    /// The model (the broker's `default_model` when absent).
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Most tokens to generate (the broker may trim it to the budget).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u32>,
    /// A system message sent before the prompt.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Print the whole result object (messages, usage, model, metadata).
    #[arg(long)]
    pub json: bool,
    /// Name the call so `airlock cancel T` (from any process of this child's tree) can cancel it.
    #[arg(long, value_name = "T")]
    pub cancel_token: Option<String>,
    /// The prompt; `-` or absent: read it from stdin.
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,
}

fn connect(cmd: &str) -> Result<Client, i32> {
    Client::connect().map_err(|e| {
        eprintln!("airlock {cmd}: connecting to the airlock proxy: {e}");
        status::TRANSPORT
    })
}

fn fail(cmd: &str, e: &ClientError) -> i32 {
    eprintln!("airlock {cmd}: {e}");
    exit_status(e)
}

fn print(out: &str) -> i32 {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => status::OK,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => status::OK,
        Err(e) => {
            eprintln!("airlock: writing stdout: {e}");
            status::TRANSPORT
        }
    }
}

/// The `LLMCMD` params for `args` with `prompt` as the user message.
pub fn llm_params(args: &LlmArgs, prompt: String) -> Map<String, Value> {
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    messages.push(serde_json::json!({"role": "user", "content": prompt}));
    let mut params = Map::new();
    params.insert("messages".into(), Value::Array(messages));
    if let Some(m) = &args.model {
        params.insert("model".into(), m.clone().into());
    }
    if let Some(n) = args.max_tokens {
        params.insert("max_tokens".into(), n.into());
    }
    if let Some(t) = &args.cancel_token {
        params.insert("cancel_token".into(), t.clone().into());
    }
    params
}

/// The answer text of a result: the first message's `content` when it is
/// a string; otherwise (tool calls, say) that message as JSON.
pub fn answer_text(result: &Map<String, Value>) -> Option<String> {
    let first = result.get("messages")?.as_array()?.first()?;
    let mut text = match first.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => first.to_string(),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Some(text)
}

/// `airlock llm`.
pub fn llm(args: &LlmArgs) -> i32 {
    let prompt = match args.prompt.as_deref() {
        Some(p) if p != "-" => p.to_owned(),
        _ => {
            let mut p = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut p) {
                eprintln!("airlock llm: reading the prompt from stdin: {e}");
                return status::TRANSPORT;
            }
            p
        }
    };
    let mut client = match connect("llm") {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.llm(llm_params(args, prompt)) {
        Ok(result) if args.json => print(&format!("{}\n", Value::Object(result))),
        Ok(result) => match answer_text(&result) {
            Some(text) => print(&text),
            None => {
                eprintln!("airlock llm: the result holds no message");
                status::TRANSPORT
            }
        },
        Err(e) => fail("llm", &e),
    }
}

/// `airlock quota`.
pub fn quota(json: bool) -> i32 {
    let mut client = match connect("quota") {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.quota(None) {
        Ok(q) if json => print(&format!("{}\n", Value::Object(q))),
        Ok(q) => {
            let field = |k: &str| {
                q.get(k).map_or_else(String::new, |v| v.as_str().map_or(v.to_string(), str::to_owned))
            };
            print(&format!(
                "{} {} remaining (model {}, window {}, session {})\n",
                field("remaining_units"),
                field("currency"),
                field("model"),
                field("window"),
                field("session_id"),
            ))
        }
        Err(e) => fail("quota", &e),
    }
}

/// `airlock cancel`: 0 when a call was cancelled, [`status::NOT_FOUND`]
/// when none carried the token.
pub fn cancel(token: &str) -> i32 {
    let mut client = match connect("cancel") {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.cancel(token) {
        Ok(r) => {
            let state = r.get("state").and_then(Value::as_str).unwrap_or("unknown").to_owned();
            let code = match r.get("cancelled") {
                Some(Value::Bool(true)) => status::OK,
                _ => status::NOT_FOUND,
            };
            match print(&format!("{state}\n")) {
                status::OK => code,
                other => other,
            }
        }
        Err(e) => fail("cancel", &e),
    }
}
