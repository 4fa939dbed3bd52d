//! `clients/python/airlock_client.py` against the real binary: a python
//! child under `airlock run` using it for files and the LLM broker (with a
//! local fake provider), and without a `[broker]`.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python")
}

/// `airlock run --sandbox-ro clients/python ARGS -- python3 -c SCRIPT`,
/// the client importable.
fn run_client(dir: &Path, args: &[&str], script: &str) -> Run {
    let client = client_dir().display().to_string();
    let mut all = vec!["--sandbox-ro", client.as_str()];
    all.extend_from_slice(args);
    let prelude = format!(
        "import sys, json; sys.path.insert(0, {client:?})\nfrom airlock_client import Client, AirlockError\ndef out(v): print(json.dumps(v), flush=True)\n"
    );
    run_in(dir, &all, &["python3".into(), "-c".into(), format!("{prelude}{script}")])
}

struct Provider {
    child: Child,
    port: u16,
}

impl Provider {
    fn start() -> Provider {
        let mut child = Command::new("python3")
            .arg(support("fake_openai.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (the fake provider is a python script)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("port line");
        let port = line.trim().parse().unwrap_or_else(|_| panic!("fake provider printed {line:?}"));
        Provider { child, port }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn files_and_llm_through_the_python_client() {
    let provider = Provider::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[broker]\nbase_url = \"http://127.0.0.1:{}/v1\"\ndefault_model = \"gpt-4o-mini\"\n",
            provider.port
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let (config, data) = (config.display().to_string(), data.display().to_string());
    let script = format!(
        r#"
with Client.from_env() as c:
    c.write_file({data:?} + "/a.txt", b"x" * 10000)
    c.write_file({data:?} + "/a.txt", b"!", append=True)
    body = c.read_file({data:?} + "/a.txt")
    out(["file", len(body), body[-2:].decode()])
    try:
        c.open("/etc/passwd")
    except AirlockError as e:
        out(["refused", e.code, e.path])
    out(["quota", c.quota()["currency"]])
    # A slow LLMCMD, then a quick open: the open's answer comes first and
    # is kept while the LLMCMD's caller waits.
    slow = c.send("LLMCMD", {{"messages": [{{"role": "user", "content": "delay=300 slow"}}]}})
    quick = c.send("open", {{"path": {data:?} + "/a.txt", "mode": "r"}})
    out(["slow", c.wait(slow)["messages"][-1]["content"]])
    h = c.wait(quick)["handle"]
    out(["quick", len(c.read(h, 5))])
    c.close_handle(h)
    out(["ask", c.ask("hello", system="be brief")["messages"][-1]["content"]])
    out(["cancel", c.cancel("nothing")["state"]])
"#
    );
    let run = run_client(dir.path(), &["--config", &config, "--allow-rw", &data], &script);
    assert_eq!(run.code(), Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
    let lines = run.lines();
    let expected = [
        serde_json::json!(["file", 10001, "x!"]),
        serde_json::json!(["refused", "E_PERM", "/etc/passwd"]),
        serde_json::json!(["quota", "USD"]),
        serde_json::json!(["slow", "echo: delay=300 slow"]),
        serde_json::json!(["quick", 5]),
        serde_json::json!(["ask", "echo: hello"]),
        serde_json::json!(["cancel", "not_found"]),
    ];
    assert_eq!(lines, expected, "stderr:\n{}", run.stderr());
    run.assert_no_leaks();
    assert_eq!(run.report["broker"]["succeeded"], 2, "report: {}", run.report);
}

#[test]
fn without_a_broker_the_python_client_raises_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
c = Client.from_env()
for call in (lambda: c.quota(), lambda: c.ask("hi"), lambda: c.cancel("t")):
    try:
        call()
        out("answered")
    except AirlockError as e:
        out(e.code)
c.close()
"#;
    let run = run_client(dir.path(), &[], script);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.lines(), vec![serde_json::json!("E_UNSUPPORTED"); 3], "{}", run.stderr());
    run.assert_no_leaks();
}

#[test]
fn outside_airlock_the_python_client_says_so() {
    let script = format!(
        "import sys; sys.path.insert(0, {:?})\nfrom airlock_client import Client, ProtocolError\ntry:\n    Client.from_env()\nexcept ProtocolError as e:\n    print('no airlock:', e)\n",
        client_dir().display().to_string()
    );
    let out =
        Command::new("python3").args(["-c", &script]).env("AIRLOCK_FD", "97").output().expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("no airlock: no airlock on descriptor 97"), "{stdout}");
}

/// Two sessions appending to one telemetry file: every line carries a
/// timestamp, its session's id, the call id and USD amounts with the exact
/// pico-USD beside them; a call cancelled while running is "dropped, usage
/// unknown", in the telemetry and in the report, not a late result.
#[test]
fn telemetry_lines_name_their_session_and_call_and_a_dropped_call_is_usage_unknown() {
    let provider = Provider::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[broker]\nbase_url = \"http://127.0.0.1:{}/v1\"\ndefault_model = \"gpt-4o-mini\"\ntelemetry = \"t.jsonl\"\n",
            provider.port
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let script = r#"
import time
with Client.from_env() as c:
    out(c.ask("one")["messages"][-1]["content"])
    slow = c.send("LLMCMD", {"messages": [{"role": "user", "content": "delay=2000 slow"}], "cancel_token": "s"})
    time.sleep(0.3)
    out(c.cancel("s")["state"])
    try:
        c.wait(slow)
    except AirlockError as e:
        out(e.code)
"#;
    let mut reports = Vec::new();
    for _ in 0..2 {
        let run = run_client(dir.path(), &["--config", &config], script);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        assert_eq!(
            run.lines(),
            [
                serde_json::json!("echo: one"),
                serde_json::json!("after_start"),
                serde_json::json!("cancelled_after_start")
            ]
        );
        reports.push(run.report);
    }
    for report in &reports {
        let b = &report["broker"];
        assert_eq!(
            (b["late_results"].as_u64(), b["dropped_usage_unknown"].as_u64()),
            (Some(0), Some(1)),
            "{b}"
        );
    }
    let text = std::fs::read_to_string(dir.path().join("t.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // Per session: the answered call, the cancelled one, its dropped request.
    assert_eq!(lines.len(), 6, "{text}");
    let sessions: Vec<&str> = lines.iter().map(|l| l["session_id"].as_str().unwrap()).collect();
    assert!(
        sessions[..3].iter().all(|s| *s == sessions[0]) && sessions[3..].iter().all(|s| *s == sessions[3]),
        "{text}"
    );
    assert_ne!(sessions[0], sessions[3], "two sessions, one id: {text}");
    for l in &lines {
        let ts = l["ts"].as_str().unwrap_or_else(|| panic!("no ts: {l}"));
        assert!(ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "ts {ts}");
        assert!(l["call_id"].is_u64(), "{l}");
        for name in ["charged", "remaining"] {
            let pico = l[format!("{name}_pico")].as_u64().unwrap_or_else(|| panic!("no {name}_pico: {l}"));
            let usd = l[format!("{name}_usd")].as_f64().unwrap_or_else(|| panic!("no {name}_usd: {l}"));
            assert!((usd * 1e12 - pico as f64).abs() < 1.0, "{l}");
        }
    }
    assert!(lines[0]["charged_pico"].as_u64().unwrap() > 0, "{}", lines[0]);
    let dropped: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["dropped_usage_unknown"] == true).collect();
    assert_eq!(dropped.len(), 2, "{text}");
    assert!(dropped.iter().all(|l| l["usage"].is_null() && l["charged_pico"] == 0), "{text}");
    assert!(lines.iter().all(|l| l.get("late_usage").is_none()), "{text}");
}

/// `pip install clients/python` into a fresh venv, with no index at all
/// (the package builds from the standard library alone), then the
/// installed `airlock_client` under the default sandbox: files, pager,
/// LLM, quota and cancel; and a default `subprocess` child, whose
/// descriptor 3 is closed, told what happened and how to keep it.
#[test]
fn installed_in_a_fresh_venv_offline_the_client_works_under_the_sandbox() {
    let provider = Provider::start();
    let place = tempfile::tempdir().unwrap();
    let venv = place.path().join("venv");
    let made =
        Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv runs");
    assert!(made.success());
    let py = venv.join("bin/python");
    let pip = Command::new(&py)
        .args(["-m", "pip", "install", "--no-index", "--no-cache-dir"])
        .arg(client_dir())
        .env("PIP_FIND_LINKS", "")
        .output()
        .expect("pip runs");
    assert!(pip.status.success(), "{}", String::from_utf8_lossy(&pip.stderr));
    let base =
        Command::new(&py).args(["-c", "import sys; print(sys.base_prefix)"]).output().expect("venv python");
    let base = String::from_utf8_lossy(&base.stdout).trim().to_owned();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[file_descriptor]\n[broker]\nbase_url = \"http://127.0.0.1:{}/v1\"\ndefault_model = \"gpt-4o-mini\"\n",
            provider.port
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("data.txt"), "from the project\n").unwrap();
    let script = format!(
        r#"
import json, subprocess, sys
import airlock_client
from airlock_client import Client, AirlockError, ProtocolError
def out(v): print(json.dumps(v), flush=True)
out(airlock_client.__file__.startswith({venv:?}))
with Client.from_env() as c:
    out(c.read_file("data.txt").decode())
    try:
        c.write_file("data.txt", b"no")
    except AirlockError as e:
        out(e.code)
    w = c.fd_wrap(b"keep me\n" * 3000)
    out(w["fd"])
    out("keep me" in c.fd_read(w["fd"], start_line=2, end_line=2)["xml"])
    out("keep me" in json.dumps(c.fd_search(w["fd"], "KEEP", ignore_case=True)))
    out(c.quota()["currency"])
    out(c.ask("hi")["messages"][-1]["content"])
    out(c.cancel("nothing")["state"])
child = "from airlock_client import Client, ProtocolError\ntry:\n    print(Client.from_env().read_file('data.txt').decode(), end='')\nexcept ProtocolError as e:\n    print(e)"
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
out(r.stdout)
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, pass_fds=[3])
out(r.stdout)
"#,
        venv = venv.display().to_string()
    );
    let venv_s = venv.display().to_string();
    let config = config.display().to_string();
    let args = ["--sandbox-ro", &venv_s, "--sandbox-ro", &base, "--config", &config, "--allow", "data.txt"];
    let run = run_in(dir.path(), &args, &[py.display().to_string(), "-c".into(), script]);
    assert_eq!(run.code(), Some(0), "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
    let lines = run.lines();
    assert_eq!(
        lines[..9],
        [
            serde_json::json!(true),
            serde_json::json!("from the project\n"),
            serde_json::json!("E_PERM"),
            serde_json::json!("fd:1"),
            serde_json::json!(true),
            serde_json::json!(true),
            serde_json::json!("USD"),
            serde_json::json!("echo: hi"),
            serde_json::json!("not_found"),
        ],
        "stderr:\n{}",
        run.stderr()
    );
    // Descriptor 3 closed by subprocess: the session's socket serves it.
    assert_eq!(lines[9], serde_json::json!("from the project\n"));
    assert_eq!(lines[10], serde_json::json!("from the project\n"));
    assert_eq!(lines.len(), 11);
    run.assert_no_leaks();
}

/// The installed client in a child whose descriptor 3 a default
/// `subprocess` closed reaches the session through its socket (outside the
/// sandbox: before Landlock ABI 9 the default sandbox refuses unix
/// sockets).
#[test]
fn the_python_client_falls_back_to_the_session_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "via the socket\n").unwrap();
    let client = client_dir().display().to_string();
    let script = format!(
        r#"
import json, subprocess, sys
child = '''import sys; sys.path.insert(0, {client:?})
from airlock_client import Client
with Client.from_env() as c:
    print(c.read_file("data.txt").decode(), end="")'''
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
print(json.dumps([r.returncode, r.stdout, r.stderr]))
"#
    );
    let run = run_in(
        dir.path(),
        &["--no-sandbox", "--allow", "data.txt"],
        &["python3".into(), "-c".into(), script],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.lines(), [serde_json::json!([0, "via the socket\n", ""])], "{}", run.stderr());
    assert_eq!(run.report_u64("socket_clients"), 1);
    run.assert_no_leaks();
}
