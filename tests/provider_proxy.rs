//! The provider client through a CONNECT proxy the test starts on
//! loopback: `HTTP_PROXY`/`HTTPS_PROXY` honoured (with credentials),
//! `NO_PROXY` exempting, a refusing proxy reported as such.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

/// A python helper that prints its port, then serves until stdin closes.
struct Helper {
    child: Child,
    port: u16,
}

impl Helper {
    fn start(script: &str) -> Helper {
        let mut child = Command::new("python3")
            .arg(support(script))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (the helpers are python scripts)");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("port line");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("{script} printed {line:?}"));
        child.stdout = Some(stdout.into_inner());
        Helper { child, port }
    }

    /// Stop it; what it printed after its port.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut rest).expect("helper output");
        }
        let _ = self.child.wait();
        rest
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `airlock run --config` with a broker at `base_url`, the child asking
/// `airlock llm hi`, under exactly the proxy variables `env`.
fn ask(base_url: &str, env: &[(&str, String)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!("[broker]\nbase_url = \"{base_url}\"\ndefault_model = \"gpt-4o-mini\"\n"),
    )
    .unwrap();
    let mut cmd = Command::new(airlock());
    cmd.arg("run").arg("--config").arg(&config).args(["--", "sh", "-c", r#""$AIRLOCK" llm hi"#]);
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env_remove("AIRLOCK_FD").envs(env.iter().map(|(k, v)| (k, v))).output().expect("airlock runs")
}

#[test]
fn calls_go_through_the_proxy_the_environment_names() {
    let provider = Helper::start("fake_openai.py");
    let proxy = Helper::start("connect_proxy.py");
    let base = format!("http://127.0.0.1:{}/v1", provider.port);
    let out = ask(&base, &[("HTTP_PROXY", format!("http://u:p@127.0.0.1:{}", proxy.port))]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hi\n");
    assert!(
        stderr.contains(&format!("provider calls go through the proxy 127.0.0.1:{}", proxy.port)),
        "{stderr}"
    );
    assert!(!stderr.contains("u:p"), "credentials in a message: {stderr}");
    let seen = proxy.finish();
    // "dTpw" is base64("u:p").
    assert_eq!(seen, format!("CONNECT 127.0.0.1:{} Basic dTpw\n", provider.port));
}

#[test]
fn no_proxy_exempts_the_provider() {
    let provider = Helper::start("fake_openai.py");
    let proxy = Helper::start("connect_proxy.py");
    let base = format!("http://127.0.0.1:{}/v1", provider.port);
    let out = ask(
        &base,
        &[("http_proxy", format!("127.0.0.1:{}", proxy.port)), ("NO_PROXY", "localhost,127.0.0.1".into())],
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "echo: hi\n");
    assert_eq!(proxy.finish(), "", "the proxy was used despite NO_PROXY");
}

#[test]
fn an_https_provider_is_reached_by_connect_and_a_refusal_is_reported() {
    let proxy = Helper::start("connect_proxy.py");
    // The name resolves nowhere: only the proxy may look it up.
    let out =
        ask("https://provider.invalid/v1", &[("HTTPS_PROXY", format!("http://127.0.0.1:{}", proxy.port))]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(16), "want provider_error: {stderr}");
    assert!(stderr.contains("refused CONNECT provider.invalid:443: HTTP/1.1 403 Forbidden"), "{stderr}");
    assert_eq!(proxy.finish(), "CONNECT provider.invalid:443\n");
}
