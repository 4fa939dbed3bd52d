//! Network egress by host name (`--allow-host`, `--deny-host`): the
//! options and the `[egress]` section, the proxy variables a child gets,
//! and the service that serves the proxies ([`service`]). Every decision
//! is the core's (`airlock_core::egress`); this module reads settings and
//! moves bytes.

pub mod service;

use airlock_core::egress::{self as core, Config, Pattern, Rules, HTTP_PROXY_PORT, SOCKS_PROXY_PORT};
use airlock_core::sandbox::{Confinement, EgressListen};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The options of `airlock run` for the network.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EgressArgs {
    /// Let the child reach PATTERN through airlock's HTTP and SOCKS5
    /// proxies: a name (pypi.org), a wildcard (*.githubusercontent.com),
    /// `*`, an IP address or CIDR range, each optionally with :PORT. A
    /// loopback, private, link-local or metadata address is reached only
    /// when a pattern names that address or range itself.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    pub allow_host: Vec<String>,
    /// Refuse PATTERN even where an --allow-host pattern matches (checked
    /// first; an address or range refuses every name resolving into it).
    #[arg(long = "deny-host", value_name = "PATTERN")]
    pub deny_host: Vec<String>,
    /// Proxy connections open at once (past it: 429, or a SOCKS refusal).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Bytes the session may move through the proxies, both ways together.
    #[arg(long, value_name = "BYTES")]
    pub max_egress_bytes: Option<u64>,
    /// Answer NAME with ADDR (one or more, comma-separated) instead of
    /// looking it up, like curl's --resolve; the addresses are checked as
    /// any lookup's are.
    #[arg(long = "resolve", value_name = "NAME=ADDR[,ADDR]")]
    pub resolve: Vec<String>,
}

/// The host patterns alone, for `airlock tool` and `airlock toolexec
/// serve`: the same flags, patterns and checks as `run`'s
/// ([`EgressArgs`]), without its session limits where those commands
/// have options of their own by those names.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HostArgs {
    /// Let the network reach PATTERN, as `airlock run --allow-host` does:
    /// a name (pypi.org), a wildcard (*.githubusercontent.com), `*`, an IP
    /// address or CIDR range, each optionally with :PORT. A loopback,
    /// private, link-local or metadata address is reached only when a
    /// pattern names that address or range itself.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    pub allow_host: Vec<String>,
    /// Refuse PATTERN even where an --allow-host pattern matches (checked
    /// first; an address or range refuses every name resolving into it).
    #[arg(long = "deny-host", value_name = "PATTERN")]
    pub deny_host: Vec<String>,
    /// Answer NAME with ADDR (one or more, comma-separated) instead of
    /// looking it up, like curl's --resolve; the addresses are checked as
    /// any lookup's are.
    #[arg(long = "resolve", value_name = "NAME=ADDR[,ADDR]")]
    pub resolve: Vec<String>,
}

impl HostArgs {
    /// The egress config these flags make (the limits at their defaults),
    /// or `None` without an `--allow-host`.
    pub fn config(&self) -> anyhow::Result<Option<Config>> {
        EgressArgs {
            allow_host: self.allow_host.clone(),
            deny_host: self.deny_host.clone(),
            resolve: self.resolve.clone(),
            ..EgressArgs::default()
        }
        .config(None)
    }

    /// The `--resolve` answers alone (checked as [`Self::config`] does).
    pub fn hosts(&self) -> anyhow::Result<BTreeMap<String, Vec<IpAddr>>> {
        let mut out = BTreeMap::new();
        for entry in &self.resolve {
            let (name, addrs) = entry.split_once('=').context("--resolve wants NAME=ADDR[,ADDR]")?;
            let addrs: Vec<String> = addrs.split(',').map(str::to_owned).collect();
            let (name, addrs) = resolve_entry(name, &addrs)?;
            out.insert(name, addrs);
        }
        Ok(out)
    }
}

/// `[egress]` in the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    #[serde(default)]
    pub allow_host: Vec<String>,
    #[serde(default)]
    pub deny_host: Vec<String>,
    pub max_connections: Option<usize>,
    pub max_bytes: Option<u64>,
    /// Names answered without a lookup.
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<String>>,
}

fn patterns(flag: &str, texts: &[String]) -> anyhow::Result<Vec<Pattern>> {
    texts.iter().map(|t| t.parse().map_err(|e| anyhow::anyhow!("{flag} {t:?}: {e}"))).collect()
}

fn resolve_entry(name: &str, addrs: &[String]) -> anyhow::Result<(String, Vec<IpAddr>)> {
    let host = core::parse_host(name).map_err(|e| anyhow::anyhow!("--resolve {name:?}: {e}"))?;
    let core::Host::Name(name) = host else { bail!("--resolve {name:?}: an address needs no resolving") };
    let addrs = addrs
        .iter()
        .map(|a| {
            a.trim().parse::<IpAddr>().with_context(|| format!("--resolve {name}: {a:?} is not an address"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if addrs.is_empty() {
        bail!("--resolve {name}: no address");
    }
    Ok((name, addrs))
}

impl EgressArgs {
    /// The machine's config from the flags and the `[egress]` section
    /// (patterns of both; a flag's limit over the section's), or `None`
    /// when no pattern allows anything: the child's network is then its
    /// private loopback alone, as without these options.
    pub fn config(&self, section: Option<&EgressSection>) -> anyhow::Result<Option<Config>> {
        let empty = EgressSection::default();
        let s = section.unwrap_or(&empty);
        let allow: Vec<String> = s.allow_host.iter().chain(&self.allow_host).cloned().collect();
        let deny: Vec<String> = s.deny_host.iter().chain(&self.deny_host).cloned().collect();
        let rules = Rules { allow: patterns("--allow-host", &allow)?, deny: patterns("--deny-host", &deny)? };
        if rules.is_off() {
            if !rules.deny.is_empty() || !self.resolve.is_empty() || !s.resolve.is_empty() {
                eprintln!("airlock: note: --deny-host and --resolve do nothing without an --allow-host");
            }
            return Ok(None);
        }
        let mut config = Config::new(rules);
        if let Some(n) = self.max_connections.or(s.max_connections) {
            if n == 0 {
                bail!("--max-connections must be at least 1");
            }
            config.max_connections = n;
        }
        if let Some(n) = self.max_egress_bytes.or(s.max_bytes) {
            config.max_bytes = n;
        }
        for (name, addrs) in &s.resolve {
            let (name, addrs) = resolve_entry(name, addrs)?;
            config.hosts.insert(name, addrs);
        }
        for entry in &self.resolve {
            let (name, addrs) = entry.split_once('=').context("--resolve wants NAME=ADDR[,ADDR]")?;
            let addrs: Vec<String> = addrs.split(',').map(str::to_owned).collect();
            let (name, addrs) = resolve_entry(name, &addrs)?;
            config.hosts.insert(name, addrs);
        }
        Ok(Some(config))
    }
}

/// The descriptor the stage gets the listeners' channel on: right after
/// its status pipe.
pub fn listen_for(confinement: &Confinement) -> EgressListen {
    // status_fd + 1 is the served filesystem's socket.
    EgressListen { fd: confinement.status_fd + 2, http_port: HTTP_PROXY_PORT, socks_port: SOCKS_PROXY_PORT }
}

/// Refuse what cannot work with `--allow-host`, naming the flags.
pub fn check_options(no_sandbox: bool, sandbox_net: bool) -> anyhow::Result<()> {
    if no_sandbox {
        bail!(
            "--allow-host works through the sandbox's network namespace; with --no-sandbox the child \
             has the host's whole network and nothing to allow"
        );
    }
    if sandbox_net {
        bail!("--allow-host and --sandbox-net contradict each other: --sandbox-net gives the child the host's whole network");
    }
    if std::env::var_os(crate::confine::NO_NAMESPACES_ENV).is_some_and(|v| v != "0" && !v.is_empty()) {
        bail!(
            "--allow-host needs a network namespace of the child's own, and {}=1 switches namespaces \
             off; without one, the proxy's port would be open to the child on every host",
            crate::confine::NO_NAMESPACES_ENV
        );
    }
    Ok(())
}

/// What a confined child is told: every proxy variable, in both cases
/// (curl reads only the lowercase `http_proxy`), with the SOCKS5 proxy
/// resolving names itself (`socks5h`), `NO_PROXY` empty (nothing is
/// reached directly: the child's namespace has no other route, and a
/// value inherited from the user's shell would send clients around the
/// proxy into nothing), and Node told to honour them.
pub fn child_env() -> Vec<(OsString, OsString)> {
    let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PROXY_PORT}");
    let mut env = Vec::new();
    for (name, value) in
        [("HTTP_PROXY", &http), ("HTTPS_PROXY", &http), ("ALL_PROXY", &socks), ("NO_PROXY", &String::new())]
    {
        env.push((OsString::from(name), OsString::from(value)));
        env.push((OsString::from(name.to_ascii_lowercase()), OsString::from(value)));
    }
    env.push((OsString::from("NODE_USE_ENV_PROXY"), OsString::from("1")));
    env
}

/// Where `--record FILE`'s egress trace goes: beside FILE, `.egress`
/// before its extension (`run.jsonl` → `run.egress.jsonl`).
pub fn trace_path(record: &Path) -> PathBuf {
    let stem = record.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = record.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_else(|| "jsonl".into());
    record.with_file_name(format!("{stem}.egress.{ext}"))
}

/// What airlock says on stderr at the end of a session whose proxies hit
/// a limit: the child was told (a 429, a SOCKS refusal, a cut tunnel),
/// and whoever runs airlock must be too, with a report or without.
pub fn limit_messages(config: &Config, stopped: &service::Stopped) -> Vec<String> {
    let refused_at = |flag: &str| {
        let key = core::Rule::Limit { flag: flag.into() }.to_string();
        stopped.stats.by_rule.get(&key).copied().unwrap_or(0)
    };
    let mut out = Vec::new();
    let n = refused_at("--max-connections");
    if n > 0 {
        out.push(format!(
            "airlock: the session reached --max-connections {}: {n} proxy connection(s) past it were refused",
            config.max_connections
        ));
    }
    let n = refused_at("--max-egress-bytes");
    // Only the byte budget cuts a tunnel that was let through.
    let cut = stopped.cut_by_limit;
    if n > 0 || cut > 0 {
        out.push(format!(
            "airlock: the session reached --max-egress-bytes {}: {n} proxy connection(s) refused, {cut} \
             cut short",
            config.max_bytes
        ));
    }
    out
}

/// The report's egress section.
#[derive(Debug, serde::Serialize)]
pub struct EgressReport {
    pub allow_host: Vec<String>,
    pub deny_host: Vec<String>,
    pub http_proxy: String,
    pub socks_proxy: String,
    #[serde(flatten)]
    pub stats: core::Stats,
}

impl EgressReport {
    pub fn new(config: &Config, stats: core::Stats) -> Self {
        EgressReport {
            allow_host: config.rules.allow.iter().map(ToString::to_string).collect(),
            deny_host: config.rules.deny.iter().map(ToString::to_string).collect(),
            http_proxy: format!("127.0.0.1:{HTTP_PROXY_PORT}"),
            socks_proxy: format!("127.0.0.1:{SOCKS_PROXY_PORT}"),
            stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_the_section_make_one_config() {
        let args = EgressArgs {
            allow_host: vec!["pypi.org".into()],
            resolve: vec!["forge.test=127.0.0.1,::1".into()],
            max_connections: Some(3),
            ..EgressArgs::default()
        };
        let section = EgressSection {
            allow_host: vec!["*.pythonhosted.org:443".into()],
            deny_host: vec!["10.0.0.0/8".into()],
            max_connections: Some(9),
            max_bytes: Some(1000),
            ..EgressSection::default()
        };
        let c = args.config(Some(&section)).unwrap().unwrap();
        let allow: Vec<String> = c.rules.allow.iter().map(ToString::to_string).collect();
        assert_eq!(allow, ["*.pythonhosted.org:443", "pypi.org"]);
        assert_eq!((c.max_connections, c.max_bytes), (3, 1000));
        assert_eq!(
            c.hosts["forge.test"],
            vec!["127.0.0.1".parse::<IpAddr>().unwrap(), "::1".parse().unwrap()]
        );
        assert!(EgressArgs::default().config(None).unwrap().is_none());
        let bad = EgressArgs { allow_host: vec!["a.*.com".into()], ..EgressArgs::default() };
        assert!(bad.config(None).unwrap_err().to_string().contains("--allow-host \"a.*.com\""));
    }

    #[test]
    fn the_trace_goes_beside_the_record() {
        assert_eq!(trace_path(Path::new("/t/run.jsonl")), Path::new("/t/run.egress.jsonl"));
        assert_eq!(trace_path(Path::new("run")), Path::new("run.egress.jsonl"));
    }
}
