//! The environment policy, against the real binary: what of the user's
//! environment reaches `run`'s child, `tool`'s tool and `toolexec serve`'s
//! tools, under the default sandbox.

mod common;

use common::airlock;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The host environment an attacker would love: credentials by name, a
/// proxy URL with a password, an agent socket, and harmless neighbours.
const HOSTILE: [(&str, &str); 11] = [
    ("OPENAI_API_KEY", "sk-openai-value-1111"),
    ("ANTHROPIC_API_KEY", "sk-ant-value-2222"),
    ("AWS_SECRET_ACCESS_KEY", "aws-value-3333"),
    ("GITHUB_TOKEN", "ghp_value-4444"),
    ("HTTPS_PROXY", "http://user:proxy-pw-5555@proxy.example:3128"),
    ("SSH_AUTH_SOCK", "/tmp/ssh-agent-6666.sock"),
    ("GPG_AGENT_INFO", "/run/gpg-7777"),
    ("DB_PASSWORD", "pw-8888"),
    ("GIT_AUTHOR_NAME", "Ada"),
    ("HARMLESS_SETTING", "kept"),
    ("NO_PROXY", "localhost"),
];

const REMOVED: [&str; 8] = [
    "ANTHROPIC_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "DB_PASSWORD",
    "GITHUB_TOKEN",
    "GPG_AGENT_INFO",
    "HTTPS_PROXY",
    "OPENAI_API_KEY",
    "SSH_AUTH_SOCK",
];

fn hostile(cmd: &mut Command) -> &mut Command {
    for (k, v) in HOSTILE {
        cmd.env(k, v);
    }
    cmd
}

/// `NAME=value` lines, as `env` prints them.
fn env_of(text: &str) -> BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

fn no_value_in(text: &str) {
    for (k, v) in HOSTILE {
        if REMOVED.contains(&k) {
            assert!(!text.contains(v), "{k}'s value in {text}");
        }
    }
}

fn run(dir: &Path, flags: &[&str], argv: &[&str]) -> (Output, serde_json::Value) {
    let report = dir.join("report.json");
    let out = hostile(Command::new(airlock()).current_dir(dir).arg("run").arg("--report").arg(&report))
        .args(flags)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("no report: {e}: {out:?}"));
    no_value_in(&report);
    (out, serde_json::from_str(&report).unwrap())
}

fn removed_names(report: &serde_json::Value) -> Vec<String> {
    report["env_removed"]
        .as_array()
        .unwrap_or_else(|| panic!("no env_removed: {report}"))
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

/// By default the child gets the environment minus credentials; airlock's
/// own variables (`AIRLOCK_TOKEN` holds TOKEN) are set after the policy;
/// the report names what was removed and never a value.
#[test]
fn run_removes_credentials_and_reports_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run(dir.path(), &[], &["env"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let env = env_of(&stdout);
    for name in REMOVED {
        assert!(!env.contains_key(name), "{name} reached the child: {stdout}");
    }
    no_value_in(&stdout);
    for name in ["GIT_AUTHOR_NAME", "HARMLESS_SETTING", "NO_PROXY", "PATH"] {
        assert!(env.contains_key(name), "{name} did not reach the child: {stdout}");
    }
    for name in ["AIRLOCK", "AIRLOCK_FD", "AIRLOCK_SOCKET", "AIRLOCK_TOKEN"] {
        assert!(env.contains_key(name), "airlock's own {name} is missing: {stdout}");
    }
    assert_eq!(env["AIRLOCK_TOKEN"].len(), 64, "{stdout}");
    assert_eq!(removed_names(&report), REMOVED, "{report}");
    let reasons: BTreeMap<String, String> = report["env_removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r["reason"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(reasons["HTTPS_PROXY"], "url_password");
    assert_eq!(reasons["SSH_AUTH_SOCK"], "agent_socket");
    assert_eq!(reasons["GITHUB_TOKEN"], "credential_name");
}

/// `--env-pass` lets one named variable through, as does the config's
/// `[env] pass`; the others stay out.
#[test]
fn run_passes_a_named_variable() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run(dir.path(), &["--env-pass", "GITHUB_TOKEN"], &["env"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let env = env_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(env.get("GITHUB_TOKEN").map(String::as_str), Some("ghp_value-4444"));
    assert!(!env.contains_key("ANTHROPIC_API_KEY"));
    assert!(!removed_names(&report).contains(&"GITHUB_TOKEN".to_owned()));

    std::fs::write(dir.path().join("a.toml"), "[env]\npass = [\"DB_PASSWORD\"]\n").unwrap();
    let (out, _) = run(dir.path(), &["--config", "a.toml", "--env-pass", "GITHUB_TOKEN"], &["env"]);
    let env = env_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(env.get("DB_PASSWORD").map(String::as_str), Some("pw-8888"));
    assert_eq!(env.get("GITHUB_TOKEN").map(String::as_str), Some("ghp_value-4444"));
    assert!(!env.contains_key("AWS_SECRET_ACCESS_KEY"));

    // A name that is no name is refused before anything starts.
    let out = hostile(Command::new(airlock()).current_dir(dir.path()).args([
        "run",
        "--env-pass",
        "A=B",
        "--",
        "true",
    ]))
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--env-pass"), "{out:?}");
}

/// `--env-clear` starts from the core set; passes still pass.
#[test]
fn run_env_clear_keeps_the_core_set() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report) = run(dir.path(), &["--env-clear", "--env-pass", "HARMLESS_SETTING"], &["env"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let env = env_of(&String::from_utf8_lossy(&out.stdout));
    let core = ["HOME", "LANG", "LC_ALL", "PATH", "TERM", "TMPDIR", "TZ", "USER"];
    for name in env.keys() {
        assert!(
            core.contains(&name.as_str()) || name.starts_with("AIRLOCK") || name == "HARMLESS_SETTING",
            "{name} passed --env-clear"
        );
    }
    assert!(env.contains_key("PATH") && env.contains_key("HARMLESS_SETTING"));
    assert!(!env.contains_key("NO_PROXY") && !env.contains_key("GIT_AUTHOR_NAME"));
    let removed = removed_names(&report);
    assert!(removed.contains(&"NO_PROXY".to_owned()), "{report}");
}

/// The broker's key never reaches the child, even when passed by name.
#[test]
fn the_broker_key_is_withheld_even_when_passed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.toml"), "[broker]\nbase_url = \"http://127.0.0.1:9\"\n").unwrap();
    let (out, report) = run(
        dir.path(),
        &["--config", "b.toml", "--env-pass", "OPENAI_API_KEY", "--env-pass", "GITHUB_TOKEN"],
        &["env"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("sk-openai-value-1111"), "{stdout}");
    assert!(env_of(&stdout).contains_key("GITHUB_TOKEN"));
    // Taken out of airlock's environment before the policy ran: not even
    // its name is left to report.
    assert!(!removed_names(&report).contains(&"OPENAI_API_KEY".to_owned()), "{report}");
}

/// `airlock tool`: the tool gets the core set and its `--env-pass`
/// names, never a credential, never an `--env-allow` value.
#[test]
fn tool_gets_the_core_set_and_its_passes() {
    let dir = tempfile::tempdir().unwrap();
    let script = "import json, os, sys\n\
                  sys.stdin.readline()\n\
                  print(json.dumps({'jsonrpc': '2.0', 'method': 'result', 'params': {'content': json.dumps(dict(os.environ))}}), flush=True)\n";
    std::fs::write(dir.path().join("t.py"), script).unwrap();
    let tool = |flags: &[&str]| {
        hostile(Command::new(airlock()).current_dir(dir.path()).arg("tool"))
            .args(flags)
            .args(["--", "python3", "t.py"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out =
        tool(&["--env-pass", "HARMLESS_SETTING", "--env-pass", "GITHUB_TOKEN", "--env-allow", "DB_PASSWORD"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let env: BTreeMap<String, String> =
        serde_json::from_str(outcome["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(env.get("HARMLESS_SETTING").map(String::as_str), Some("kept"));
    assert_eq!(env.get("GITHUB_TOKEN").map(String::as_str), Some("ghp_value-4444"));
    for name in ["DB_PASSWORD", "ANTHROPIC_API_KEY", "SSH_AUTH_SOCK", "HTTPS_PROXY", "NO_PROXY"] {
        assert!(!env.contains_key(name), "{name} reached the tool: {env:?}");
    }
    assert!(env.contains_key("PATH"));

    // An --env-allow value is a secret the tool must never see: passing
    // it too is refused at start-up.
    let out = tool(&["--env-allow", "DB_PASSWORD", "--env-pass", "DB_PASSWORD"]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--env-allow"), "{out:?}");
    assert!(out.stdout.is_empty());
}

/// `airlock toolexec serve`: every tool gets the environment minus
/// credentials (the server's own token included), plus `--env-pass`.
#[test]
fn toolexec_tools_get_the_environment_minus_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("t.sock");
    let mut server = hostile(Command::new(airlock()).current_dir(dir.path()))
        .args(["toolexec", "serve", "--tool", "env", "--env-pass", "DB_PASSWORD", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .env("AIFO_TOOLEEXEC_TOKEN", "server-token-9999")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    ready.read_line(&mut line).unwrap();
    assert!(line.starts_with("AIFO_TOOLEEXEC_URL="), "{line}");
    let start = Instant::now();
    while !sock.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(&sock)
        .args(["-H", "Authorization: Bearer server-token-9999", "-H", "X-Aifo-Proto: 1"])
        .args(["--data-urlencode", "tool=env", "http://localhost/exec"])
        .output()
        .unwrap();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(server.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let done = server.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    let body = String::from_utf8_lossy(&out.stdout);
    let env = env_of(&body);
    assert!(env.contains_key("PATH"), "{body} {stderr}");
    assert_eq!(env.get("DB_PASSWORD").map(String::as_str), Some("pw-8888"), "{body}");
    assert!(env.contains_key("HARMLESS_SETTING"), "{body}");
    for name in ["GITHUB_TOKEN", "ANTHROPIC_API_KEY", "AIFO_TOOLEEXEC_TOKEN", "HTTPS_PROXY", "SSH_AUTH_SOCK"]
    {
        assert!(!env.contains_key(name), "{name} reached the tool: {body}");
    }
    assert!(!body.contains("server-token-9999") && !body.contains("ghp_value-4444"), "{body}");
    // The start-up note names what was kept back, never a value.
    assert!(stderr.contains("GITHUB_TOKEN") && !stderr.contains("ghp_value-4444"), "{stderr}");
}
