//! `--config FILE`: airlock's TOML configuration. Its main section,
//! `[broker]`, switches the session's LLM broker on:
//!
//! ```toml
//! [broker]
//! base_url = "http://127.0.0.1:8080/v1"   # POST {base_url}/chat/completions
//! api_key_env = "OPENAI_API_KEY"          # read by airlock; never passed to a child
//! default_model = "gpt-4o-mini"
//! pricing = "pricing.json"                 # relative to this file; built-in sample when absent
//! telemetry = "telemetry.jsonl"            # relative to this file; off when absent
//! initial_units = 5.0                      # the session's budget in USD
//! safety_factor = 0.9
//! inject_remaining_context = false
//! min_output_tokens = 16                   # the soft trim never goes below this
//! default_max_tokens = 4096                # when a request names no max_tokens
//! enforce_budget = false                   # true: refuse calls the budget cannot cover
//! [broker.queue]
//! max_wait_seconds = 30
//! max_pending = 64                         # calls waiting for the lock at most
//! max_pending_bytes = 8388608              # bytes they hold at most
//! [broker.request]
//! timeout_seconds = 60
//! max_retries = 3                          # more attempts after a 429 or 5xx, within the timeout
//! retry_base_ms = 500                      # first back-off; doubles per retry
//! retry_after_max_ms = 20000               # no back-off is longer, whatever Retry-After says
//! ```
//!
//! and, beside it, `[env]` (`pass = ["GITHUB_TOKEN"]`, `clear = false`:
//! the child's environment, as `--env-pass` and `--env-clear` set it).
//!
//! Unknown keys and wrong types are refused at start-up, with the key named
//! (serde's `deny_unknown_fields` and the `toml` crate's located errors).

use airlock_core::broker::{self, BrokerConfig, BrokerSetup, Money, PricingCatalog};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `require_namespaces = true`: `run` refuses to start without them,
    /// as `--require-namespaces` does.
    #[serde(default)]
    pub require_namespaces: bool,
    /// `max_processes = N`, as `--max-processes`.
    #[serde(default)]
    pub max_processes: Option<u64>,
    /// `max_memory = BYTES` or `"4G"`, as `--max-memory`.
    #[serde(default)]
    pub max_memory: Option<Bytes>,
    /// `max_cpu = PERCENT`, as `--max-cpu`.
    #[serde(default)]
    pub max_cpu: Option<u32>,
    pub broker: Option<BrokerSection>,
    pub file_descriptor: Option<crate::fdconfig::FdSection>,
    /// `[env]`: what of airlock's environment the child gets.
    #[serde(default)]
    pub env: EnvSection,
    /// `[egress]`: `--allow-host` and its kin, as a file says them.
    pub egress: Option<crate::egress::EgressSection>,
}

/// `[env]`, as written: `pass = ["NAME", …]` as `--env-pass`, `clear =
/// true` as `--env-clear`; the flags add to it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    #[serde(default)]
    pub pass: Vec<String>,
    #[serde(default)]
    pub clear: bool,
}

/// A byte count: a number, or a string with a unit (`"512M"`, `"4G"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Bytes(n)),
            Raw::Text(t) => {
                airlock_core::sandbox::bounds::parse_bytes(&t).map(Bytes).map_err(serde::de::Error::custom)
            }
        }
    }
}

/// `[broker]`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSection {
    pub base_url: String,
    #[serde(default = "default_api_key_env")]
    pub api_key_env: String,
    #[serde(default = "default_model")]
    pub default_model: String,
    #[serde(default)]
    pub pricing: Option<PathBuf>,
    #[serde(default)]
    pub telemetry: Option<PathBuf>,
    #[serde(default = "default_initial_units")]
    pub initial_units: f64,
    #[serde(default = "default_safety_factor")]
    pub safety_factor: f64,
    #[serde(default)]
    pub inject_remaining_context: bool,
    #[serde(default = "default_min_output_tokens")]
    pub min_output_tokens: u32,
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: u32,
    #[serde(default)]
    pub enforce_budget: bool,
    #[serde(default)]
    pub queue: QueueSection,
    #[serde(default)]
    pub request: RequestSection,
}

fn default_min_output_tokens() -> u32 {
    broker::DEFAULT_MIN_OUTPUT_TOKENS
}

fn default_max_tokens() -> u32 {
    broker::DEFAULT_MAX_TOKENS
}

/// `[broker.queue]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// Seconds; fractions allowed.
    #[serde(default = "default_max_wait")]
    pub max_wait_seconds: f64,
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    #[serde(default = "default_max_pending_bytes")]
    pub max_pending_bytes: u64,
}

fn default_max_pending() -> usize {
    broker::DEFAULT_MAX_PENDING
}

fn default_max_pending_bytes() -> u64 {
    broker::DEFAULT_MAX_PENDING_BYTES
}

/// `[broker.request]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSection {
    /// Seconds; fractions allowed.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    #[serde(default = "default_retry_base_ms")]
    pub retry_base_ms: u64,
    #[serde(default = "default_retry_after_max_ms")]
    pub retry_after_max_ms: u64,
}

fn default_max_retries() -> u32 {
    broker::DEFAULT_MAX_RETRIES
}

fn default_retry_base_ms() -> u64 {
    broker::DEFAULT_RETRY_BASE.as_millis() as u64
}

fn default_retry_after_max_ms() -> u64 {
    broker::DEFAULT_RETRY_AFTER_MAX.as_millis() as u64
}

impl Default for QueueSection {
    fn default() -> Self {
        QueueSection {
            max_wait_seconds: default_max_wait(),
            max_pending: default_max_pending(),
            max_pending_bytes: default_max_pending_bytes(),
        }
    }
}

impl Default for RequestSection {
    fn default() -> Self {
        RequestSection {
            timeout_seconds: default_timeout(),
            max_retries: default_max_retries(),
            retry_base_ms: default_retry_base_ms(),
            retry_after_max_ms: default_retry_after_max_ms(),
        }
    }
}

/// What is wrong with the API key variable `var` whose value is `value`,
/// for a start-up warning: a missing key otherwise shows only as the
/// provider's 401 on the first call.
pub fn api_key_warning(var: &str, value: Option<&str>) -> Option<String> {
    let why = match value {
        // `std::env::var` reads a value that is not UTF-8 as absent too.
        None => "is not set (or not UTF-8)",
        Some("") => "is empty",
        Some(_) => return None,
    };
    Some(format!("{var} (broker.api_key_env) {why}: provider calls are sent without an Authorization header"))
}

/// `api_key_env` when the file names none.
pub const DEFAULT_API_KEY_ENV: &str = "OPENAI_API_KEY";
/// `initial_units` when the file names none, in USD.
pub const DEFAULT_INITIAL_UNITS: f64 = 5.0;

fn default_api_key_env() -> String {
    DEFAULT_API_KEY_ENV.into()
}
fn default_model() -> String {
    broker::DEFAULT_MODEL.into()
}
fn default_initial_units() -> f64 {
    DEFAULT_INITIAL_UNITS
}
fn default_safety_factor() -> f64 {
    broker::DEFAULT_SAFETY_FACTOR
}
fn default_max_wait() -> f64 {
    broker::DEFAULT_QUEUE_MAX_WAIT.as_secs_f64()
}
fn default_timeout() -> f64 {
    broker::DEFAULT_REQUEST_TIMEOUT.as_secs_f64()
}

/// The broker as the shell runs it: the core's setup plus what only the
/// shell needs (where to send calls, the key's variable, the telemetry
/// file).
#[derive(Debug, Clone)]
pub struct BrokerShellConfig {
    pub setup: BrokerSetup,
    pub base_url: String,
    /// The variable holding the provider's API key. airlock reads it and
    /// removes it from every child's environment.
    pub api_key_env: String,
    pub telemetry: Option<PathBuf>,
}

/// What `--config` resolved to.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub broker: Option<BrokerShellConfig>,
    /// `[file_descriptor]`, when present and enabled.
    pub pager: Option<airlock_core::pager::PagerConfig>,
    /// `require_namespaces = true`.
    pub require_namespaces: bool,
    /// `max_processes`, `max_memory`, `max_cpu`.
    pub max_processes: Option<u64>,
    pub max_memory: Option<u64>,
    pub max_cpu: Option<u32>,
    /// `[env]`.
    pub env: EnvSection,
    /// `[egress]`, as written (checked with the flags by `run`).
    pub egress: Option<crate::egress::EgressSection>,
}

/// Read and check `path`. Relative paths inside resolve against the
/// file's own directory.
pub fn load(path: &Path) -> anyhow::Result<Settings> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
    // Absolute, so an error names the file a user should look for.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = absolute.parent().map(Path::to_path_buf).unwrap_or_default();
    parse(&text, &dir).with_context(|| format!("config {}", path.display()))
}

/// Parse config text; `dir` is where relative paths resolve.
pub fn parse(text: &str, dir: &Path) -> anyhow::Result<Settings> {
    let file: FileConfig =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    let broker = match file.broker {
        Some(section) => Some(resolve_broker(section, dir)?),
        None => None,
    };
    let pager = match file.file_descriptor {
        Some(section) => section.resolve()?,
        None => None,
    };
    for name in &file.env.pass {
        crate::envpolicy::check_name(name).with_context(|| format!("env.pass {name:?}"))?;
    }
    Ok(Settings {
        broker,
        pager,
        require_namespaces: file.require_namespaces,
        max_processes: file.max_processes,
        max_memory: file.max_memory.map(|b| b.0),
        max_cpu: file.max_cpu,
        env: file.env,
        egress: file.egress,
    })
}

fn seconds(key: &str, value: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => bail!("{key} = {value}: want a positive number of seconds"),
    }
}

/// A session id for the trace header and `QUOTA`: unique per process on a
/// host (pid and start time), not secret, not reproducible — a replay reads
/// it back from the trace header rather than recomputing it.
pub fn session_id() -> String {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("airlock-{}-{}", std::process::id(), since_epoch.as_millis())
}

fn resolve_broker(s: BrokerSection, dir: &Path) -> anyhow::Result<BrokerShellConfig> {
    let base_url = s.base_url.trim_end_matches('/').to_string();
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        bail!("broker.base_url {:?}: want an http:// or https:// URL", s.base_url);
    }
    if s.api_key_env.is_empty() || s.api_key_env.contains('=') || s.api_key_env.contains('\0') {
        bail!("broker.api_key_env {:?} is not an environment variable name", s.api_key_env);
    }
    let catalog = match &s.pricing {
        Some(p) => {
            let path = dir.join(p);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("broker.pricing: reading {}", path.display()))?;
            PricingCatalog::from_json(&text).with_context(|| format!("broker.pricing: {}", path.display()))?
        }
        None => PricingCatalog::builtin(),
    };
    // Through the shortest decimal text of the number, so 0.1 is exactly
    // 0.1 USD and not the binary float's neighbour.
    let initial_units = Money::from_usd_str(&format!("{}", s.initial_units))
        .filter(|_| s.initial_units.is_finite())
        .with_context(|| {
            format!("broker.initial_units = {}: want a non-negative USD amount", s.initial_units)
        })?;
    let config = BrokerConfig {
        queue_max_wait: seconds("broker.queue.max_wait_seconds", s.queue.max_wait_seconds)?,
        request_timeout: seconds("broker.request.timeout_seconds", s.request.timeout_seconds)?,
        safety_factor: s.safety_factor,
        default_model: s.default_model,
        inject_remaining_context: s.inject_remaining_context,
        min_output_tokens: s.min_output_tokens,
        default_max_tokens: s.default_max_tokens,
        max_pending: s.queue.max_pending,
        max_pending_bytes: s.queue.max_pending_bytes,
        enforce_budget: s.enforce_budget,
        max_retries: s.request.max_retries,
        retry_base: Duration::from_millis(s.request.retry_base_ms),
        retry_after_max: Duration::from_millis(s.request.retry_after_max_ms),
    };
    let setup = BrokerSetup { config, catalog, initial_units, session_id: session_id() };
    setup.validate().map_err(|e| anyhow::anyhow!("broker: {e}"))?;
    Ok(BrokerShellConfig {
        setup,
        base_url,
        api_key_env: s.api_key_env,
        telemetry: s.telemetry.map(|t| dir.join(t)),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unset_or_empty_key_is_warned_about() {
        let w = |v: Option<&str>| super::api_key_warning("K", v);
        assert_eq!(
            w(None).as_deref(),
            Some("K (broker.api_key_env) is not set (or not UTF-8): provider calls are sent without an Authorization header")
        );
        assert!(w(Some("")).is_some_and(|m| m.contains("K (broker.api_key_env) is empty")));
        assert_eq!(w(Some("sk-123")), None);
    }

    use super::*;

    fn err(text: &str) -> String {
        format!("{:#}", parse(text, Path::new("/cfg")).expect_err("refused"))
    }

    #[test]
    fn defaults_follow_the_seed() {
        let s = parse("[broker]\nbase_url = \"http://127.0.0.1:9/v1/\"\n", Path::new("/cfg")).unwrap();
        let b = s.broker.unwrap();
        assert_eq!(b.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(b.api_key_env, "OPENAI_API_KEY");
        assert_eq!(b.telemetry, None);
        assert_eq!(b.setup.config, BrokerConfig::default());
        assert_eq!(b.setup.catalog, PricingCatalog::builtin());
        assert_eq!(b.setup.initial_units, Money::from_usd_str("5").unwrap());
    }

    #[test]
    fn the_shipped_sample_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/airlock.sample.toml");
        let b = load(&path).unwrap().broker.unwrap();
        assert_eq!(b.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(b.setup.catalog, PricingCatalog::builtin());
        // Outside the repository: running the sample writes nothing into a clone.
        assert_eq!(b.telemetry.as_deref(), Some(Path::new("/tmp/airlock-telemetry.jsonl")));
    }

    #[test]
    fn no_broker_section_means_no_broker() {
        assert!(parse("", Path::new("/")).unwrap().broker.is_none());
    }

    #[test]
    fn every_key_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.json"), r#"{"m": {"input": 1, "cached": 0.5, "output": 2}}"#)
            .unwrap();
        let s = parse(
            r#"
[broker]
base_url = "https://example.invalid/v1"
api_key_env = "MY_KEY"
default_model = "m"
pricing = "p.json"
telemetry = "t.jsonl"
initial_units = 0.1
safety_factor = 0.5
inject_remaining_context = true
min_output_tokens = 5
default_max_tokens = 700
enforce_budget = true
[broker.queue]
max_wait_seconds = 0.25
max_pending = 3
max_pending_bytes = 4096
[broker.request]
timeout_seconds = 2
max_retries = 1
retry_base_ms = 100
retry_after_max_ms = 1500
"#,
            dir.path(),
        )
        .unwrap();
        let b = s.broker.unwrap();
        assert_eq!(b.api_key_env, "MY_KEY");
        assert_eq!(b.telemetry, Some(dir.path().join("t.jsonl")));
        assert_eq!(b.setup.initial_units, Money::from_pico(100_000_000_000));
        assert_eq!(b.setup.config.default_model, "m");
        assert_eq!(b.setup.config.safety_factor, 0.5);
        assert!(b.setup.config.inject_remaining_context);
        assert_eq!(b.setup.config.min_output_tokens, 5);
        assert_eq!(b.setup.config.default_max_tokens, 700);
        assert_eq!(b.setup.config.queue_max_wait, Duration::from_millis(250));
        assert!(b.setup.config.enforce_budget);
        assert_eq!((b.setup.config.max_pending, b.setup.config.max_pending_bytes), (3, 4096));
        assert_eq!(b.setup.config.request_timeout, Duration::from_secs(2));
        assert_eq!(b.setup.config.max_retries, 1);
        assert_eq!(b.setup.config.retry_base, Duration::from_millis(100));
        assert_eq!(b.setup.config.retry_after_max, Duration::from_millis(1500));
        assert!(b.setup.catalog.get("m").is_some());
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = err("[broker]\nbase_url = \"http://x\"\nsafety_factr = 0.5\n");
        assert!(e.contains("safety_factr"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.queue]\nmax_wait = 3\n");
        assert!(e.contains("max_wait"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.queue]\nmax_pending = 0\n");
        assert!(e.contains("max_pending"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.queue]\nmax_pending_bytes = -1\n");
        assert!(e.contains("max_pending_bytes"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\nsafety_factor = \"high\"\n");
        assert!(e.contains("safety_factor"), "{e}");
        let e = err("[brokr]\n");
        assert!(e.contains("brokr"), "{e}");
        let e = err("[broker]\ndefault_model = \"gpt-4o\"\n");
        assert!(e.contains("base_url"), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        let e = err("[broker]\nbase_url = \"ftp://x\"\n");
        assert!(e.contains("base_url"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\ninitial_units = -1.0\n");
        assert!(e.contains("initial_units"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.request]\ntimeout_seconds = 0\n");
        assert!(e.contains("timeout_seconds"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.request]\nretry_base_ms = 0\n");
        assert!(e.contains("retry_base_ms"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.request]\nretry_after_max_ms = 10\n");
        assert!(e.contains("retry_after_max_ms"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\n[broker.request]\nmax_retries = -1\n");
        assert!(e.contains("max_retries"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\nsafety_factor = 1.5\n");
        assert!(e.contains("safety_factor"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\ndefault_model = \"nope\"\n");
        assert!(e.contains("nope"), "{e}");
        let e = err("[broker]\nbase_url = \"http://x\"\npricing = \"/no/such/pricing.json\"\n");
        assert!(e.contains("broker.pricing"), "{e}");
    }
}
