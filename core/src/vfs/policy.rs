//! The tool's access policy: project roots, the guard (protected paths,
//! secret files, deny globs: `crate::guard`, the rule every door shares),
//! commands, the network (`--allow-host`/`--deny-host` patterns, the
//! egress core's, narrowed by `--allow-url` prefixes) and environment
//! variables.
//!
//! File decisions are made twice: on the path as the tool wrote it
//! ([`ToolPolicy::project_path`] then [`Gate::check`]), and by the backend
//! on the path it resolves to ([`Gate::check`] again, from
//! [`super::walk`]). Uncovered is denied: there is no inquiry.

use super::effect::OpError;
use super::files::{Gate, ProjectPath};
use super::scrub::Scrubber;
use super::url::path_extends;
pub use super::url::CheckedUrl;
use super::MIN_SECRET_LEN;
use crate::egress::{parse_host, Pattern, Rules};
use crate::guard::{DenySet, Grants, Guard};
use crate::policy::{normalize, Access};
use crate::scope::{Rule, Scope};
use std::fmt;
use std::path::{Path, PathBuf};

/// What the command line says. A trace's header carries it, with the
/// `--env-allow` values left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyConfig {
    /// The project root: absolute, symlinks resolved (the working directory).
    pub project: PathBuf,
    /// `--allow`: read-only roots, project-relative or absolute inside the
    /// project. With no `--allow` and no `--allow-rw`, `.` read-only.
    pub allow: Vec<String>,
    /// `--allow-rw`: read-write roots.
    pub allow_rw: Vec<String>,
    /// `--deny`: gitignore-syntax globs, relative to the project root.
    pub deny: Vec<String>,
    /// `--allow-protected`: protected paths the tool may change,
    /// project-relative or absolute inside the project.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_protected: Vec<String>,
    /// `--allow-secret`: secret files the tool may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_secret: Vec<String>,
    /// Home directories (absolute, resolved) whose start-up files are
    /// protected, besides `/root` and `/home/NAME`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub homes: Vec<PathBuf>,
    /// `--allow-cmd`: each as written (bare name or absolute path), with
    /// the absolute program the shell resolved it to at start.
    pub allow_cmd: Vec<(String, PathBuf)>,
    /// `--allow-url`: URL prefixes.
    pub allow_url: Vec<String>,
    /// `--allow-host`: the egress patterns (`crate::egress::Pattern`), as
    /// `airlock run` reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_host: Vec<String>,
    /// `--deny-host`: checked first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_host: Vec<String>,
    /// `--env-allow`: each variable with airlock's value of it, if set.
    pub env_allow: Vec<(String, Option<String>)>,
    /// The `PATH` `process.run` children get.
    pub path_env: String,
}

/// A command line the policy cannot be built from (exit 125).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyError {
    RootOutsideProject(String),
    /// An `--allow-protected` or `--allow-secret` path outside the project.
    GrantOutsideProject {
        flag: &'static str,
        path: String,
    },
    BadDeny {
        glob: String,
        why: String,
    },
    BadUrlPrefix {
        prefix: String,
        why: String,
    },
    /// An `--allow-host` or `--deny-host` pattern that does not parse.
    BadHostPattern {
        flag: &'static str,
        pattern: String,
        why: String,
    },
    ProjectNotAbsolute(PathBuf),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::RootOutsideProject(r) => write!(f, "root {r:?} is outside the project"),
            PolicyError::GrantOutsideProject { flag, path } => {
                write!(f, "{flag} {path:?} is outside the project")
            }
            PolicyError::BadDeny { glob, why } => write!(f, "--deny {glob:?}: {why}"),
            PolicyError::BadUrlPrefix { prefix, why } => write!(f, "--allow-url {prefix:?}: {why}"),
            PolicyError::BadHostPattern { flag, pattern, why } => write!(f, "{flag} {pattern:?}: {why}"),
            PolicyError::ProjectNotAbsolute(p) => write!(f, "project root {} is not absolute", p.display()),
        }
    }
}

impl std::error::Error for PolicyError {}

#[derive(Clone, Debug, PartialEq, Eq)]
struct UrlPrefix {
    text: String,
    scheme: String,
    host: String,
    port: u16,
    /// Starts with `/`.
    path: String,
}

#[derive(Clone, Debug)]
pub struct ToolPolicy {
    gate: Gate,
    commands: Vec<(String, PathBuf)>,
    urls: Vec<UrlPrefix>,
    /// The host patterns every request goes by (see [`net_rules`]).
    ///
    /// [`net_rules`]: ToolPolicy::net_rules
    net: Rules,
    env: Vec<(String, Option<String>)>,
    path_env: String,
}

impl ToolPolicy {
    pub fn new(cfg: &PolicyConfig) -> Result<Self, PolicyError> {
        if !cfg.project.is_absolute() {
            return Err(PolicyError::ProjectNotAbsolute(cfg.project.clone()));
        }
        let project = normalize(&cfg.project).unwrap_or_else(|| cfg.project.clone());
        let mut rules = Vec::new();
        let defaults = [".".to_string()];
        let ro: &[String] =
            if cfg.allow.is_empty() && cfg.allow_rw.is_empty() { &defaults } else { &cfg.allow };
        for (roots, access) in [(ro, Access::ReadOnly), (&cfg.allow_rw[..], Access::ReadWrite)] {
            for r in roots {
                let rel = root_rel(&project, r).ok_or_else(|| PolicyError::RootOutsideProject(r.clone()))?;
                rules.push((rel, access));
            }
        }
        // The most specific root decides; of two equal roots the writable.
        rules.sort();
        let mut scope_rules: Vec<Rule> = Vec::new();
        for (rel, access) in rules {
            let path = Path::new("/").join(&rel);
            match scope_rules.iter_mut().find(|r| r.path == path) {
                Some(r) => r.access = r.access.max(Some(access)),
                None => scope_rules.push(Rule { path, access: Some(access) }),
            }
        }
        let scope = Scope::from_rules(scope_rules);
        for g in &cfg.deny {
            DenySet::new(project.clone(), vec![g.clone()])
                .map_err(|e| PolicyError::BadDeny { glob: g.clone(), why: e.to_string() })?;
        }
        let deny = DenySet::new(project.clone(), cfg.deny.clone())
            .map_err(|e| PolicyError::BadDeny { glob: cfg.deny.join(" "), why: e.to_string() })?;
        let grants = |flag: &'static str, paths: &[String]| -> Result<Grants, PolicyError> {
            let mut out = Vec::new();
            for p in paths {
                let rel = root_rel(&project, p)
                    .ok_or_else(|| PolicyError::GrantOutsideProject { flag, path: p.clone() })?;
                out.push(project.join(rel));
            }
            Ok(Grants::new(out))
        };
        let guard = Guard::new(
            grants("--allow-protected", &cfg.allow_protected)?,
            grants("--allow-secret", &cfg.allow_secret)?,
            Some(deny),
            cfg.homes.iter().cloned(),
        );
        let mut urls = Vec::new();
        for u in &cfg.allow_url {
            urls.push(parse_prefix(u)?);
        }
        let net = net_rules(cfg, &urls)?;
        let scrubber = Scrubber::new(cfg.env_allow.iter().filter_map(|(_, v)| v.as_deref()), MIN_SECRET_LEN);
        Ok(ToolPolicy {
            gate: Gate::new(project, scope, guard, scrubber),
            commands: cfg.allow_cmd.clone(),
            urls,
            net,
            env: cfg.env_allow.clone(),
            path_env: cfg.path_env.clone(),
        })
    }

    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    pub(crate) fn gate_mut(&mut self) -> &mut Gate {
        &mut self.gate
    }

    pub fn project(&self) -> &Path {
        self.gate.project()
    }

    pub fn scrubber(&self) -> &Scrubber {
        self.gate.scrubber()
    }

    pub fn path_env(&self) -> &str {
        &self.path_env
    }

    /// The lexical check of a path the tool sent: relative, no `..`,
    /// no NUL; `.` components dropped (`.` is the project root).
    pub fn project_path(&self, text: &str) -> Result<ProjectPath, OpError> {
        ProjectPath::parse(text)
    }

    /// `program` must equal an `--allow-cmd` as written: its resolved path.
    pub fn check_program(&self, program: &str) -> Result<PathBuf, OpError> {
        self.commands.iter().find(|(given, _)| given == program).map(|(_, p)| p.clone()).ok_or_else(|| {
            if self.commands.is_empty() {
                OpError::denied(format!(
                    "process.run of {program:?} denied: no --allow-cmd allows any program"
                ))
            } else {
                OpError::denied(format!("process.run of {program:?} denied: it is not an --allow-cmd"))
            }
        })
    }

    /// An `--env-allow`ed variable's value: not allowed `-32001`, unset `-32002`.
    pub fn env_value(&self, name: &str) -> Result<&str, OpError> {
        match self.env.iter().find(|(n, _)| n == name) {
            None => Err(OpError::denied(format!("variable {name} is not --env-allow'ed"))),
            Some((_, None)) => Err(OpError::not_found(format!("variable {name} is not set"))),
            Some((_, Some(v))) => Ok(v),
        }
    }

    /// Whether `name` is `--env-allow`ed (set or not).
    pub fn env_allowed(&self, name: &str) -> bool {
        self.env.iter().any(|(n, _)| n == name)
    }

    /// Substitute `${VAR}` in a header value.
    pub fn substitute(&self, value: &str) -> Result<String, OpError> {
        let mut out = String::with_capacity(value.len());
        let mut rest = value;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let Some(end) = after.find('}') else {
                return Err(OpError::invalid("unterminated ${ in a header value"));
            };
            let name = &after[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(OpError::invalid(format!("${{{name}}} is not a variable name")));
            }
            out.push_str(self.env_value(name)?);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The host patterns `http.*` goes by, as `airlock run`'s proxies do:
    /// `--allow-host` and `--deny-host`; with no `--allow-host`, each
    /// `--allow-url` prefix's `host:port` (so a prefix naming an address
    /// names it for the address check too, and one naming `localhost`
    /// reaches no loopback address unless an `--allow-host` names it).
    /// The shell checks every address it connects to against these
    /// ([`Rules::check_address`]).
    pub fn net_rules(&self) -> &Rules {
        &self.net
    }

    /// A URL is normalized first ([`super::url::normalize`]: the form the
    /// request is sent in); when there is any `--allow-url`, it must share
    /// a prefix's scheme, host and port, its path extending the prefix's
    /// at a `/`; its host and port must then pass the host patterns
    /// ([`Self::net_rules`], deny first). Userinfo and
    /// whatever a server could read two ways are refused.
    pub fn check_url(&self, url: &str) -> Result<CheckedUrl, OpError> {
        let u = super::url::normalize(url).map_err(|why| {
            if why.is_policy() {
                OpError::denied(format!("url {url:?} denied: {why}"))
            } else {
                OpError::invalid(format!("url {url:?}: {why}"))
            }
        })?;
        if self.net.is_off() {
            return Err(OpError::denied(format!(
                "url {url:?} denied: no --allow-host or --allow-url allows any network access"
            )));
        }
        // The prefixes first: a URL under none is refused in the words it
        // always was (recorded traces hold them).
        let under = |p: &UrlPrefix| {
            p.scheme == u.scheme && p.host == u.host && p.port == u.port && path_extends(&u.path, &p.path)
        };
        if !self.urls.is_empty() && !self.urls.iter().any(under) {
            return Err(OpError::denied(format!("url {url:?} denied: it is under no --allow-url prefix")));
        }
        let bare = u.host.trim_start_matches('[').trim_end_matches(']');
        let host = parse_host(bare)
            .map_err(|e| OpError::denied(format!("url {url:?} denied: host {:?}: {e}", u.host)))?;
        if let Err(rule) = self.net.check_request(&host, u.port) {
            return Err(OpError::denied(format!("url {url:?} denied: {rule} (host {}:{})", u.host, u.port)));
        }
        Ok(u)
    }
}

/// The rules of [`ToolPolicy::net_rules`].
fn net_rules(cfg: &PolicyConfig, urls: &[UrlPrefix]) -> Result<Rules, PolicyError> {
    let parse = |flag: &'static str, texts: &[String]| -> Result<Vec<Pattern>, PolicyError> {
        texts
            .iter()
            .map(|t| {
                t.parse::<Pattern>().map_err(|e| PolicyError::BadHostPattern {
                    flag,
                    pattern: t.clone(),
                    why: e.to_string(),
                })
            })
            .collect()
    };
    let mut allow = parse("--allow-host", &cfg.allow_host)?;
    if allow.is_empty() {
        for p in urls {
            let text = format!("{}:{}", p.host, p.port);
            let pattern = text.parse::<Pattern>().map_err(|e| PolicyError::BadUrlPrefix {
                prefix: p.text.clone(),
                why: format!("its host {text:?} is no host pattern: {e}"),
            })?;
            allow.push(pattern);
        }
    }
    Ok(Rules { allow, deny: parse("--deny-host", &cfg.deny_host)? })
}

fn root_rel(project: &Path, root: &str) -> Option<PathBuf> {
    if root.is_empty() || root.contains('\0') {
        return None;
    }
    let p = Path::new(root);
    let abs = if p.is_absolute() { normalize(p)? } else { normalize(&project.join(p))? };
    let rel = abs.strip_prefix(project).ok()?;
    Some(rel.to_path_buf())
}

fn parse_prefix(text: &str) -> Result<UrlPrefix, PolicyError> {
    let bad = |why: String| PolicyError::BadUrlPrefix { prefix: text.to_string(), why };
    if text.contains('?') {
        return Err(bad("a prefix has no query".into()));
    }
    // A prefix spelled with dot segments would not read as written.
    if text.split(['/', '?']).skip(3).any(|s| s == "." || s == "..") {
        return Err(bad("dot segments".into()));
    }
    let u = super::url::normalize(text).map_err(|e| bad(e.to_string()))?;
    Ok(UrlPrefix { text: text.to_string(), scheme: u.scheme, host: u.host, port: u.port, path: u.path })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ToolPolicy {
        ToolPolicy::new(&PolicyConfig {
            project: "/p".into(),
            allow: vec!["src".into()],
            allow_rw: vec!["src/out".into(), "/p/tmp".into()],
            deny: vec!["*.key".into(), "secret/".into()],
            allow_cmd: vec![("git".into(), "/usr/bin/git".into())],
            allow_url: vec!["https://api.example.com/v1".into(), "http://127.0.0.1:8080/".into()],
            env_allow: vec![("TOKEN".into(), Some("tok-123456".into())), ("UNSET".into(), None)],
            path_env: "/usr/bin".into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn roots_outside_the_project_are_refused() {
        let mut c = PolicyConfig { project: "/p".into(), ..Default::default() };
        c.allow = vec!["../x".into()];
        assert!(matches!(ToolPolicy::new(&c), Err(PolicyError::RootOutsideProject(_))));
        c.allow = vec!["/etc".into()];
        assert!(ToolPolicy::new(&c).is_err());
        c.allow = vec!["/p/sub".into()];
        assert!(ToolPolicy::new(&c).is_ok());
    }

    fn net(allow_url: &[&str], allow_host: &[&str], deny_host: &[&str]) -> ToolPolicy {
        let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ToolPolicy::new(&PolicyConfig {
            project: "/p".into(),
            allow_url: strs(allow_url),
            allow_host: strs(allow_host),
            deny_host: strs(deny_host),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn host_patterns_decide_as_run_does() {
        let p = net(&[], &["*.example.com", "127.0.0.1:8080"], &["secret.example.com"]);
        assert!(p.check_url("https://api.example.com/anything").is_ok());
        assert!(p.check_url("http://127.0.0.1:8080/x").is_ok());
        let e = p.check_url("https://secret.example.com/").unwrap_err();
        assert_eq!(e.code, OpError::denied("").code);
        assert!(e.message.contains("--deny-host secret.example.com"), "{}", e.message);
        assert!(e.message.contains("(host secret.example.com:443)"), "{}", e.message);
        let e = p.check_url("http://127.0.0.1:8081/").unwrap_err();
        assert!(e.message.contains("no --allow-host pattern matches (host 127.0.0.1:8081)"), "{}", e.message);
        // The host as resolvers read it: case.
        assert!(p.check_url("https://API.Example.com/v1").is_ok());
        // The address check is the shell's, on what it connects to, with these rules.
        let lo = "127.0.0.1".parse().unwrap();
        assert!(p.net_rules().check_address(lo, 8080).is_ok());
        assert!(p.net_rules().check_address(lo, 8081).is_err());
        let e = net(&[], &[], &[]).check_url("https://example.com/").unwrap_err();
        assert!(e.message.contains("no --allow-host or --allow-url allows any network access"));
        let bad = ToolPolicy::new(&PolicyConfig {
            project: "/p".into(),
            deny_host: vec!["a.*.com".into()],
            ..Default::default()
        });
        assert!(matches!(bad, Err(PolicyError::BadHostPattern { flag: "--deny-host", .. })));
    }

    #[test]
    fn url_prefixes_narrow_the_host_patterns() {
        // Alone, a prefix's host and port are the pattern: a prefix naming
        // an address names it for the address check too.
        let p = net(&["http://127.0.0.1:8080/api", "http://localhost:9/"], &[], &[]);
        let lo = "127.0.0.1".parse().unwrap();
        assert!(p.net_rules().check_address(lo, 8080).is_ok());
        assert!(p.net_rules().check_address(lo, 9).is_err());
        assert!(p.check_url("http://127.0.0.1:8080/api/x").is_ok());
        assert!(p.check_url("http://127.0.0.1:8080/other").is_err());
        // With --allow-host, both must allow.
        let p = net(&["http://127.0.0.1:8080/api"], &["127.0.0.1"], &[]);
        assert!(p.check_url("http://127.0.0.1:8080/api").is_ok());
        assert!(p
            .check_url("http://127.0.0.1:8081/api")
            .unwrap_err()
            .message
            .contains("under no --allow-url"));
        let p = net(&["http://127.0.0.1:8080/api"], &["example.com"], &[]);
        assert!(p.check_url("http://127.0.0.1:8080/api").unwrap_err().message.contains("no --allow-host"));
        // --deny-host refuses what a prefix allows.
        let p = net(&["http://127.0.0.1:8080/"], &[], &["127.0.0.0/8"]);
        assert!(p
            .check_url("http://127.0.0.1:8080/")
            .unwrap_err()
            .message
            .contains("--deny-host 127.0.0.0/8"));
    }

    #[test]
    fn urls() {
        let p = policy();
        assert!(p.check_url("https://api.example.com/v1").is_ok());
        assert!(p.check_url("https://API.example.com:443/v1/repos?x=1").is_ok());
        assert!(p.check_url("https://api.example.com/v10").is_err());
        assert!(p.check_url("https://api.example.com/v1/../admin").is_err());
        assert!(p.check_url("https://api.example.com/v1/%2E%2e/admin").is_err());
        assert!(p.check_url("https://u:p@api.example.com/v1").is_err());
        assert!(p.check_url("http://api.example.com/v1").is_err());
        assert!(p.check_url("https://api.example.com:8443/v1").is_err());
        assert!(p.check_url("http://127.0.0.1:8080/anything").is_ok());
        assert!(p.check_url("http://127.0.0.1:8081/").is_err());
        assert!(p.check_url("ftp://127.0.0.1:8080/").is_err());
        assert!(p.check_url("not a url").is_err());
    }

    #[test]
    fn commands_env_and_substitution() {
        let p = policy();
        assert_eq!(p.check_program("git").unwrap(), PathBuf::from("/usr/bin/git"));
        assert!(p.check_program("/usr/bin/git").is_err());
        assert!(p.check_program("sh").is_err());
        assert_eq!(p.substitute("Bearer ${TOKEN}!").unwrap(), "Bearer tok-123456!");
        assert_eq!(
            p.substitute("${OTHER}").unwrap_err().code,
            crate::codec::jsonrpc::ErrorCode::AccessDenied
        );
        assert_eq!(p.substitute("${UNSET}").unwrap_err().code, crate::codec::jsonrpc::ErrorCode::NotFound);
        assert!(p.substitute("${TOKEN").is_err());
        assert_eq!(&*p.scrubber().bytes(b"x tok-123456 y"), b"x [REDACTED] y");
    }
}
