//! The broker's ops (`LLMCMD`, `QUOTA`, `CANCEL`) on the same client.
//!
//! Params and results stay JSON objects: which params are valid is the
//! core's decision (`airlock_core::broker::wire`), made where the request
//! lands, so this side never goes stale when the broker learns a new one.

use super::{Client, ClientError};
use airlock_core::fsproxy::wire::{Op, Success};
use serde_json::{Map, Value};

/// Largest answer frame a broker op may bring: an `LLMCMD` result carries
/// a provider reply of up to 16 MiB, re-encoded (escapes can grow it).
pub const MAX_ANSWER_FRAME: usize = 64 << 20;

impl Client {
    fn broker_call(&mut self, op: Op) -> Result<Map<String, Value>, ClientError> {
        match self.call(op)? {
            Success::Value(m) => Ok(m),
            other => Err(ClientError::BadResponse(format!("broker op answered {other:?}"))),
        }
    }

    /// `LLMCMD` with `params` (`messages`, `model`, `max_tokens`, ...,
    /// `cancel_token`): the result object, `{messages, usage, model,
    /// metadata}`. Blocks until the call ends.
    pub fn llm(&mut self, params: Map<String, Value>) -> Result<Map<String, Value>, ClientError> {
        self.broker_call(Op::LlmCmd { params })
    }

    /// `QUOTA`: `{remaining_units, weights, window, session_id, currency,
    /// unit, model}` for `model` (the broker's default when `None`).
    pub fn quota(&mut self, model: Option<&str>) -> Result<Map<String, Value>, ClientError> {
        let mut params = Map::new();
        if let Some(m) = model {
            params.insert("model".into(), m.into());
        }
        self.broker_call(Op::Quota { params })
    }

    /// `CANCEL`: `{cancelled, state}`, `state` one of `before_start`,
    /// `after_start`, `not_found`.
    pub fn cancel(&mut self, token: &str) -> Result<Map<String, Value>, ClientError> {
        let mut params = Map::new();
        params.insert("cancel_token".into(), token.into());
        self.broker_call(Op::Cancel { params })
    }
}
