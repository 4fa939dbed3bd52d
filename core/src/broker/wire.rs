//! The broker's ops on the FS proxy wire (seed 000 reserves `QUOTA` and
//! `LLMCMD`; `CANCEL` is ours): params parsed from the request's `params`
//! object into typed values, results encoded back into `result` objects.
//!
//! A params error is the FS proxy's `E_ARG`: the request never reaches the
//! broker, so nothing is queued or charged.

use super::pricing::Weights;
use super::quota::{Money, Usage};
use super::raw::RawJson;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// Longest `cancel_token` accepted, in bytes: tokens are kept in an index
/// for as long as their call lives.
pub const MAX_CANCEL_TOKEN_LEN: usize = 256;

/// A params object that does not fit its op; answered with `E_ARG`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamError(pub String);

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(message: impl Into<String>) -> Result<T, ParamError> {
    Err(ParamError(message.into()))
}

fn only_keys(params: &Map<String, Value>, allowed: &[&str]) -> Result<(), ParamError> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => err(format!("unknown param {k:?} (want one of {})", allowed.join(", "))),
        None => Ok(()),
    }
}

/// An LLM call as a child asked for it, validated. Its JSON parts are held
/// as compact text (see [`RawJson`]): a queued call costs about its wire
/// bytes, not the fifty-fold of a parsed tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    /// Chat messages, a JSON array of objects each with a string `role`;
    /// passed to the provider as they are.
    pub messages: RawJson,
    /// `None`: the broker's `default_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// A JSON array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<RawJson>,
    /// A JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// The other OpenAI parameters the child gave ([`PASSTHROUGH_PARAMS`]),
    /// checked, as a JSON object passed to the provider as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<RawJson>,
    /// Content parts whose cost does not follow from their length (an
    /// image, audio, a file: every part whose `type` is not `text` or
    /// `refusal`), counted when the messages were checked.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub media_parts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The content part types whose cost follows from their text: every other
/// part is a media part (see [`LlmRequest::media_parts`]).
pub const TEXT_PART_TYPES: [&str; 2] = ["text", "refusal"];

/// Media parts in `message`'s `content`: the parts of a content array
/// whose `type` is not one of [`TEXT_PART_TYPES`] (a part with no string
/// `type` counts as media: its cost is unknown).
pub fn media_parts(message: &Value) -> u32 {
    let Some(Value::Array(parts)) = message.get("content") else { return 0 };
    let media = parts
        .iter()
        .filter(|p| !p.get("type").and_then(Value::as_str).is_some_and(|t| TEXT_PART_TYPES.contains(&t)))
        .count();
    u32::try_from(media).unwrap_or(u32::MAX)
}

/// OpenAI chat-completions parameters checked here and passed to the
/// provider unchanged.
pub const PASSTHROUGH_PARAMS: [&str; 7] =
    ["top_p", "stop", "seed", "response_format", "tool_choice", "n", "user"];

/// Most `stop` sequences (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;

impl LlmRequest {
    /// A request of `messages` with every option left out.
    pub fn new(messages: Vec<Value>) -> Self {
        LlmRequest {
            messages: RawJson::from_value(&Value::Array(messages)),
            model: None,
            max_tokens: None,
            temperature: None,
            tools: None,
            metadata: None,
            options: None,
            media_parts: 0,
        }
    }

    /// Bytes of JSON text it holds.
    pub fn held_bytes(&self) -> u64 {
        let opt = |r: &Option<RawJson>| r.as_ref().map_or(0, RawJson::len);
        (self.messages.len() + opt(&self.tools) + opt(&self.metadata) + opt(&self.options)) as u64
    }
}

/// `LLMCMD` params.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmCmdParams {
    pub request: LlmRequest,
    pub cancel_token: Option<String>,
}

/// Parse `LLMCMD` params: `{messages, model?, max_tokens? |
/// max_completion_tokens?, temperature?, tools?, metadata?, cancel_token?}`
/// and the [`PASSTHROUGH_PARAMS`]. Unknown keys are refused, so a misspelt
/// `max_token` does not silently go unbounded.
pub fn parse_llmcmd(params: &Map<String, Value>) -> Result<LlmCmdParams, ParamError> {
    let mut known = vec![
        "messages",
        "model",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "tools",
        "metadata",
        "cancel_token",
    ];
    known.extend(PASSTHROUGH_PARAMS);
    only_keys(params, &known)?;
    let (messages_value, messages) = match params.get("messages") {
        Some(Value::Array(m)) if m.is_empty() => return err("messages is empty"),
        Some(v @ Value::Array(m)) => (v, m),
        Some(_) => return err("messages is not an array"),
        None => return err("missing messages"),
    };
    let mut media = 0u32;
    for (i, m) in messages.iter().enumerate() {
        media = media.saturating_add(media_parts(m));
        match m.get("role") {
            Some(Value::String(_)) => {}
            _ if !m.is_object() => return err(format!("messages[{i}] is not an object")),
            _ => return err(format!("messages[{i}] has no string role")),
        }
    }
    let model = match params.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => return err("model is empty"),
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return err("model is not a string"),
    };
    let max_tokens = parse_max_tokens(params)?;
    let temperature = match params.get("temperature") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=2.0).contains(&t) => Some(t),
            _ => return err(format!("invalid temperature: {v} (want 0 to 2)")),
        },
    };
    let tools = match params.get("tools") {
        None | Some(Value::Null) => None,
        Some(t @ Value::Array(_)) => Some(RawJson::from_value(t)),
        Some(_) => return err("tools is not an array"),
    };
    let metadata = match params.get("metadata") {
        None | Some(Value::Null) => None,
        Some(m @ Value::Object(_)) => Some(RawJson::from_value(m)),
        Some(_) => return err("metadata is not an object"),
    };
    let options = parse_options(params, tools.is_some())?;
    let cancel_token = match params.get("cancel_token") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_token(v)?),
    };
    let messages = RawJson::from_value(messages_value);
    let request =
        LlmRequest { messages, model, max_tokens, temperature, tools, metadata, options, media_parts: media };
    Ok(LlmCmdParams { request, cancel_token })
}

/// The output bound, given as `max_tokens` or `max_completion_tokens`
/// (OpenAI's newer name): either is the one the soft trim cuts. Which
/// field the provider is sent is the model's (`MaxTokensField`).
fn parse_max_tokens(params: &Map<String, Value>) -> Result<Option<u32>, ParamError> {
    let one = |key: &str| match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(0) => err(format!("{key} must be at least 1")),
            Some(n) => Ok(Some(n)),
            None => err(format!("invalid {key}: {v} (want an integer from 1 to {})", u32::MAX)),
        },
    };
    match (one("max_tokens")?, one("max_completion_tokens")?) {
        (Some(a), Some(b)) if a != b => {
            err(format!("max_tokens ({a}) and max_completion_tokens ({b}) disagree: give one"))
        }
        (a, b) => Ok(a.or(b)),
    }
}

/// The [`PASSTHROUGH_PARAMS`] present (nulls dropped), each checked the
/// way the OpenAI API would, so a bad one costs no provider call.
fn parse_options(params: &Map<String, Value>, has_tools: bool) -> Result<Option<RawJson>, ParamError> {
    let mut out = Map::new();
    for key in PASSTHROUGH_PARAMS {
        let v = match params.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => v,
        };
        match key {
            "top_p" => match v.as_f64() {
                Some(p) if (0.0..=1.0).contains(&p) => {}
                _ => return err(format!("invalid top_p: {v} (want a number from 0 to 1)")),
            },
            "stop" => match v {
                Value::String(_) => {}
                Value::Array(a) if a.len() <= MAX_STOP_SEQUENCES && a.iter().all(Value::is_string) => {}
                _ => {
                    return err(format!(
                        "invalid stop: want a string or an array of at most {MAX_STOP_SEQUENCES} strings"
                    ))
                }
            },
            "seed" if v.as_i64().is_none() => {
                return err(format!("invalid seed: {v} (want a 64-bit integer)"))
            }
            "response_format" => match v.get("type") {
                Some(Value::String(_)) if v.is_object() => {}
                _ => return err("invalid response_format: want an object with a string type"),
            },
            "tool_choice" => {
                match v {
                    Value::String(s) if matches!(s.as_str(), "none" | "auto" | "required") => {}
                    Value::Object(_) if v.get("type").is_some_and(Value::is_string) => {}
                    _ => {
                        return err(
                            "invalid tool_choice: want \"none\", \"auto\", \"required\" or an object with a string type",
                        )
                    }
                }
                if !has_tools {
                    return err("tool_choice given without tools");
                }
            }
            "n" => match v.as_u64() {
                Some(1) => {}
                Some(n) if n > 1 => {
                    return err(format!(
                        "n = {n} is refused: the broker answers one choice per call (make {n} calls)"
                    ))
                }
                _ => return err(format!("invalid n: {v} (want 1)")),
            },
            "user" if !v.is_string() => return err("user is not a string"),
            _ => {}
        }
        out.insert(key.to_owned(), v.clone());
    }
    Ok((!out.is_empty()).then(|| RawJson::from_value(&Value::Object(out))))
}

fn parse_token(v: &Value) -> Result<String, ParamError> {
    match v {
        Value::String(s) if s.is_empty() => err("cancel_token is empty"),
        Value::String(s) if s.len() > MAX_CANCEL_TOKEN_LEN => {
            err(format!("cancel_token longer than {MAX_CANCEL_TOKEN_LEN} bytes"))
        }
        Value::String(s) => Ok(s.clone()),
        _ => err("cancel_token is not a string"),
    }
}

/// Parse `CANCEL` params: `{cancel_token}`.
pub fn parse_cancel(params: &Map<String, Value>) -> Result<String, ParamError> {
    only_keys(params, &["cancel_token"])?;
    match params.get("cancel_token") {
        Some(v) => parse_token(v),
        None => err("missing cancel_token"),
    }
}

/// Parse `QUOTA` params: `{}` or `{model}` for another model's weights.
pub fn parse_quota(params: &Map<String, Value>) -> Result<Option<String>, ParamError> {
    only_keys(params, &["model"])?;
    match params.get("model") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => err("model is not a string"),
    }
}

/// A successful call, as the child receives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlmResult {
    /// A JSON array of message objects, as text.
    pub messages: RawJson,
    /// `None` when the provider reported none (and nothing was charged).
    pub usage: Option<Usage>,
    pub model: String,
    /// `trim_applied`, `requested_max_tokens` and `effective_max_tokens`
    /// when the soft trim bit; `quota_floor_applied` when the quota could
    /// not pay even the floor.
    pub metadata: Map<String, Value>,
}

impl LlmResult {
    /// The `LLMCMD` result object, `{messages, metadata, model, usage}`,
    /// as text: the messages are spliced in as they are held, never parsed
    /// into a tree.
    pub fn to_wire(&self) -> RawJson {
        let mut m = Map::new();
        m.insert("usage".into(), serde_json::to_value(self.usage).unwrap_or(Value::Null));
        m.insert("model".into(), self.model.clone().into());
        m.insert("metadata".into(), Value::Object(self.metadata.clone()));
        // Keys in `Map` order, where "messages" comes first.
        let rest = Value::Object(m).to_string();
        let rest = rest.strip_prefix('{').unwrap_or(&rest);
        let text = format!("{{\"messages\":{},{rest}", self.messages.as_str());
        RawJson::from_text(text).unwrap_or_else(|_| RawJson::from_value(&Value::Null))
    }
}

/// What `QUOTA` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuotaSnapshot {
    /// Exact.
    pub remaining: Money,
    pub model: String,
    pub weights: Weights,
    pub window: String,
    pub session_id: String,
}

impl QuotaSnapshot {
    /// `{remaining_units, weights: {input, cached, output}, window,
    /// session_id, currency: "USD", unit: "per_1M_tokens", model}`.
    pub fn to_wire(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("remaining_units".into(), self.remaining.as_usd_f64().into());
        m.insert(
            "weights".into(),
            serde_json::json!({
                "input": self.weights.input.as_f64(),
                "cached": self.weights.cached.as_f64(),
                "output": self.weights.output.as_f64(),
            }),
        );
        m.insert("window".into(), self.window.clone().into());
        m.insert("session_id".into(), self.session_id.clone().into());
        m.insert("currency".into(), "USD".into());
        m.insert("unit".into(), "per_1M_tokens".into());
        m.insert("model".into(), self.model.clone().into());
        m
    }
}

/// What a `CANCEL` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// The call was waiting; it was answered `cancelled_before_start`.
    BeforeStart,
    /// The call was running; the provider request was dropped and the call
    /// answered `cancelled_after_start`.
    AfterStart,
    /// No live call of this client carries the token (it may have just
    /// finished). Not an error: cancelling is a race the caller can lose.
    NotFound,
}

impl CancelOutcome {
    /// The `CANCEL` result object: `{cancelled, state}`.
    pub fn to_wire(self) -> Map<String, Value> {
        let (cancelled, state) = match self {
            CancelOutcome::BeforeStart => (true, "before_start"),
            CancelOutcome::AfterStart => (true, "after_start"),
            CancelOutcome::NotFound => (false, "not_found"),
        };
        let mut m = Map::new();
        m.insert("cancelled".into(), cancelled.into());
        m.insert("state".into(), state.into());
        m
    }
}
