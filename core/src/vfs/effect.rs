//! Effects the host asks its shell to run, and their results.

use super::files::{FsOp, FsReply};
use crate::codec::jsonrpc::ErrorCode;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// Names one effect in flight (a counter, never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EffectId(pub u64);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Run with [`FsOp::run`] on the project's [`super::ProjectFiles`].
    Fs(FsOp),
    Http(HttpRequest),
    Process(ProcessRun),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HttpMethod {
    Get,
    Post,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    /// Bytes: a response header need not be UTF-8.
    #[serde(with = "crate::b64")]
    pub value: Vec<u8>,
}

/// An HTTP request that passed the policy. Header values have their
/// `${VAR}` substituted: the shell must not record them as they are
/// (`ToolPolicy::scrub` them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRequest {
    pub method: HttpMethod,
    /// Absolute `http` or `https` URL, as the tool wrote it.
    pub url: String,
    pub headers: Vec<Header>,
    #[serde(with = "crate::b64")]
    pub body: Vec<u8>,
    /// Redirects are not followed; a body longer than this is an error
    /// (`OpError::too_large`), and the shell stops reading there.
    pub max_body: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<Header>,
    #[serde(with = "crate::b64")]
    pub body: Vec<u8>,
}

/// A process to run: environment exactly `env`, working directory `cwd`
/// (the project root), in its own process group, killed with the group
/// when cancelled. Each stream longer than `max_output` is an error, and
/// the shell stops reading there (and kills the group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRun {
    /// Absolute, resolved at start from an `--allow-cmd`.
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub max_output: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessOutput {
    #[serde(with = "crate::b64")]
    pub stdout: Vec<u8>,
    #[serde(with = "crate::b64")]
    pub stderr: Vec<u8>,
    /// `None` when killed by a signal.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// Why an effect failed: the code and message the tool is answered with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpError {
    #[serde(with = "code_serde")]
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OpError { code, message: message.into() }
    }
    pub fn denied(message: impl Into<String>) -> Self {
        OpError::new(ErrorCode::AccessDenied, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        OpError::new(ErrorCode::NotFound, message)
    }
    pub fn exists(message: impl Into<String>) -> Self {
        OpError::new(ErrorCode::AlreadyExists, message)
    }
    pub fn io(message: impl Into<String>) -> Self {
        OpError::new(ErrorCode::Internal, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        OpError::new(ErrorCode::InvalidParams, message)
    }
    /// Content over a size limit (`-32603`).
    pub fn too_large(what: &str, max: usize) -> Self {
        OpError::new(ErrorCode::Internal, format!("{what} exceeds the limit of {max} bytes"))
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code.code())
    }
}

mod code_serde {
    use crate::codec::jsonrpc::ErrorCode;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(c: &ErrorCode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(c.code())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ErrorCode, D::Error> {
        let n = i64::deserialize(d)?;
        ErrorCode::from_code(n).ok_or_else(|| serde::de::Error::custom(format!("unknown error code {n}")))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectResult {
    Fs(Result<FsReply, OpError>),
    Http(Result<HttpResponse, OpError>),
    Process(Result<ProcessOutput, OpError>),
}
