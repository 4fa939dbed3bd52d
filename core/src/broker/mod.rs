//! The LLM broker (seed 002): one per parent session, it serializes the
//! session's provider calls, keeps its quota and soft-trims `max_tokens`,
//! sans-I/O.
//!
//! Calls come in (`BrokerInput::Submit`) and wait in a FIFO queue for the
//! session's single lock; the broker hands the lock to the head of the
//! queue and asks the shell to start the provider call
//! (`BrokerOutput::StartProvider`). The shell reports the outcome
//! (`ProviderDone`), the broker charges the provider-reported usage,
//! answers the caller (`Reply`), writes a `Telemetry` record and wakes the
//! next waiter.
//!
//! # Timing rules
//!
//! - Deadlines are inclusive: a waiter whose deadline is `now` has timed
//!   out, and so has a provider call whose deadline is `now`.
//! - In every `handle`, due timers fire first, then the input is applied,
//!   then the lock is handed on. The one exception is `OwnerGone`, applied
//!   before the timers, so that a timer due while the shell was busy does
//!   not answer a client that is already gone. Handing on the lock happens in one place,
//!   `Broker::dispatch`, which drops expired waiters before picking the
//!   head, so the lock is never handed to a waiter that has timed out or
//!   been cancelled, and is never left free while anyone waits.
//! - Time never runs backward: a `now` earlier than one already seen is
//!   taken as the later one.
//!
//! Because every waiter waits the same `queue_max_wait` and time never runs
//! backward, deadline order is admission order: the queue's head always
//! holds the earliest queue deadline, so expiry needs no second index.
//!
//! # Giving up on a running call
//!
//! A provider timeout, or a `CANCEL` of a running call, abandons it at
//! once: `CancelProvider` (the shell drops the HTTP request), the caller's
//! answer (`provider_timeout` or `cancelled_after_start`), and the lock
//! goes to the next waiter. The shell still reports `ProviderDone` for it
//! (with whatever usage it had, if any); that usage is charged, and nothing
//! else happens. In general: the usage of the first `ProviderDone` of every
//! started call is charged, whenever it arrives.

pub mod check;
pub mod openai;
mod pricing;
pub mod quota;
pub mod raw;
pub mod secret;
pub mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_budget;

pub use pricing::{CatalogError, MaxTokensField, Price, PricingCatalog, Weights, SAMPLE_CATALOG_JSON};
pub use quota::{Money, Trim, Usage, UsageError};
pub use raw::{RawJson, ReadLimits};
pub use secret::{Redactor, SecretError};
pub use wire::{
    CancelOutcome, LlmCmdParams, LlmRequest, LlmResult, ParamError, QuotaSnapshot, PASSTHROUGH_PARAMS,
};

use crate::handles::ClientId;
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use serde_json::Map;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

/// `queue.max_wait_seconds` (seed 002).
pub const DEFAULT_QUEUE_MAX_WAIT: Duration = Duration::from_secs(30);
/// `request.timeout_seconds` (seed 002).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// `safety_factor` (seed 002).
pub const DEFAULT_SAFETY_FACTOR: f64 = 0.9;
/// The trim never cuts below this many tokens: enough for a short answer
/// or an error message, small enough not to matter for the budget.
pub const DEFAULT_MIN_OUTPUT_TOKENS: u32 = 16;
/// `max_tokens` for a request that names none: a common output cap across
/// current models, and a bound the trim can compare against.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// `default_model` (seed 002).
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";
/// `[broker.queue] max_pending`: calls waiting for the lock at most.
pub const DEFAULT_MAX_PENDING: usize = 64;
/// `[broker.queue] max_pending_bytes`: bytes the waiting calls hold at
/// most (see [`Broker::pending_bytes`] for what is counted).
pub const DEFAULT_MAX_PENDING_BYTES: u64 = 8 << 20;
/// What one waiting call costs beyond its text: its queue entry, indexes
/// and bookkeeping, rounded up.
pub const WAITER_OVERHEAD_BYTES: u64 = 512;
/// The quota covers the whole session; there is no rolling window.
pub const QUOTA_WINDOW: &str = "session";
/// `[broker.request] max_retries`: attempts after the first for a call
/// the provider answers `429` or `5xx`.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// `[broker.request] retry_base_ms`: the first back-off; it doubles with
/// every retry.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(500);
/// `[broker.request] retry_after_max_ms`: no back-off is longer, whatever
/// the provider's `Retry-After` asks for.
pub const DEFAULT_RETRY_AFTER_MAX: Duration = Duration::from_secs(20);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrokerConfig {
    pub queue_max_wait: Duration,
    pub request_timeout: Duration,
    /// In (0, 1]; applied with six decimal places.
    pub safety_factor: f64,
    pub min_output_tokens: u32,
    pub default_max_tokens: u32,
    pub default_model: String,
    /// Prepend a system message stating the remaining budget.
    pub inject_remaining_context: bool,
    /// Calls waiting for the lock at most; more are refused `queue_full`.
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Bytes the waiting calls hold at most; a call that would pass it is
    /// refused `queue_full`.
    #[serde(default = "default_max_pending_bytes")]
    pub max_pending_bytes: u64,
    /// Refuse (`budget_exhausted`, no provider call) a call whose
    /// worst-case cost the remaining budget cannot cover. Off by default:
    /// the seed makes no preflight denials.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enforce_budget: bool,
    /// Attempts after the first for a call whose attempt the provider
    /// answered `429` or `5xx`; 0 turns retries off.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// The back-off before retry `n` (from 1) is at least
    /// `retry_base * 2^(n-1)`, and at least the provider's `Retry-After`.
    #[serde(default = "default_retry_base")]
    pub retry_base: Duration,
    /// No back-off is longer than this.
    #[serde(default = "default_retry_after_max")]
    pub retry_after_max: Duration,
}

fn default_max_retries() -> u32 {
    DEFAULT_MAX_RETRIES
}

fn default_retry_base() -> Duration {
    DEFAULT_RETRY_BASE
}

fn default_retry_after_max() -> Duration {
    DEFAULT_RETRY_AFTER_MAX
}

fn default_max_pending() -> usize {
    DEFAULT_MAX_PENDING
}

fn default_max_pending_bytes() -> u64 {
    DEFAULT_MAX_PENDING_BYTES
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            queue_max_wait: DEFAULT_QUEUE_MAX_WAIT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            safety_factor: DEFAULT_SAFETY_FACTOR,
            min_output_tokens: DEFAULT_MIN_OUTPUT_TOKENS,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            default_model: DEFAULT_MODEL.into(),
            inject_remaining_context: false,
            max_pending: DEFAULT_MAX_PENDING,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            enforce_budget: false,
            max_retries: DEFAULT_MAX_RETRIES,
            retry_base: DEFAULT_RETRY_BASE,
            retry_after_max: DEFAULT_RETRY_AFTER_MAX,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    /// A zero wait would time out every waiter at the instant it queued.
    ZeroQueueWait,
    ZeroRequestTimeout,
    SafetyFactor(f64),
    ZeroDefaultMaxTokens,
    DefaultModelNotPriced(String),
    ZeroMaxPending,
    ZeroMaxPendingBytes,
    /// A zero back-off would retry within the very step that failed.
    ZeroRetryBase,
    RetryCapBelowBase,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroQueueWait => f.write_str("queue.max_wait_seconds must be positive"),
            ConfigError::ZeroRequestTimeout => f.write_str("request.timeout_seconds must be positive"),
            ConfigError::SafetyFactor(x) => write!(f, "safety_factor {x} is not in (0, 1]"),
            ConfigError::ZeroDefaultMaxTokens => f.write_str("default max_tokens must be positive"),
            ConfigError::DefaultModelNotPriced(m) => {
                write!(f, "default_model {m:?} is not in the pricing catalog")
            }
            ConfigError::ZeroMaxPending => f.write_str("queue.max_pending must be positive"),
            ConfigError::ZeroMaxPendingBytes => f.write_str("queue.max_pending_bytes must be positive"),
            ConfigError::ZeroRetryBase => f.write_str("request.retry_base_ms must be positive"),
            ConfigError::RetryCapBelowBase => {
                f.write_str("request.retry_after_max_ms must be at least request.retry_base_ms")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Everything a session's broker is built from: what the FS proxy's
/// `Config` carries (`Config::broker`), so a trace header rebuilds the
/// very same broker on replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrokerSetup {
    pub config: BrokerConfig,
    pub catalog: PricingCatalog,
    pub initial_units: Money,
    pub session_id: String,
}

impl BrokerSetup {
    /// A setup with the default config and the built-in catalog.
    pub fn new(initial_units: Money, session_id: impl Into<String>) -> Self {
        BrokerSetup {
            config: BrokerConfig::default(),
            catalog: PricingCatalog::builtin(),
            initial_units,
            session_id: session_id.into(),
        }
    }

    /// What [`Broker::new`] would refuse.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.build().map(|_| ())
    }

    pub fn build(&self) -> Result<Broker, ConfigError> {
        Broker::new(self.config.clone(), self.catalog.clone(), self.initial_units, self.session_id.clone())
    }
}

/// Names one LLM call (or one `CANCEL` request); given by the caller, who
/// keeps them unique.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call-{}", self.0)
    }
}

/// The seed's canonical codes, plus `E_ARG` for calls refused before
/// queueing (unknown model, call id or cancel token already in use), which
/// are argument errors like any other on the FS proxy wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokerErrorCode {
    QueueTimeout,
    CancelledBeforeStart,
    CancelledAfterStart,
    ProviderTimeout,
    ProviderError,
    #[serde(rename = "E_ARG")]
    InvalidRequest,
    /// The queue is at `max_pending` calls or `max_pending_bytes`.
    QueueFull,
    /// `enforce_budget` is on and the remaining budget cannot cover the
    /// call's worst-case cost.
    BudgetExhausted,
}

impl BrokerErrorCode {
    pub const ALL: [BrokerErrorCode; 8] = [
        BrokerErrorCode::QueueTimeout,
        BrokerErrorCode::CancelledBeforeStart,
        BrokerErrorCode::CancelledAfterStart,
        BrokerErrorCode::ProviderTimeout,
        BrokerErrorCode::ProviderError,
        BrokerErrorCode::InvalidRequest,
        BrokerErrorCode::QueueFull,
        BrokerErrorCode::BudgetExhausted,
    ];

    /// The wire's `error.code`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BrokerErrorCode::QueueTimeout => "queue_timeout",
            BrokerErrorCode::CancelledBeforeStart => "cancelled_before_start",
            BrokerErrorCode::CancelledAfterStart => "cancelled_after_start",
            BrokerErrorCode::ProviderTimeout => "provider_timeout",
            BrokerErrorCode::ProviderError => "provider_error",
            BrokerErrorCode::InvalidRequest => "E_ARG",
            BrokerErrorCode::QueueFull => "queue_full",
            BrokerErrorCode::BudgetExhausted => "budget_exhausted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for BrokerErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerError {
    pub code: BrokerErrorCode,
    pub message: String,
}

impl BrokerError {
    fn new(code: BrokerErrorCode, message: impl Into<String>) -> Self {
        BrokerError { code, message: message.into() }
    }
}

/// What the provider did with a call, as the shell reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum ProviderResult {
    Ok {
        /// A JSON array of message objects, as text.
        messages: RawJson,
        /// `None` when the response carried no usage: nothing is charged.
        usage: Option<Usage>,
        model: String,
    },
    /// A transport or API error, or the dropped request after
    /// `CancelProvider`. Usage the provider reported anyway is charged.
    Err {
        usage: Option<Usage>,
        message: String,
        /// The HTTP status of the provider's answer; `None` when there was
        /// none (a connection error, a dropped request). `429` and `5xx`
        /// are retried (see [`BrokerConfig::max_retries`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// The answer's `Retry-After`, in milliseconds, as the shell read
        /// it ([`openai::retry_after_ms`]); `None` when absent or unreadable.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
}

impl ProviderResult {
    /// A failure with no HTTP status: a transport error, a dropped
    /// request, a reply that could not be read.
    pub fn error(usage: Option<Usage>, message: impl Into<String>) -> Self {
        ProviderResult::Err { usage, message: message.into(), status: None, retry_after_ms: None }
    }

    /// The usage reported, on success or failure.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            ProviderResult::Ok { usage, .. } | ProviderResult::Err { usage, .. } => *usage,
        }
    }

    /// With `Retry-After` set to `hint` ms, if this is a failure.
    pub fn with_retry_after(mut self, hint: Option<u64>) -> Self {
        if let ProviderResult::Err { retry_after_ms, .. } = &mut self {
            *retry_after_ms = hint;
        }
        self
    }
}

/// Whether an attempt that failed with HTTP `status` is retried: rate
/// limited (`429`) or a server error (`5xx`).
pub const fn retryable_status(status: u16) -> bool {
    status == 429 || matches!(status, 500..=599)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "input")]
pub enum BrokerInput {
    /// `LLMCMD`: a call to queue.
    Submit {
        call: CallId,
        owner: ClientId,
        /// The namespace of its cancel token: the connection the owner
        /// attached from (its own id when it did not attach), so any
        /// process of one child's tree may cancel another's call by token.
        scope: ClientId,
        request: LlmRequest,
        cancel_token: Option<String>,
    },
    /// `CANCEL`, itself a request (`request`) answered by a `CancelResult`.
    /// Tokens are scoped: a canceller finds only calls submitted under
    /// its own `scope` (see `Submit::scope`), passed here as `owner`.
    Cancel {
        request: CallId,
        owner: ClientId,
        token: String,
    },
    /// The client died or hung up: its waiting calls leave the queue
    /// unanswered; its running call runs to its end (so its usage is
    /// charged) and is not answered.
    OwnerGone {
        owner: ClientId,
    },
    ProviderDone {
        call: CallId,
        result: ProviderResult,
    },
    /// A timer is due (see [`Broker::poll_timeout`]).
    Tick,
}

/// A provider call for the shell to make.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProviderRequest {
    pub model: String,
    /// A JSON array of message objects, as text.
    pub messages: RawJson,
    /// After the soft trim.
    pub max_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// A JSON array, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<RawJson>,
    /// A JSON object, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<RawJson>,
    /// The checked pass-through parameters (`top_p`, `stop`, ...), a JSON
    /// object as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<RawJson>,
    /// The field `max_tokens` is sent as: the model's, from the catalog.
    #[serde(default, skip_serializing_if = "is_default_field")]
    pub max_tokens_field: MaxTokensField,
    /// Media parts of the messages (see [`LlmRequest::media_parts`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub media_parts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_default_field(f: &MaxTokensField) -> bool {
    *f == MaxTokensField::default()
}

impl ProviderRequest {
    /// Bytes of what is sent as the prompt (messages and tools): the
    /// bound [`quota::prompt_token_bound`] is taken of.
    pub fn prompt_bytes(&self) -> u64 {
        (self.messages.len() + self.tools.as_ref().map_or(0, RawJson::len)) as u64
    }

    /// Its prompt tokens at most: one per byte, plus the model's stated
    /// bound for each media part; `None` when it has media parts and the
    /// model states no bound.
    pub fn prompt_token_bound(&self, media_tokens: Option<u32>) -> Option<u64> {
        quota::prompt_token_bound_with_media(self.prompt_bytes(), self.media_parts, media_tokens)
    }
}

/// The seed's per-request telemetry fields, one record per call (and one
/// more, `late_usage`, when usage arrives for a call already abandoned).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TelemetryRecord {
    pub call: CallId,
    pub owner: ClientId,
    pub model: String,
    /// Calls already waiting (not counting the running one) when this one
    /// was queued.
    pub queue_length_at_enqueue: u64,
    pub wait_duration_ms: u64,
    /// `None` for a call that never started.
    pub effective_max_tokens: Option<u32>,
    pub provider_latency_ms: Option<u64>,
    pub usage: Option<Usage>,
    pub trim_applied: bool,
    /// `None` on success.
    pub error_code: Option<BrokerErrorCode>,
    pub charged: Money,
    pub remaining: Money,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub late_usage: bool,
    /// The record of a dropped call (cancelled after start, or past its
    /// deadline) whose provider request ended reporting no usage: what it
    /// cost is unknown. Under `enforce_budget` it is charged its reserve
    /// (see `reserve_charged`); otherwise nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped_usage_unknown: bool,
    /// Under `enforce_budget`: the call's usage is unknown (dropped, timed
    /// out, or answered without usage), so `charged` is its reserve, the
    /// worst case it was started with.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserve_charged: bool,
    /// On the records of a call that made more than one attempt, or whose
    /// attempt is retried: which attempt (from 1) the record reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The HTTP status of the provider's failed answer to the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// The `Retry-After` of that answer, in ms, as the shell read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Set on the record of an attempt that is retried: the back-off
    /// before the next attempt, during which the call keeps the lock.
    /// Such a record is not the call's answer; its last record is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "output")]
pub enum BrokerOutput {
    /// Start the provider call; the broker will give up on it at `deadline`.
    StartProvider {
        call: CallId,
        request: ProviderRequest,
        deadline: Instant,
    },
    /// Drop the provider request for `call`, then report `ProviderDone`.
    CancelProvider {
        call: CallId,
    },
    /// The answer to an `LLMCMD`.
    Reply {
        call: CallId,
        owner: ClientId,
        outcome: Result<LlmResult, BrokerError>,
    },
    /// The answer to a `CANCEL`.
    CancelResult {
        request: CallId,
        owner: ClientId,
        outcome: CancelOutcome,
    },
    Telemetry(TelemetryRecord),
    /// Advisory mode (no `enforce_budget`): the charges have passed the
    /// budget. Said once per session, when it first happens.
    BudgetPassed {
        initial: Money,
        charged: Money,
    },
}

/// Counters for `--report` and the simulator's checkers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    pub submitted: u64,
    pub started: u64,
    pub succeeded: u64,
    pub errors_by_code: BTreeMap<BrokerErrorCode, u64>,
    pub trims: u64,
    /// Waiting calls dropped because their owner went away.
    pub dropped_owner_gone: u64,
    /// Results with usage for abandoned calls (usage charged, nothing else).
    pub late_results: u64,
    /// Abandoned calls whose request ended with no usage: dropped, what
    /// they cost unknown.
    #[serde(default)]
    pub dropped_usage_unknown: u64,
    /// Results for calls the broker never started or already finished:
    /// ignored.
    pub stray_results: u64,
    /// Sum of all charges, before clamping at zero.
    pub charged: Money,
    /// Attempts started again after a `429` or `5xx`.
    #[serde(default)]
    pub retries: u64,
    /// Under `enforce_budget`: calls charged their reserve because their
    /// usage is unknown.
    #[serde(default)]
    pub reserves_charged: u64,
    /// Advisory mode: the charges passed the budget (`BudgetPassed` was
    /// said).
    #[serde(default)]
    pub budget_passed: bool,
}

#[derive(Debug)]
struct Waiter {
    call: CallId,
    owner: ClientId,
    scope: ClientId,
    request: LlmRequest,
    model: String,
    weights: Weights,
    cancel_token: Option<String>,
    enqueued: Instant,
    deadline: Instant,
    queue_len: u64,
    /// What it holds, counted against `max_pending_bytes`.
    bytes: u64,
}

#[derive(Debug)]
struct Running {
    call: CallId,
    owner: ClientId,
    scope: ClientId,
    owner_gone: bool,
    model: String,
    weights: Weights,
    cancel_token: Option<String>,
    enqueued: Instant,
    started: Instant,
    deadline: Instant,
    queue_len: u64,
    trim: Trim,
    /// Its worst-case cost, reserved under `enforce_budget`.
    reserve: Money,
    /// What was sent, sent again by a retry.
    request: ProviderRequest,
    /// The attempt running or last run, from 1.
    attempt: u32,
    /// Backing off until then: no attempt in flight, the lock still held.
    retry_at: Option<Instant>,
}

/// A call given up on, whose `ProviderDone` may still bring usage.
#[derive(Debug)]
struct Abandoned {
    owner: ClientId,
    model: String,
    weights: Weights,
    reserve: Money,
}

/// Bugs the simulator plants in the broker (see `fsproxy::PlantedBug`).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerBug {
    /// `max_pending_bytes` is not checked.
    NoPendingByteBound,
    /// `enforce_budget` is ignored.
    IgnoreEnforceBudget,
    /// The lock is handed on while the call holding it backs off.
    ReleaseLockDuringBackoff,
    /// A call given up on whose usage never comes releases its reserve
    /// unpaid, as if it had cost nothing.
    ReleaseReserveOnCancel,
}

#[derive(Clone, Copy, Debug)]
enum Place {
    /// Waiting, under this admission number.
    Queued(u64),
    Running,
}

/// The broker machine of one session.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    catalog: PricingCatalog,
    safety_ppm: u64,
    session_id: String,
    initial: Money,
    remaining: Money,
    now: Instant,
    next_seq: u64,
    /// Waiters by admission number: FIFO order, and deadline order.
    queue: BTreeMap<u64, Waiter>,
    /// Every live call (queued or running).
    calls: BTreeMap<CallId, Place>,
    /// Live cancel tokens, per scope.
    tokens: BTreeMap<(ClientId, String), CallId>,
    /// Waiters per owner, for `OwnerGone`.
    by_owner: BTreeSet<(ClientId, u64)>,
    running: Option<Running>,
    abandoned: BTreeMap<CallId, Abandoned>,
    /// Sum of the abandoned calls' reserves: usage that may still come.
    reserved: Money,
    /// Sum of the waiters' `bytes`.
    pending_bytes: u64,
    outputs: VecDeque<BrokerOutput>,
    stats: BrokerStats,
    /// Scrubs every provider result before a child can see it. Set at run
    /// time, never serialized.
    redactor: Redactor,
    bug: Option<BrokerBug>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Broker {
    pub fn new(
        config: BrokerConfig,
        catalog: PricingCatalog,
        initial: Money,
        session_id: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        if config.queue_max_wait.is_zero() {
            return Err(ConfigError::ZeroQueueWait);
        }
        if config.request_timeout.is_zero() {
            return Err(ConfigError::ZeroRequestTimeout);
        }
        let f = config.safety_factor;
        // Checked on the rounded value too, so the trim never divides by a
        // factor that rounds to zero.
        if !(f > 0.0 && f <= 1.0) || quota::factor_ppm(f) == 0 {
            return Err(ConfigError::SafetyFactor(f));
        }
        if config.default_max_tokens == 0 {
            return Err(ConfigError::ZeroDefaultMaxTokens);
        }
        if catalog.get(&config.default_model).is_none() {
            return Err(ConfigError::DefaultModelNotPriced(config.default_model.clone()));
        }
        if config.max_pending == 0 {
            return Err(ConfigError::ZeroMaxPending);
        }
        if config.max_pending_bytes == 0 {
            return Err(ConfigError::ZeroMaxPendingBytes);
        }
        // Time is counted in microseconds: a shorter back-off is none.
        if config.retry_base.as_micros() == 0 {
            return Err(ConfigError::ZeroRetryBase);
        }
        if config.retry_after_max < config.retry_base {
            return Err(ConfigError::RetryCapBelowBase);
        }
        Ok(Broker {
            safety_ppm: quota::factor_ppm(f),
            config,
            catalog,
            session_id: session_id.into(),
            initial,
            remaining: initial,
            now: Instant::ZERO,
            next_seq: 0,
            queue: BTreeMap::new(),
            calls: BTreeMap::new(),
            tokens: BTreeMap::new(),
            by_owner: BTreeSet::new(),
            running: None,
            abandoned: BTreeMap::new(),
            reserved: Money::ZERO,
            pending_bytes: 0,
            outputs: VecDeque::new(),
            stats: BrokerStats::default(),
            redactor: Redactor::new(),
            bug: None,
        })
    }

    /// Scrub every provider result with `redactor` before it is answered.
    pub fn set_redactor(&mut self, redactor: Redactor) {
        self.redactor = redactor;
    }

    #[doc(hidden)]
    pub fn plant_bug(&mut self, bug: BrokerBug) {
        self.bug = Some(bug);
    }

    /// Bytes the waiting calls hold: the text of their messages, tools and
    /// metadata (kept as compact JSON text, never as a parsed tree), their
    /// model names and cancel tokens, plus [`WAITER_OVERHEAD_BYTES`] each.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Under `enforce_budget`: the worst-case cost of abandoned calls
    /// whose usage has not come in yet, held back from new calls.
    pub fn reserved(&self) -> Money {
        self.reserved
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    pub fn catalog(&self) -> &PricingCatalog {
        &self.catalog
    }

    pub fn initial(&self) -> Money {
        self.initial
    }

    pub fn remaining(&self) -> Money {
        self.remaining
    }

    pub fn stats(&self) -> &BrokerStats {
        &self.stats
    }

    /// The call holding the lock (running, or backing off to retry).
    pub fn running(&self) -> Option<CallId> {
        self.running.as_ref().map(|r| r.call)
    }

    /// The call backing off between attempts, and when it retries.
    pub fn backing_off(&self) -> Option<(CallId, Instant)> {
        self.running.as_ref().and_then(|r| r.retry_at.map(|t| (r.call, t)))
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Nothing running, nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_none() && self.queue.is_empty()
    }

    /// `QUOTA` for the default model.
    pub fn quota(&self) -> QuotaSnapshot {
        let model = self.config.default_model.clone();
        let weights = self.catalog.get(&model).copied().unwrap_or_default();
        self.snapshot(model, weights)
    }

    /// `QUOTA` with the weights of `model` (the default model when `None`).
    pub fn quota_for(&self, model: Option<&str>) -> Result<QuotaSnapshot, BrokerError> {
        let model = model.unwrap_or(&self.config.default_model);
        let weights = self.weights_of(model)?;
        Ok(self.snapshot(model.to_owned(), weights))
    }

    fn snapshot(&self, model: String, weights: Weights) -> QuotaSnapshot {
        QuotaSnapshot {
            remaining: self.remaining,
            model,
            weights,
            window: QUOTA_WINDOW.into(),
            session_id: self.session_id.clone(),
        }
    }

    /// Under `enforce_budget`, a call with media parts needs the model's
    /// stated bound for them: their cost does not follow from their
    /// length, so without one the budget could not bound the call.
    fn media_bound_check(&self, model: &str, w: &Weights, request: &LlmRequest) -> Result<(), BrokerError> {
        if !self.enforcing() || request.media_parts == 0 || w.media_tokens.is_some() {
            return Ok(());
        }
        Err(BrokerError::new(
            BrokerErrorCode::InvalidRequest,
            format!(
                "{} message part(s) whose cost does not follow from their length (image, audio, \
                 file): under broker.enforce_budget the pricing catalog must state media_tokens \
                 for model {model:?}",
                request.media_parts
            ),
        ))
    }

    /// `enforce_budget` is on (and not switched off by a planted bug).
    fn enforcing(&self) -> bool {
        self.config.enforce_budget && self.bug != Some(BrokerBug::IgnoreEnforceBudget)
    }

    fn weights_of(&self, model: &str) -> Result<Weights, BrokerError> {
        self.catalog.get(model).copied().ok_or_else(|| {
            BrokerError::new(
                BrokerErrorCode::InvalidRequest,
                format!("unknown model {model:?}: not in the pricing catalog"),
            )
        })
    }

    pub fn poll_output(&mut self) -> Option<BrokerOutput> {
        self.outputs.pop_front()
    }

    /// The earliest queue or provider deadline, or retry.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let queue = self.queue.first_key_value().map(|(_, w)| w.deadline);
        // A retry is always due before its call's deadline.
        let running = self.running.as_ref().map(|r| r.retry_at.unwrap_or(r.deadline).min(r.deadline));
        match (queue, running) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn handle(&mut self, now: Instant, input: BrokerInput) {
        let now = now.max(self.now);
        self.now = now;
        // A departure is applied before the timers, so a timer that was
        // due while the shell was busy answers nobody who is already gone.
        if let BrokerInput::OwnerGone { owner } = &input {
            self.owner_gone(now, *owner);
        }
        self.fire_timers(now);
        match input {
            BrokerInput::Submit { call, owner, scope, request, cancel_token } => {
                self.submit(now, call, (owner, scope), request, cancel_token)
            }
            BrokerInput::Cancel { request, owner, token } => self.cancel(now, request, owner, token),
            BrokerInput::OwnerGone { .. } => {}
            BrokerInput::ProviderDone { call, result } => self.provider_done(now, call, result),
            BrokerInput::Tick => {}
        }
        self.dispatch(now);
    }

    fn fire_timers(&mut self, now: Instant) {
        match self.running.as_ref().map(|r| (r.deadline <= now, r.retry_at)) {
            // Time jumped past the deadline during a back-off: nothing is
            // in flight to drop.
            Some((true, Some(_))) => self.end_backoff(
                now,
                BrokerErrorCode::ProviderTimeout,
                "provider call exceeded request.timeout_seconds while waiting to retry",
                true,
            ),
            Some((true, None)) => self.abandon(
                now,
                BrokerErrorCode::ProviderTimeout,
                "provider call exceeded request.timeout_seconds",
            ),
            Some((false, Some(at))) if at <= now => self.retry(now),
            _ => {}
        }
        self.expire_waiters(now);
    }

    fn expire_waiters(&mut self, now: Instant) {
        while let Some(seq) = self.queue.first_key_value().filter(|(_, w)| w.deadline <= now).map(|(s, _)| *s)
        {
            let Some(w) = self.remove_waiter(seq) else { break };
            let message =
                format!("broker lock not acquired within {} ms", millis(self.config.queue_max_wait));
            self.finish_unstarted(now, w, BrokerError::new(BrokerErrorCode::QueueTimeout, message), true);
        }
    }

    /// Hand the lock to the head of the queue if it is free. The only place
    /// a call starts.
    fn dispatch(&mut self, now: Instant) {
        if !self.lock_free() {
            return;
        }
        self.expire_waiters(now);
        while self.lock_free() {
            let Some(seq) = self.queue.first_key_value().map(|(s, _)| *s) else { return };
            let Some(w) = self.remove_waiter(seq) else { return };
            // Refused calls answer at once and the next waiter is tried.
            self.start(now, w);
        }
    }

    fn lock_free(&self) -> bool {
        match &self.running {
            None => true,
            Some(r) => r.retry_at.is_some() && self.bug == Some(BrokerBug::ReleaseLockDuringBackoff),
        }
    }

    fn submit(
        &mut self,
        now: Instant,
        call: CallId,
        (owner, scope): (ClientId, ClientId),
        request: LlmRequest,
        cancel_token: Option<String>,
    ) {
        self.stats.submitted += 1;
        let model = request.model.clone().unwrap_or_else(|| self.config.default_model.clone());
        let refused = |message: String| BrokerError::new(BrokerErrorCode::InvalidRequest, message);
        let bytes = request.held_bytes()
            + model.len() as u64
            + cancel_token.as_ref().map_or(0, |t| t.len() as u64)
            + WAITER_OVERHEAD_BYTES;
        let full = |message: String| BrokerError::new(BrokerErrorCode::QueueFull, message);
        let byte_bound = self.bug != Some(BrokerBug::NoPendingByteBound);
        let checked = if self.calls.contains_key(&call) || self.abandoned.contains_key(&call) {
            Err(refused(format!("{call} is already in use")))
        } else if cancel_token.as_ref().is_some_and(|t| self.tokens.contains_key(&(scope, t.clone()))) {
            Err(refused(
                "cancel_token is already in use by another live call of this client or its process tree"
                    .into(),
            ))
        } else if self.queue.len() >= self.config.max_pending {
            Err(full(format!(
                "{} calls already wait for the broker lock (queue.max_pending)",
                self.queue.len()
            )))
        } else if byte_bound && self.pending_bytes.saturating_add(bytes) > self.config.max_pending_bytes {
            Err(full(format!(
                "a call of {bytes} bytes would take the waiting calls past {} bytes (queue.max_pending_bytes; {} held)",
                self.config.max_pending_bytes, self.pending_bytes
            )))
        } else {
            self.weights_of(&model).and_then(|w| self.media_bound_check(&model, &w, &request).map(|()| w))
        };
        let weights = match checked {
            Ok(w) => w,
            Err(e) => {
                let record = self.record(call, owner, model, 0, 0, None, None, Some(e.code), Money::ZERO);
                self.reply(call, owner, Err(e));
                self.outputs.push_back(BrokerOutput::Telemetry(record));
                return;
            }
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(t) = &cancel_token {
            self.tokens.insert((scope, t.clone()), call);
        }
        self.calls.insert(call, Place::Queued(seq));
        self.by_owner.insert((owner, seq));
        let waiter = Waiter {
            call,
            owner,
            scope,
            request,
            model,
            weights,
            cancel_token,
            enqueued: now,
            deadline: now.saturating_add(self.config.queue_max_wait),
            queue_len: self.queue.len() as u64,
            bytes,
        };
        self.pending_bytes += bytes;
        self.queue.insert(seq, waiter);
    }

    fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let w = self.queue.remove(&seq)?;
        self.pending_bytes -= w.bytes;
        self.by_owner.remove(&(w.owner, seq));
        self.calls.remove(&w.call);
        if let Some(t) = &w.cancel_token {
            self.tokens.remove(&(w.scope, t.clone()));
        }
        Some(w)
    }

    /// Start `w`, or, under `enforce_budget`, refuse it when its
    /// worst-case cost does not fit.
    fn start(&mut self, now: Instant, w: Waiter) {
        let safe = quota::safe_output_tokens(self.remaining, w.weights.output, self.safety_ppm);
        let requested = w.request.max_tokens.unwrap_or(self.config.default_max_tokens);
        let mut trim = quota::soft_trim(requested, safe, self.config.min_output_tokens);
        let mut messages = w.request.messages;
        if self.config.inject_remaining_context {
            let affordable = match safe {
                Some(n) => format!("about {n} more output tokens of {}", w.model),
                None => format!("output of {} at no charge", w.model),
            };
            let note = format!(
                "LLM budget remaining for this session: {:.6} USD ({affordable}).",
                self.remaining.as_usd_f64()
            );
            let note = serde_json::json!({"role": "system", "content": note});
            // Validated as an array when it was submitted.
            if let Some(m) = messages.prepend(&note) {
                messages = m;
            }
        }
        let mut request = ProviderRequest {
            model: w.model.clone(),
            messages,
            max_tokens: trim.effective,
            temperature: w.request.temperature,
            tools: w.request.tools,
            metadata: w.request.metadata,
            options: w.request.options,
            max_tokens_field: w.weights.max_tokens_field,
            media_parts: w.request.media_parts,
        };
        let mut reserve = Money::ZERO;
        if self.config.enforce_budget && self.bug != Some(BrokerBug::IgnoreEnforceBudget) {
            let available = self.remaining.saturating_sub(self.reserved);
            // Checked when it was submitted: a media part has a bound.
            let prompt = request.prompt_token_bound(w.weights.media_tokens).unwrap_or(u64::MAX);
            match quota::fit_budget(
                available,
                prompt,
                trim.effective,
                self.config.min_output_tokens,
                &w.weights,
            ) {
                Some((effective, cost)) => {
                    if effective < trim.effective {
                        trim.effective = effective;
                        trim.trim_applied = true;
                        request.max_tokens = effective;
                    }
                    reserve = cost;
                }
                None => {
                    let message = format!(
                        "the remaining budget ({}) cannot cover this call: up to {prompt} prompt tokens \
                         and {} output tokens of {} (broker.enforce_budget)",
                        available,
                        trim.effective.min(self.config.min_output_tokens),
                        w.model
                    );
                    let e = BrokerError::new(BrokerErrorCode::BudgetExhausted, message);
                    return self.finish_parts(
                        now,
                        w.call,
                        w.owner,
                        w.model,
                        w.enqueued,
                        w.queue_len,
                        e,
                        true,
                    );
                }
            }
        }
        if trim.trim_applied {
            self.stats.trims += 1;
        }
        self.stats.started += 1;
        let deadline = now.saturating_add(self.config.request_timeout);
        self.outputs.push_back(BrokerOutput::StartProvider {
            call: w.call,
            request: request.clone(),
            deadline,
        });
        self.calls.insert(w.call, Place::Running);
        if let Some(t) = &w.cancel_token {
            self.tokens.insert((w.scope, t.clone()), w.call);
        }
        self.running = Some(Running {
            call: w.call,
            owner: w.owner,
            scope: w.scope,
            owner_gone: false,
            model: w.model,
            weights: w.weights,
            cancel_token: w.cancel_token,
            enqueued: w.enqueued,
            started: now,
            deadline,
            queue_len: w.queue_len,
            trim,
            reserve,
            request,
            attempt: 1,
            retry_at: None,
        });
    }

    /// The next attempt of the call backing off, if it may still start:
    /// before its deadline, and, under `enforce_budget`, with its worst
    /// case still covered.
    fn retry(&mut self, now: Instant) {
        let Some(r) = self.running.as_ref() else { return };
        if let Some(why) = self.budget_blocks_retry(r, Money::ZERO) {
            return self.end_backoff(now, BrokerErrorCode::ProviderError, &why, true);
        }
        let Some(r) = self.running.as_mut() else { return };
        r.retry_at = None;
        r.attempt += 1;
        let start =
            BrokerOutput::StartProvider { call: r.call, request: r.request.clone(), deadline: r.deadline };
        self.stats.retries += 1;
        self.outputs.push_back(start);
    }

    /// Under `enforce_budget`, why the call's worst case no longer fits
    /// (an earlier attempt may have been charged; `uncharged` is the charge
    /// of the one just ended, not yet taken), if it does not.
    fn budget_blocks_retry(&self, r: &Running, uncharged: Money) -> Option<String> {
        if !self.config.enforce_budget || self.bug == Some(BrokerBug::IgnoreEnforceBudget) {
            return None;
        }
        let available = self.remaining.saturating_sub(uncharged).saturating_sub(self.reserved);
        let prompt = r.request.prompt_token_bound(r.weights.media_tokens).unwrap_or(u64::MAX);
        let max = r.request.max_tokens;
        match quota::fit_budget(available, prompt, max, self.config.min_output_tokens, &r.weights) {
            Some((effective, _)) if effective >= max => None,
            _ => Some(format!(
                "not retried: the remaining budget ({available}) no longer covers another attempt \
                 (broker.enforce_budget)"
            )),
        }
    }

    /// The back-off before attempt `attempt + 1`, or why there is none.
    fn backoff(
        &self,
        now: Instant,
        r: &Running,
        hint_ms: Option<u64>,
        usage: Option<&Usage>,
    ) -> Result<Duration, String> {
        let tries = 1 + u64::from(self.config.max_retries);
        if u64::from(r.attempt) >= tries {
            // With retries off, nothing to explain.
            return Err(match self.config.max_retries {
                0 => String::new(),
                n => format!("not retried: {tries} attempts made (broker.request.max_retries = {n})"),
            });
        }
        let base = u64::try_from(self.config.retry_base.as_micros()).unwrap_or(u64::MAX);
        let cap = u64::try_from(self.config.retry_after_max.as_micros()).unwrap_or(u64::MAX);
        let exp = base.saturating_mul(1u64.checked_shl(r.attempt - 1).unwrap_or(u64::MAX));
        let hint = hint_ms.map_or(0, |ms| ms.saturating_mul(1_000));
        let delay = Duration::from_micros(exp.max(hint).min(cap).max(1));
        let at = now.saturating_add(delay);
        if at >= r.deadline {
            return Err(format!(
                "not retried: the next attempt, {} ms from now, would start past the request timeout \
                 ({} ms left; broker.request.timeout_seconds)",
                millis(delay),
                millis(r.deadline.saturating_duration_since(now))
            ));
        }
        let uncharged = usage.map_or(Money::ZERO, |u| quota::charge(u, &r.weights));
        match self.budget_blocks_retry(r, uncharged) {
            Some(why) => Err(why),
            None => Ok(delay),
        }
    }

    /// Finish the call backing off: nothing is in flight, so nothing is
    /// dropped and no late usage can come.
    fn end_backoff(&mut self, now: Instant, code: BrokerErrorCode, message: &str, reply: bool) {
        let Some(r) = self.take_running() else { return };
        let wait = millis(r.started.saturating_duration_since(r.enqueued));
        let latency = millis(now.saturating_duration_since(r.started));
        let mut record = self.record(
            r.call,
            r.owner,
            r.model,
            r.queue_len,
            wait,
            Some(&r.trim),
            Some(latency),
            Some(code),
            Money::ZERO,
        );
        record.attempt = Some(r.attempt);
        if reply && !r.owner_gone {
            self.reply(r.call, r.owner, Err(BrokerError::new(code, message)));
        } else {
            self.count_error(code);
        }
        self.outputs.push_back(BrokerOutput::Telemetry(record));
    }

    /// Release the lock's bookkeeping for the running call.
    fn take_running(&mut self) -> Option<Running> {
        let r = self.running.take()?;
        self.calls.remove(&r.call);
        if let Some(t) = &r.cancel_token {
            self.tokens.remove(&(r.scope, t.clone()));
        }
        Some(r)
    }

    fn charge(&mut self, usage: Option<&Usage>, weights: &Weights) -> Money {
        let Some(usage) = usage else { return Money::ZERO };
        let delta = quota::charge(usage, weights);
        self.take(delta)
    }

    /// Take `delta` from the budget; in advisory mode, say once that the
    /// charges passed it.
    fn take(&mut self, delta: Money) -> Money {
        self.remaining = self.remaining.saturating_sub(delta);
        self.stats.charged = Money::from_pico(self.stats.charged.as_pico().saturating_add(delta.as_pico()));
        if !self.config.enforce_budget && !self.stats.budget_passed && self.stats.charged > self.initial {
            self.stats.budget_passed = true;
            self.outputs
                .push_back(BrokerOutput::BudgetPassed { initial: self.initial, charged: self.stats.charged });
        }
        delta
    }

    /// What a call ended with `result` is charged: its reported usage, or,
    /// under `enforce_budget` when the usage is unknown, its `reserve`
    /// (the worst case it was started with); and whether that was the
    /// reserve. The usage is unknown unless reported, except when the
    /// provider answered with an error status: then it refused the call
    /// and billed nothing it did not report.
    fn charge_result(&mut self, result: &ProviderResult, weights: &Weights, reserve: Money) -> (Money, bool) {
        if let Some(u) = result.usage() {
            return (self.charge(Some(&u), weights), false);
        }
        let refused =
            matches!(result, ProviderResult::Err { status: Some(s), .. } if !(200..300).contains(s));
        if refused || !self.enforcing() || reserve == Money::ZERO {
            return (Money::ZERO, false);
        }
        self.stats.reserves_charged += 1;
        (self.take(reserve), true)
    }

    fn provider_done(&mut self, now: Instant, call: CallId, result: ProviderResult) {
        // Whatever the shell did, nothing a child sees carries a secret.
        let mut result = self.redactor.scrub_result(result);
        let attempt_running = self.running.as_ref().filter(|r| r.call == call).map(|r| r.retry_at.is_none());
        if attempt_running == Some(true) {
            if let ProviderResult::Err { status: Some(status), retry_after_ms, usage, message } = &mut result
            {
                if retryable_status(*status) {
                    let plan = match self.running.as_ref() {
                        Some(r) if r.owner_gone => Err(String::new()),
                        Some(r) => self.backoff(now, r, *retry_after_ms, usage.as_ref()),
                        None => Err(String::new()),
                    };
                    match plan {
                        Ok(delay) => {
                            let (usage, status, hint) = (*usage, *status, *retry_after_ms);
                            return self.back_off(now, usage, status, hint, delay);
                        }
                        Err(why) if !why.is_empty() => {
                            message.push_str("; ");
                            message.push_str(&why);
                        }
                        Err(_) => {}
                    }
                }
            }
            if let Some(r) = self.take_running() {
                self.complete(now, r, result);
            }
        } else if attempt_running == Some(false) {
            // Backing off, no attempt in flight: nothing this could be.
            self.stats.stray_results += 1;
        } else if let Some(a) = self.abandoned.remove(&call) {
            self.reserved = self.reserved.saturating_sub(a.reserve);
            let usage = result.usage();
            // No usage is not a late result: the call was dropped and what
            // it cost is unknown.
            if usage.is_some() {
                self.stats.late_results += 1;
            } else {
                self.stats.dropped_usage_unknown += 1;
            }
            let reserve =
                if self.bug == Some(BrokerBug::ReleaseReserveOnCancel) { Money::ZERO } else { a.reserve };
            let (charged, reserve_charged) = self.charge_result(&result, &a.weights, reserve);
            let mut record = self.record(call, a.owner, a.model, 0, 0, None, None, None, charged);
            record.usage = usage;
            record.late_usage = usage.is_some();
            record.dropped_usage_unknown = usage.is_none();
            record.reserve_charged = reserve_charged;
            self.outputs.push_back(BrokerOutput::Telemetry(record));
        } else {
            self.stats.stray_results += 1;
        }
    }

    /// The running attempt failed and is retried after `delay`: charge
    /// what it reported, record it, and keep the lock.
    fn back_off(
        &mut self,
        now: Instant,
        usage: Option<Usage>,
        status: u16,
        hint: Option<u64>,
        delay: Duration,
    ) {
        let Some(weights) = self.running.as_ref().map(|r| r.weights) else { return };
        let charged = self.charge(usage.as_ref(), &weights);
        let Some(r) = self.running.as_ref() else { return };
        let wait = millis(r.started.saturating_duration_since(r.enqueued));
        let latency = millis(now.saturating_duration_since(r.started));
        let mut record = self.record(
            r.call,
            r.owner,
            r.model.clone(),
            r.queue_len,
            wait,
            Some(&r.trim),
            Some(latency),
            Some(BrokerErrorCode::ProviderError),
            charged,
        );
        record.usage = usage;
        record.attempt = Some(r.attempt);
        record.http_status = Some(status);
        record.retry_after_ms = hint;
        record.retry_delay_ms = Some(millis(delay));
        self.outputs.push_back(BrokerOutput::Telemetry(record));
        if let Some(r) = self.running.as_mut() {
            r.retry_at = Some(now.saturating_add(delay));
        }
    }

    fn complete(&mut self, now: Instant, r: Running, result: ProviderResult) {
        let (charged, reserve_charged) = self.charge_result(&result, &r.weights, r.reserve);
        let (mut http_status, mut hint) = (None, None);
        let (usage, outcome) = match result {
            ProviderResult::Ok { messages, usage, model } => {
                let mut metadata = Map::new();
                if r.trim.trim_applied {
                    metadata.insert("trim_applied".into(), true.into());
                    metadata.insert("requested_max_tokens".into(), r.trim.requested.into());
                    metadata.insert("effective_max_tokens".into(), r.trim.effective.into());
                }
                if r.trim.floor_applied {
                    metadata.insert("quota_floor_applied".into(), true.into());
                }
                (usage, Ok(LlmResult { messages, usage, model, metadata }))
            }
            ProviderResult::Err { usage, message, status, retry_after_ms } => {
                (http_status, hint) = (status, retry_after_ms);
                (usage, Err(BrokerError::new(BrokerErrorCode::ProviderError, message)))
            }
        };
        let code = outcome.as_ref().err().map(|e| e.code);
        let wait = millis(r.started.saturating_duration_since(r.enqueued));
        let latency = millis(now.saturating_duration_since(r.started));
        let mut record = self.record(
            r.call,
            r.owner,
            r.model,
            r.queue_len,
            wait,
            Some(&r.trim),
            Some(latency),
            code,
            charged,
        );
        record.usage = usage;
        record.reserve_charged = reserve_charged;
        record.attempt = (r.attempt > 1).then_some(r.attempt);
        record.http_status = http_status;
        record.retry_after_ms = hint;
        if outcome.is_ok() {
            self.stats.succeeded += 1;
        }
        if !r.owner_gone {
            self.reply(r.call, r.owner, outcome);
        } else if let Err(e) = outcome {
            self.count_error(e.code);
        }
        self.outputs.push_back(BrokerOutput::Telemetry(record));
    }

    /// Give up on the running call: drop the provider request, answer now,
    /// free the lock, and remember the call so late usage is still charged.
    fn abandon(&mut self, now: Instant, code: BrokerErrorCode, message: &str) {
        let Some(r) = self.take_running() else { return };
        self.outputs.push_back(BrokerOutput::CancelProvider { call: r.call });
        let wait = millis(r.started.saturating_duration_since(r.enqueued));
        let latency = millis(now.saturating_duration_since(r.started));
        let mut record = self.record(
            r.call,
            r.owner,
            r.model.clone(),
            r.queue_len,
            wait,
            Some(&r.trim),
            Some(latency),
            Some(code),
            Money::ZERO,
        );
        record.attempt = (r.attempt > 1).then_some(r.attempt);
        if r.owner_gone {
            self.count_error(code);
        } else {
            self.reply(r.call, r.owner, Err(BrokerError::new(code, message)));
        }
        self.outputs.push_back(BrokerOutput::Telemetry(record));
        self.reserved = Money::from_pico(self.reserved.as_pico().saturating_add(r.reserve.as_pico()));
        self.abandoned.insert(
            r.call,
            Abandoned { owner: r.owner, model: r.model, weights: r.weights, reserve: r.reserve },
        );
    }

    /// Answer (or, for a departed owner, drop) a call that never started.
    fn finish_unstarted(&mut self, now: Instant, w: Waiter, error: BrokerError, reply: bool) {
        self.finish_parts(now, w.call, w.owner, w.model, w.enqueued, w.queue_len, error, reply);
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_parts(
        &mut self,
        now: Instant,
        call: CallId,
        owner: ClientId,
        model: String,
        enqueued: Instant,
        queue_len: u64,
        error: BrokerError,
        reply: bool,
    ) {
        let wait = millis(now.saturating_duration_since(enqueued));
        let record =
            self.record(call, owner, model, queue_len, wait, None, None, Some(error.code), Money::ZERO);
        if reply {
            self.reply(call, owner, Err(error));
        } else {
            self.count_error(error.code);
        }
        self.outputs.push_back(BrokerOutput::Telemetry(record));
    }

    fn cancel(&mut self, now: Instant, request: CallId, owner: ClientId, token: String) {
        let place = self.tokens.get(&(owner, token)).and_then(|c| self.calls.get(c).map(|p| (*c, *p)));
        let outcome = match place {
            Some((_, Place::Queued(seq))) => match self.remove_waiter(seq) {
                Some(w) => {
                    let e = BrokerError::new(
                        BrokerErrorCode::CancelledBeforeStart,
                        "cancelled while waiting for the broker lock",
                    );
                    self.finish_unstarted(now, w, e, true);
                    CancelOutcome::BeforeStart
                }
                None => CancelOutcome::NotFound,
            },
            Some((call, Place::Running))
                if self.running.as_ref().is_some_and(|r| r.call == call && r.retry_at.is_some()) =>
            {
                // Between attempts the cancel wins at once: no further
                // attempt, nothing in flight to drop.
                self.end_backoff(
                    now,
                    BrokerErrorCode::CancelledAfterStart,
                    "cancelled while waiting to retry the provider call",
                    true,
                );
                CancelOutcome::AfterStart
            }
            Some((call, Place::Running)) if self.running.as_ref().is_some_and(|r| r.call == call) => {
                self.abandon(
                    now,
                    BrokerErrorCode::CancelledAfterStart,
                    "cancelled while the provider call was running",
                );
                CancelOutcome::AfterStart
            }
            _ => CancelOutcome::NotFound,
        };
        self.outputs.push_back(BrokerOutput::CancelResult { request, owner, outcome });
    }

    fn owner_gone(&mut self, now: Instant, owner: ClientId) {
        let seqs: Vec<u64> = self.by_owner.range((owner, 0)..=(owner, u64::MAX)).map(|(_, s)| *s).collect();
        for seq in seqs {
            if let Some(w) = self.remove_waiter(seq) {
                self.stats.dropped_owner_gone += 1;
                let e =
                    BrokerError::new(BrokerErrorCode::CancelledBeforeStart, "client went away while waiting");
                self.finish_unstarted(now, w, e, false);
            }
        }
        if let Some(r) = self.running.as_mut().filter(|r| r.owner == owner) {
            r.owner_gone = true;
            // Between attempts nothing is left to charge: the call is
            // dropped at once and the lock handed on.
            if r.retry_at.is_some() {
                self.end_backoff(
                    now,
                    BrokerErrorCode::CancelledAfterStart,
                    "client went away while waiting to retry",
                    false,
                );
            }
        }
    }

    fn count_error(&mut self, code: BrokerErrorCode) {
        *self.stats.errors_by_code.entry(code).or_default() += 1;
    }

    fn reply(&mut self, call: CallId, owner: ClientId, outcome: Result<LlmResult, BrokerError>) {
        if let Err(e) = &outcome {
            self.count_error(e.code);
        }
        self.outputs.push_back(BrokerOutput::Reply { call, owner, outcome });
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        call: CallId,
        owner: ClientId,
        model: String,
        queue_len: u64,
        wait_ms: u64,
        trim: Option<&Trim>,
        latency_ms: Option<u64>,
        error_code: Option<BrokerErrorCode>,
        charged: Money,
    ) -> TelemetryRecord {
        TelemetryRecord {
            call,
            owner,
            model,
            queue_length_at_enqueue: queue_len,
            wait_duration_ms: wait_ms,
            effective_max_tokens: trim.map(|t| t.effective),
            provider_latency_ms: latency_ms,
            usage: None,
            trim_applied: trim.is_some_and(|t| t.trim_applied),
            error_code,
            charged,
            remaining: self.remaining,
            late_usage: false,
            dropped_usage_unknown: false,
            reserve_charged: false,
            attempt: None,
            http_status: None,
            retry_after_ms: None,
            retry_delay_ms: None,
        }
    }
}
