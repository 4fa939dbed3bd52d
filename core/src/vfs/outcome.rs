//! The one JSON line `airlock tool` prints, and its exit status.

use serde_json::{json, Map, Value};

/// How the tool process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolExit {
    Code(i32),
    Signal(i32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    /// `result`, or `state` `stopped`: exit 0.
    Completed,
    /// `error`: exit 1.
    Error,
    /// Exit (or stdout closed) without a final message: exit 3.
    NoResult,
    /// A line over `--max-line`, a malformed `result`/`error`/`state`: exit 4.
    ProtocolError,
    /// `running`/`waiting` with no `--apply` left: exit 5.
    Waiting,
    /// Silent past `--timeout`: exit 124.
    Timeout,
    /// airlock got signal N (INT, TERM, HUP): exit 128+N.
    Cancelled(i32),
}

impl OutcomeKind {
    pub fn name(&self) -> &'static str {
        match self {
            OutcomeKind::Completed => "completed",
            OutcomeKind::Error => "error",
            OutcomeKind::NoResult => "no_result",
            OutcomeKind::ProtocolError => "protocol_error",
            OutcomeKind::Waiting => "waiting",
            OutcomeKind::Timeout => "timeout",
            OutcomeKind::Cancelled(_) => "cancelled",
        }
    }

    pub fn exit_status(&self) -> i32 {
        match self {
            OutcomeKind::Completed => 0,
            OutcomeKind::Error => 1,
            OutcomeKind::NoResult => 3,
            OutcomeKind::ProtocolError => 4,
            OutcomeKind::Waiting => 5,
            OutcomeKind::Timeout => 124,
            OutcomeKind::Cancelled(n) => 128 + n,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub kind: OutcomeKind,
    /// Content blocks (RFD 058): the tool's, or one `text` block with
    /// airlock's message.
    pub content: Vec<Value>,
    /// The `error` notification's params.
    pub error: Option<Value>,
    /// Every `state` notification's params, in order, if any came.
    pub states: Vec<Value>,
    pub tool_exit: ToolExit,
}

/// One `text` content block.
pub fn text_block(text: impl Into<String>) -> Value {
    json!({ "type": "text", "text": text.into() })
}

impl Outcome {
    pub fn exit_status(&self) -> i32 {
        self.kind.exit_status()
    }

    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("outcome".into(), Value::from(self.kind.name()));
        m.insert("content".into(), Value::Array(self.content.clone()));
        if let Some(e) = &self.error {
            m.insert("error".into(), e.clone());
        }
        if !self.states.is_empty() {
            m.insert("states".into(), Value::Array(self.states.clone()));
        }
        let exit = match self.tool_exit {
            ToolExit::Code(c) => json!({ "code": c }),
            ToolExit::Signal(s) => json!({ "signal": s }),
        };
        m.insert("tool_exit".into(), exit);
        Value::Object(m)
    }

    /// The line to print on stdout, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        crate::codec::jsonrpc::encode_line(&self.to_value())
    }
}
