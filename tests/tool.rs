//! `airlock tool` against real tool processes (issue 10, seed 004): every
//! outcome and exit status, every method and error code, the policy, cancel
//! and signals, stateful tools, limits, scrubbing, HTTP and process.run.
//! The tools are Python and sh scripts written from the seed's text; the
//! hostile ones (floods, huge lines, hangs, ignored signals, grandchildren
//! holding stdout, cancel races) are kept here as tests.

mod common;

use common::airlock;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A project directory (the tool's root) and a scratch directory outside it
/// for the tool scripts and side-channel notes.
struct Fixture {
    project: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture { project: tempfile::tempdir().unwrap(), scratch: tempfile::tempdir().unwrap() }
    }

    fn root(&self) -> &Path {
        self.project.path()
    }

    fn file(&self, rel: &str, content: impl AsRef<[u8]>) {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn read(&self, rel: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root().join(rel)).ok()
    }

    fn note(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// A Python tool: the test client is importable and `init()` has been
    /// read when `body` starts (its message is in `INIT`).
    fn py(&self, body: &str) -> Vec<String> {
        self.py_raw(&format!("INIT = init()\n{body}"))
    }

    /// The tool's library read-only and the notes directory read-write,
    /// directly: the tool is confined to the system locations otherwise.
    fn grants(&self) -> Vec<String> {
        vec![
            "--sandbox-ro".into(),
            common::support("").display().to_string(),
            "--sandbox-rw".into(),
            self.scratch.path().display().to_string(),
        ]
    }

    /// The process name `mark(path)` gives the tool and the processes it
    /// forks, unique to this fixture: found on the host by name, whatever
    /// PID namespace the tool is in.
    fn marker(&self) -> String {
        let dir = self.scratch.path().file_name().unwrap().to_string_lossy();
        let tail: String = dir.chars().filter(char::is_ascii_alphanumeric).collect();
        format!("vt{}", &tail[tail.len().saturating_sub(10)..])
    }

    /// A Python tool that reads nothing before `body`.
    fn py_raw(&self, body: &str) -> Vec<String> {
        let path = self.scratch.path().join(format!("tool{}.py", unique()));
        let prelude = format!(
            "import sys, os, json, time, signal, base64\nsys.dont_write_bytecode = True\nsys.path.insert(0, {:?})\nfrom vfstool import *\nNOTES = {:?}\n\
             def mark(path):\n    import ctypes\n    ctypes.CDLL(None).prctl(15, {:?}.encode(), 0, 0, 0)\n    note(path, {:?})\n",
            common::support("").display().to_string(),
            self.scratch.path().display().to_string(),
            self.marker(),
            self.marker(),
        );
        std::fs::write(&path, format!("{prelude}{body}\n")).unwrap();
        vec!["python3".into(), path.display().to_string()]
    }

    fn run(&self, args: &[&str], cmd: &[String]) -> Out {
        self.run_env(args, cmd, &[])
    }

    fn run_env(&self, args: &[&str], cmd: &[String], env: &[(&str, &str)]) -> Out {
        let start = Instant::now();
        let mut c = Command::new(airlock());
        c.current_dir(self.root()).arg("tool").args(self.grants()).args(args).arg("--").args(cmd);
        for (k, v) in env {
            c.env(k, v);
        }
        let output = c.stdin(Stdio::null()).output().expect("airlock runs");
        Out::new(output, start.elapsed())
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

struct Out {
    output: Output,
    elapsed: Duration,
}

impl Out {
    fn new(output: Output, elapsed: Duration) -> Out {
        Out { output, elapsed }
    }

    fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The one JSON line airlock prints.
    fn json(&self) -> Value {
        let out = self.stdout();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "exactly one line expected on stdout: {out:?}\nstderr: {}", self.stderr());
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    }

    /// The text of the first content block.
    fn text(&self) -> String {
        let j = self.json();
        j["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text block: {j}")).to_owned()
    }

    /// Asserts outcome and exit status together, with everything on failure.
    fn expect(&self, outcome: &str, code: i32) -> Value {
        let j = self.json();
        assert_eq!(
            (j["outcome"].as_str(), self.code()),
            (Some(outcome), Some(code)),
            "stdout: {}\nstderr: {}",
            self.stdout(),
            self.stderr()
        );
        j
    }

    /// The tool's own assertions failed if it ended without a result.
    fn completed(&self) -> Value {
        self.expect("completed", 0)
    }
}

/// Live (not zombie) host processes named `marker` (the tool's `mark()`
/// names it and every process it forks so).
fn marked(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let name = head.split_once('(').map(|(_, n)| n).unwrap_or_default();
        if name == marker && !rest.trim_start().starts_with('Z') {
            found.push(pid);
        }
    }
    found
}

/// Waits (briefly) for every marked process to be gone; the kernel may
/// take a moment to tear down processes killed just before airlock exited.
fn assert_group_gone(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = marked(marker);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "processes marked {marker} outlive airlock: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The marker the tool wrote once it named itself (`mark()`).
fn read_pgid(f: &Fixture, name: &str) -> String {
    wait_for_file(&f.note(name), Duration::from_secs(10)).trim().to_owned()
}

// ---------------------------------------------------------------- outcomes

#[test]
fn a_string_result_becomes_one_text_block_and_exit_0() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("result('Modified 2 files.')"));
    let j = out.completed();
    assert_eq!(j["content"], json!([{"type": "text", "text": "Modified 2 files."}]));
    assert_eq!(j["tool_exit"], json!({"code": 0}));
    assert!(j.get("error").is_none(), "{j}");
}

#[test]
fn block_results_are_passed_through() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("result([{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}])"));
    let j = out.completed();
    assert_eq!(j["content"], json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]));
}

#[test]
fn an_error_notification_exits_1_with_the_error_copied() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("error('Failed to parse input', trace=['x'], transient=False)"));
    let j = out.expect("error", 1);
    assert_eq!(j["error"]["message"], "Failed to parse input");
    assert_eq!(j["error"]["transient"], false);
    assert!(out.text().contains("Failed to parse input"), "{j}");
}

#[test]
fn exit_without_a_final_message_is_no_result_with_status_and_stderr() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("sys.stderr.write('boom: disk on fire\\n'); sys.exit(7)"));
    let j = out.expect("no_result", 3);
    assert_eq!(j["tool_exit"], json!({"code": 7}));
    let text = out.text();
    assert!(text.contains('7') && text.contains("boom: disk on fire"), "{text}");
}

#[test]
fn no_result_keeps_only_the_last_64_kib_of_stderr() {
    let f = Fixture::new();
    let out = f
        .run(&[], &f.py("sys.stderr.write('HEAD' + 'x' * 200000 + 'TAIL'); sys.stderr.flush(); sys.exit(1)"));
    out.expect("no_result", 3);
    let text = out.text();
    assert!(text.contains("TAIL") && !text.contains("HEAD"), "stderr tail not kept");
    assert!(text.len() < 70 * 1024, "{} bytes of message", text.len());
}

#[test]
fn a_tool_killed_by_a_signal_reports_it() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("os.kill(os.getpid(), signal.SIGKILL)"));
    let j = out.expect("no_result", 3);
    assert_eq!(j["tool_exit"], json!({"signal": 9}));
}

#[test]
fn a_line_over_max_line_is_a_protocol_error() {
    let f = Fixture::new();
    let out = f.run(&["--max-line", "1000"], &f.py("send_raw(b'{' + b' ' * 5000 + b'}\\n'); time.sleep(30)"));
    out.expect("protocol_error", 4);
    assert!(out.elapsed < Duration::from_secs(20), "{:?}", out.elapsed);
}

#[test]
fn a_line_without_newline_over_max_line_is_caught_while_reading() {
    let f = Fixture::new();
    // Never ends the line: airlock must not wait for a newline that never comes.
    let out = f.run(&["--max-line", "4096"], &f.py("send_raw(b'x' * 100000); time.sleep(30)"));
    out.expect("protocol_error", 4);
    assert!(out.elapsed < Duration::from_secs(20), "{:?}", out.elapsed);
}

#[test]
fn a_malformed_result_is_a_protocol_error() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("send({'jsonrpc': '2.0', 'method': 'result', 'params': {'content': 42}})"));
    out.expect("protocol_error", 4);
    let out = f.run(&[], &f.py("send({'jsonrpc': '2.0', 'method': 'error', 'params': {'msg': 1}})"));
    out.expect("protocol_error", 4);
}

#[test]
fn a_waiting_state_without_apply_is_waiting() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("state({'type': 'waiting', 'content': 'Confirm?', 'question': {'id': 'q'}})\nrecv(); time.sleep(30)"));
    let j = out.expect("waiting", 5);
    assert_eq!(j["states"][0]["type"], "waiting");
    assert_eq!(j["states"][0]["content"], "Confirm?");
}

#[test]
fn a_stopped_state_completes_with_its_result() {
    let f = Fixture::new();
    let out = f.run(&[], &f.py("state({'type': 'stopped', 'result': 'Staged 3 hunks.'})"));
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "Staged 3 hunks.");
    assert_eq!(j["states"][0]["type"], "stopped");
}

#[test]
fn each_running_state_gets_the_next_apply_in_order() {
    let f = Fixture::new();
    let out = f.run(
        &["--apply", "y", "--apply", "n"],
        &f.py("got = []\n\
             for i in range(2):\n\
             \x20   state({'type': 'running', 'content': f'hunk {i}'})\n\
             \x20   m = recv(); assert m['method'] == 'apply', m; got.append(m['params']['input'])\n\
             state({'type': 'stopped', 'result': ','.join(got)})"),
    );
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "y,n");
    let types: Vec<&str> =
        j["states"].as_array().unwrap().iter().map(|s| s["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["running", "running", "stopped"]);
}

#[test]
fn a_silent_tool_times_out_with_124_and_its_group_is_gone() {
    let f = Fixture::new();
    let out = f.run(
        &["--timeout", "3", "--kill-grace", "0.3"],
        &f.py("mark(NOTES + '/pgid')\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)"),
    );
    out.expect("timeout", 124);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    assert_group_gone(&read_pgid(&f, "pgid"));
}

#[test]
fn a_request_pending_is_not_silence() {
    let f = Fixture::new();
    // process.run of 5 s with --timeout 3: the tool waits on airlock, not idle.
    let out = f.run(
        &["--timeout", "3", "--allow-cmd", "sleep"],
        &f.py("r = ok('process.run', {'program': 'sleep', 'args': ['5']})\nresult(str(r['exit_code']))"),
    );
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "0");
}

// ---------------------------------------------------------------- start-up

#[test]
fn usage_errors_exit_2() {
    let f = Fixture::new();
    let out = f.run(&["--no-such-flag"], &["true".to_string()]);
    assert_eq!(out.code(), Some(2), "{}", out.stderr());
    assert!(out.stdout().is_empty());
    let o = Command::new(airlock()).current_dir(f.root()).args(["tool"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty());
}

#[test]
fn start_up_errors_exit_125_with_stdout_empty() {
    let f = Fixture::new();
    for (args, cmd) in [
        (vec!["--args", "[1,2]"], "true"),
        (vec!["--args", "{not json"], "true"),
        (vec!["--allow", "/etc"], "true"),
        (vec!["--allow", "../elsewhere"], "true"),
        (vec![], "/no/such/program"),
    ] {
        let out = f.run(&args, &[cmd.to_string()]);
        assert_eq!(out.code(), Some(125), "{args:?} {cmd}: {}", out.stderr());
        assert!(out.stdout().is_empty(), "{args:?}: {}", out.stdout());
        assert!(!out.stderr().is_empty(), "{args:?}: no message");
    }
}

#[test]
fn init_carries_name_arguments_and_protocol_version() {
    let f = Fixture::new();
    let tool =
        f.py("p = INIT['params']\nresult(json.dumps([p['tool'], p['protocol_version'], INIT['jsonrpc']]))");
    let out = f.run(&[], &tool);
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    // CMD is python3 here: its file name is the default name.
    assert_eq!(got[0], json!({"name": "python3", "arguments": {}, "answers": {}, "options": {}}));
    assert_eq!(got[1], "0.1.0");
    assert_eq!(got[2], "2.0");
    let out = f.run(&["--name", "fs_modify_file", "--args", r#"{"path":"src/main.rs"}"#], &tool);
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0]["name"], "fs_modify_file");
    assert_eq!(got[0]["arguments"], json!({"path": "src/main.rs"}));
}

#[test]
fn the_tool_sees_only_the_allowed_environment() {
    let f = Fixture::new();
    // The environment the tool was started with, as Python read it at
    // start-up (a shell would add PWD of its own; the confined tool has no
    // /proc to read it from).
    let tool = r#"import json, os, sys
sys.stdin.readline()
names = " ".join(sorted(os.environ))
print(json.dumps({"jsonrpc": "2.0", "method": "result", "params": {"content": names}}), flush=True)"#;
    let out = f.run_env(
        &[],
        &["python3".into(), "-c".into(), tool.into()],
        &[("SECRET_API_KEY", "sk-123456"), ("LC_ALL", "C"), ("TZ", "UTC"), ("AIRLOCK_FD", "3")],
    );
    let text = out.text();
    let names: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    for n in &names {
        let ok = ["PATH", "HOME", "USER", "LANG", "TERM", "TZ", "TMPDIR"].contains(&n.as_str())
            || n.starts_with("LC_");
        assert!(ok, "{n} reached the tool: {names:?}");
    }
    assert!(names.contains(&"TZ".to_string()) && names.contains(&"LC_ALL".to_string()), "{names:?}");
}

/// `--require-namespaces` refuses to start a tool it could not put in
/// namespaces (here forced off), naming why, and starts it where it can.
#[test]
fn require_namespaces_refuses_without_them() {
    let f = Fixture::new();
    let out = f.run_env(&["--require-namespaces"], &f.py("result('in')"), &[("AIRLOCK_NO_NAMESPACES", "1")]);
    assert_eq!(out.code(), Some(125), "{}", out.stderr());
    assert!(out.stdout().is_empty(), "{}", out.stdout());
    assert!(out.stderr().contains("--require-namespaces"), "{}", out.stderr());
    let out = f.run(&["--require-namespaces"], &f.py("result('in')"));
    assert_eq!(out.text(), "in", "{}", out.stderr());
}

/// Host pids and groups: under the fallback, where the tool's pids are the
/// host's. The default is `the_tool_runs_in_its_own_pid_namespace_by_default`.
#[test]
fn the_tool_runs_in_its_own_process_group() {
    let f = Fixture::new();
    let out = f.run_env(
        &[],
        &f.py("result(json.dumps([os.getpgid(0), os.getppid(), os.getpgid(os.getppid())]))"),
        &[("AIRLOCK_NO_NAMESPACES", "1")],
    );
    let got: Vec<i32> = serde_json::from_str(&out.text()).unwrap();
    // The confinement stage (the tool's parent, its reaper) leads a group
    // of its own, not the test's.
    assert_eq!(got[0], got[1], "{got:?}");
    assert_eq!(got[2], got[1], "{got:?}");
    // SAFETY: getpgrp(2) reads our own group.
    assert_ne!(got[0], unsafe { libc::getpgrp() }, "{got:?}");
}

/// By default the tool is in a PID namespace of its own, under airlock's
/// reaper: it sees none of the host's processes.
#[test]
fn the_tool_runs_in_its_own_pid_namespace_by_default() {
    let f = Fixture::new();
    let out = f.run(
        &[],
        &f.py(&format!("result(json.dumps([os.getppid(), os.path.exists('/proc/{}')]))", std::process::id())),
    );
    assert_eq!(out.text(), "[1, false]", "{}", out.stderr());
}

// ---------------------------------------------------------------- methods

#[test]
fn fs_read_text_and_binary() {
    let f = Fixture::new();
    f.file("src/main.rs", "fn main() {}");
    f.file("img.bin", [0x89u8, b'P', b'N', b'G', 0xff, 0x00]);
    let out = f.run(
        &[],
        &f.py("a = ok('fs.read', {'path': 'src/main.rs'})\n\
             b = ok('fs.read', {'path': 'img.bin'})\n\
             result(json.dumps([a, b]))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], json!({"content": "fn main() {}", "size": 12}));
    assert_eq!(got[1], json!({"content": "iVBOR/8A", "size": 6, "encoding": "base64"}));
}

#[test]
fn fs_write_creates_parents_and_needs_allow_rw() {
    let f = Fixture::new();
    let tool = f.py("a = call('fs.write', {'path': 'deep/er/x.txt', 'content': 'hello'})\n\
         b = call('fs.write', {'path': 'bin.dat', 'content': '/wA=', 'encoding': 'base64'})\n\
         result(json.dumps([a.get('result'), a.get('error', {}).get('code'), b.get('result')]))");
    let out = f.run(&[], &tool);
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[1], -32001, "default policy is read-only: {got}");
    assert_eq!(f.read("deep/er/x.txt"), None);
    let out = f.run(&["--allow-rw", "."], &tool);
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], json!({}));
    assert_eq!(f.read("deep/er/x.txt").unwrap(), b"hello");
    assert_eq!(f.read("bin.dat").unwrap(), [0xff, 0x00]);
}

#[test]
fn fs_exists_metadata_list_dir() {
    let f = Fixture::new();
    f.file("b.txt", "12345");
    f.file("a/inner.txt", "x");
    f.file(".env", "SECRET=1");
    std::os::unix::fs::symlink("b.txt", f.root().join("link")).unwrap();
    let out = f.run(
        &[],
        &f.py("r = [ok('fs.exists', {'path': 'b.txt'}), ok('fs.exists', {'path': 'nope'}),\n\
             \x20    ok('fs.metadata', {'path': 'b.txt'}), ok('fs.metadata', {'path': 'a'}),\n\
             \x20    ok('fs.metadata', {'path': 'link'}), code('fs.metadata', {'path': 'nope'}),\n\
             \x20    ok('fs.list_dir', {'path': '.'})]\n\
             result(json.dumps(r))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], json!({"exists": true}));
    assert_eq!(got[1], json!({"exists": false}));
    assert_eq!(got[2], json!({"kind": "file", "size": 5}));
    assert_eq!(got[3]["kind"], "dir");
    assert_eq!(got[4], json!({"kind": "file", "size": 5}), "metadata follows the link");
    assert_eq!(got[5], -32002);
    assert_eq!(
        got[6],
        json!({"entries": [
            {"path": "a", "kind": "dir"},
            {"path": "b.txt", "kind": "file"},
            {"path": "link", "kind": "symlink"},
        ]}),
        ".env is left out, entries sorted"
    );
}

#[test]
fn fs_delete_and_rename() {
    let f = Fixture::new();
    f.file("a.txt", "A");
    f.file("b.txt", "B");
    f.file("d/x", "x");
    let out = f.run(
        &["--allow-rw", "."],
        &f.py("r = [code('fs.rename', {'from': 'a.txt', 'to': 'b.txt'}),\n\
             \x20    code('fs.write', {'path': 'd', 'content': 'x'}),\n\
             \x20    ok('fs.rename', {'from': 'a.txt', 'to': 'new/c.txt'}),\n\
             \x20    ok('fs.delete', {'path': 'b.txt'}),\n\
             \x20    code('fs.delete', {'path': 'b.txt'}),\n\
             \x20    code('fs.delete', {'path': 'd'})]\n\
             result(json.dumps(r))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], -32003, "rename onto an existing path");
    assert_eq!(got[1], -32003, "write onto a directory");
    assert_eq!(got[2], json!({}));
    assert_eq!(got[4], -32002);
    assert!(got[5].is_i64(), "deleting a directory is refused: {got}");
    assert_eq!(f.read("new/c.txt").unwrap(), b"A");
    assert_eq!(f.read("a.txt"), None);
    assert_eq!(f.read("b.txt"), None);
    assert_eq!(f.read("d/x").unwrap(), b"x");
}

#[test]
fn fs_grep_with_context_extensions_and_skips() {
    let f = Fixture::new();
    f.file("src/a.rs", "one\nfoo two\nthree\nfour\nfoo five\n");
    f.file("src/b.txt", "foo in txt\n");
    f.file("src/bin.rs", b"foo\x00binary\n");
    f.file(".env", "foo=secret\n");
    std::os::unix::fs::symlink("a.rs", f.root().join("src/link.rs")).unwrap();
    let out = f.run(
        &[],
        &f.py(
            "a = ok('fs.grep', {'pattern': 'fo+ ', 'paths': ['src'], 'extensions': ['rs'], 'context': 1})\n\
             b = ok('fs.grep', {'pattern': 'foo'})\n\
             c = code('fs.grep', {'pattern': '('})\n\
             result(json.dumps([a, b, c]))",
        ),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let l = |n: u64, c: &str, m: bool| json!({"line_number": n, "content": c, "is_match": m});
    assert_eq!(
        got[0]["matches"],
        json!([{"path": "src/a.rs", "lines": [
            l(1, "one", false), l(2, "foo two", true), l(3, "three", false),
            l(4, "four", false), l(5, "foo five", true),
        ]}]),
        "{got}"
    );
    let paths: Vec<&str> =
        got[1]["matches"].as_array().unwrap().iter().map(|m| m["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["src/a.rs", "src/b.txt"], "links, binary and denied files skipped");
    assert_eq!(got[2], -32602);
}

#[test]
fn fs_grep_stops_at_10000_lines() {
    let f = Fixture::new();
    let many: String = (0..12_000).map(|i| format!("hit {i}\n")).collect();
    f.file("big.txt", many);
    let out = f.run(&[], &f.py("r = ok('fs.grep', {'pattern': 'hit'})\nresult(json.dumps([len(r['matches'][0]['lines']), r.get('truncated')]))"));
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got, json!([10000, true]));
}

// ---------------------------------------------------------------- policy

#[test]
fn policy_refuses_before_any_read_or_write() {
    let f = Fixture::new();
    f.file(".env", "S=1");
    f.file("cfg/.env.local", "S=1");
    f.file("keys/id.pem", "K");
    f.file("ro/a.txt", "a");
    f.file("rw/a.txt", "a");
    let outside = f.scratch.path().join("outside.txt");
    std::fs::write(&outside, "outside").unwrap();
    std::os::unix::fs::symlink(&outside, f.root().join("escape")).unwrap();
    std::os::unix::fs::symlink("../.env", f.root().join("rw/env-link")).unwrap();
    std::os::unix::fs::symlink("keys", f.root().join("rw/keys-link")).unwrap();
    let abs = outside.display().to_string();
    let out = f.run(
        &["--allow", "ro", "--allow", ".", "--allow-rw", "rw", "--deny", "*.pem"],
        &f.py(&format!(
            "cases = [('fs.read', {{'path': {abs:?}}}), ('fs.read', {{'path': 'ro/../rw/a.txt'}}),\n\
             \x20 ('fs.read', {{'path': '.env'}}), ('fs.read', {{'path': 'cfg/.env.local'}}),\n\
             \x20 ('fs.read', {{'path': 'keys/id.pem'}}), ('fs.write', {{'path': 'ro/a.txt', 'content': 'x'}}),\n\
             \x20 ('fs.read', {{'path': 'escape'}}), ('fs.read', {{'path': 'rw/env-link'}}),\n\
             \x20 ('fs.exists', {{'path': '.env'}}), ('fs.write', {{'path': 'rw/env-link', 'content': 'x'}}),\n\
             \x20 ('fs.read', {{'path': 'rw/keys-link/id.pem'}}), ('fs.write', {{'path': 'escape', 'content': 'x'}}),\n\
             \x20 ('fs.list_dir', {{'path': '/'}}), ('fs.grep', {{'pattern': 'S', 'paths': ['..']}})]\n\
             result(json.dumps([code(m, p) for m, p in cases] + [ok('fs.read', {{'path': 'rw/a.txt'}})['content']]))"
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let codes = got.as_array().unwrap();
    for (i, c) in codes[..codes.len() - 1].iter().enumerate() {
        assert_eq!(c, -32001, "case {i} not refused by policy: {got}");
    }
    assert_eq!(codes.last().unwrap(), "a");
    assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    assert_eq!(f.read(".env").unwrap(), b"S=1");
    assert_eq!(f.read("ro/a.txt").unwrap(), b"a");
}

#[test]
fn deny_wins_over_allow_rw_and_list_dir_hides_denied() {
    let f = Fixture::new();
    f.file("out/keep.txt", "k");
    f.file("out/secret.key", "s");
    let out = f.run(
        &["--allow-rw", "out", "--deny", "*.key"],
        &f.py(
            "r = [code('fs.write', {'path': 'out/new.key', 'content': 'x'}), ok('fs.list_dir', {'path': 'out'})]\n\
             result(json.dumps(r))",
        ),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], -32001);
    assert_eq!(got[1], json!({"entries": [{"path": "keep.txt", "kind": "file"}]}));
    assert_eq!(f.read("out/new.key"), None);
}

#[test]
fn no_network_and_no_processes_by_default() {
    let f = Fixture::new();
    let out = f.run(
        &[],
        &f.py("result(json.dumps([code('http.get', {'url': 'http://127.0.0.1:9/'}),\n\
             \x20 code('process.run', {'program': 'true'})]))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got, json!([-32001, -32001]));
}

// ---------------------------------------------------------------- wire

#[test]
fn wire_errors_have_their_codes_and_ids() {
    let f = Fixture::new();
    let out = f.run(
        &[],
        &f.py(
            "def raw(b):\n    send_raw(b); return recv()\n\
             r = []\n\
             r.append(raw(b'{not json\\n'))\n\
             r.append(raw(b'\\xff\\xfe\\n'))\n\
             r.append(raw(b'[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fs.exists\",\"params\":{\"path\":\"a\"}}]\\n'))\n\
             r.append(raw(b'{\"jsonrpc\":\"1.0\",\"id\":5,\"method\":\"fs.exists\",\"params\":{\"path\":\"a\"}}\\n'))\n\
             r.append(raw(b'{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"fs.exists\",\"params\":{\"path\":\"a\"}}\\n'))\n\
             r.append(raw(b'\\n\\n  \\n{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"no.such\"}\\n'))\n\
             r.append(raw(b'{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"fs.read\",\"params\":{\"path\":3}}\\n'))\n\
             r.append(raw(b'{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"fs.read\"}\\n'))\n\
             result(json.dumps(r))",
        ),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let pairs: Vec<(Value, Value)> =
        got.as_array().unwrap().iter().map(|r| (r["id"].clone(), r["error"]["code"].clone())).collect();
    assert_eq!(
        pairs,
        vec![
            (Value::Null, json!(-32600)),
            (Value::Null, json!(-32600)),
            (Value::Null, json!(-32600)),
            (json!(5), json!(-32600)),
            (Value::Null, json!(-32600)),
            (json!("s"), json!(-32601)),
            (json!(7), json!(-32602)),
            (json!(8), json!(-32602)),
        ],
        "{got}"
    );
    for r in got.as_array().unwrap() {
        assert_eq!(r["jsonrpc"], "2.0");
        assert!(r["error"]["message"].as_str().is_some_and(|m| m.len() > 5), "message says why: {r}");
    }
}

#[test]
fn a_pending_id_reused_is_refused() {
    let f = Fixture::new();
    // Two requests with the same id while the first (a 1 s process) runs.
    let out = f.run(
        &["--allow-cmd", "sleep"],
        &f.py("request('process.run', {'program': 'sleep', 'args': ['1']}, id=9)\n\
             request('fs.exists', {'path': 'a'}, id=9)\n\
             a = recv(); b = recv()\n\
             result(json.dumps([a, b]))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let codes: Vec<Value> = got.as_array().unwrap().iter().map(|r| r["error"]["code"].clone()).collect();
    assert!(codes.contains(&json!(-32600)), "{got}");
    assert!(got.as_array().unwrap().iter().any(|r| r["result"]["exit_code"] == 0), "{got}");
}

#[test]
fn requests_are_answered_in_order() {
    let f = Fixture::new();
    f.file("a", "A");
    let out = f.run(
        &[],
        &f.py("ids = [request('fs.read', {'path': 'a'}) for _ in range(50)]\n\
             got = [recv()['id'] for _ in ids]\n\
             result(str(got == ids))"),
    );
    assert_eq!(out.text(), "True");
}

#[test]
fn the_tool_cancels_its_own_pending_process() {
    let f = Fixture::new();
    let out = f.run(
        &["--allow-cmd", "sh"],
        &f.py(&format!(
            "request('process.run', {{'program': 'sh', 'args': ['-c', 'cp /bin/sleep {m}; echo $$ > {n}; exec {m} 30']}}, id=1)\n\
             while not os.path.exists({n:?}): time.sleep(0.01)\n\
             time.sleep(0.1)\n\
             send({{'jsonrpc': '2.0', 'method': 'cancel', 'params': {{'id': 1}}}})\n\
             r = recv()\n\
             result(json.dumps(r))",
            m = f.note(&f.marker()).display(),
            n = f.note("runpid").display(),
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got["id"], 1);
    assert_eq!(got["error"]["code"], -32005);
    assert!(out.elapsed < Duration::from_secs(15));
    assert!(f.note("runpid").exists(), "the process never ran: {}", out.stderr());
    // A sleep named by the marker: found on the host whatever its pid there.
    assert_group_gone(&f.marker());
}

// ---------------------------------------------------------------- cancel and signals

/// airlock with the tool running; `signal` sent once the tool wrote its
/// pgid. The time is from the signal on: what the bounds are about (the
/// tool's start, which a loaded machine slows, is not theirs).
fn signalled(f: &Fixture, args: &[&str], body: &str, signal: i32) -> (Out, String) {
    let child = Command::new(airlock())
        .current_dir(f.root())
        .arg("tool")
        .args(f.grants())
        .args(args)
        .arg("--")
        .args(f.py(&format!("mark(NOTES + '/pgid')\n{body}")))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pgid = read_pgid(f, "pgid");
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let output = child.wait_with_output().unwrap();
    (Out::new(output, start.elapsed()), pgid)
}

#[test]
fn int_term_hup_cancel_with_128_plus_n() {
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let f = Fixture::new();
        let (out, pgid) = signalled(
            &f,
            &["--cancel-grace", "5"],
            "m = recv()\nnote(NOTES + '/got', json.dumps(m))\nsys.exit(0)",
            sig,
        );
        let j = out.expect("cancelled", code);
        assert_eq!(j["tool_exit"], json!({"code": 0}));
        let got: Value = serde_json::from_str(&std::fs::read_to_string(f.note("got")).unwrap()).unwrap();
        assert_eq!(got["method"], "cancel", "{got}");
        assert!(out.elapsed < Duration::from_secs(4), "tool left at cancel: {:?}", out.elapsed);
        assert_group_gone(&pgid);
    }
}

#[test]
fn cancel_escalates_to_sigterm_then_sigkill_for_a_tool_that_ignores_it() {
    let f = Fixture::new();
    let (out, pgid) = signalled(
        &f,
        &["--cancel-grace", "0.5", "--kill-grace", "0.5"],
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         if os.fork() == 0:\n    time.sleep(60); os._exit(0)\n\
         while True: time.sleep(1)",
        libc::SIGINT,
    );
    let j = out.expect("cancelled", 130);
    assert_eq!(j["tool_exit"], json!({"signal": 9}));
    assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
    assert_group_gone(&pgid);
}

#[test]
fn cancel_answers_the_pending_request_with_32005() {
    let f = Fixture::new();
    let (out, pgid) = signalled(
        &f,
        &["--allow-cmd", "sleep", "--cancel-grace", "5"],
        "request('process.run', {'program': 'sleep', 'args': ['30']}, id=3)\n\
         r = [recv(), recv()]\n\
         note(NOTES + '/got', json.dumps(r))\nsys.exit(0)",
        libc::SIGTERM,
    );
    out.expect("cancelled", 143);
    let got: Value = serde_json::from_str(&std::fs::read_to_string(f.note("got")).unwrap()).unwrap();
    assert_eq!(got[0]["id"], 3);
    assert_eq!(got[0]["error"]["code"], -32005);
    assert_eq!(got[1]["method"], "cancel");
    assert_group_gone(&pgid);
}

#[test]
fn no_apply_left_cancels_a_running_tool() {
    let f = Fixture::new();
    let out = f.run(
        &["--apply", "y", "--cancel-grace", "5"],
        &f.py("state({'type': 'running', 'content': 'one'})\n\
             m = recv(); assert m['method'] == 'apply'\n\
             state({'type': 'running', 'content': 'two'})\n\
             m = recv(); note(NOTES + '/got', json.dumps(m)); sys.exit(0)"),
    );
    let j = out.expect("waiting", 5);
    assert_eq!(j["states"].as_array().unwrap().len(), 2);
    let got: Value = serde_json::from_str(&std::fs::read_to_string(f.note("got")).unwrap()).unwrap();
    assert_eq!(got["method"], "cancel");
}

// ---------------------------------------------------------------- after the final message

#[test]
fn after_the_result_the_group_is_killed_even_if_it_ignores_sigterm() {
    let f = Fixture::new();
    let out = f.run(
        &["--kill-grace", "0.3"],
        &f.py(
            "mark(NOTES + '/pgid')\n\
             signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
             if os.fork() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60); os._exit(0)\n\
             result('done')\n\
             while True: time.sleep(1)",
        ),
    );
    let j = out.completed();
    assert_eq!(j["tool_exit"], json!({"signal": 9}));
    // Far below the 60 s its grandchild or itself would hold airlock for;
    // the rest is the tool starting on a loaded machine.
    assert!(out.elapsed < Duration::from_secs(15), "{:?}", out.elapsed);
    assert_group_gone(&read_pgid(&f, "pgid"));
}

#[test]
fn a_grandchild_holding_stdout_does_not_keep_airlock_alive() {
    let f = Fixture::new();
    let out = f.run(
        &["--kill-grace", "0.3"],
        &f.py("mark(NOTES + '/pgid')\n\
             if os.fork() == 0:\n    time.sleep(60); os._exit(0)\n\
             result('bye')\nos._exit(0)"),
    );
    out.completed();
    // Far below the 60 s its grandchild or itself would hold airlock for;
    // the rest is the tool starting on a loaded machine.
    assert!(out.elapsed < Duration::from_secs(15), "{:?}", out.elapsed);
    assert_group_gone(&read_pgid(&f, "pgid"));
}

/// A tool that closes both of its pipes and lives on can say nothing
/// more: the run ends by the grace (SIGTERM), not by `--timeout`'s silence.
#[test]
fn a_tool_that_closes_its_pipes_and_lives_on_is_stopped_by_the_grace() {
    let f = Fixture::new();
    let out = f.run(
        &["--timeout", "30", "--kill-grace", "0.3"],
        &f.py("mark(NOTES + '/pgid')\nos.close(0)\nos.close(1)\ntime.sleep(60)"),
    );
    let j = out.expect("no_result", 3);
    assert_eq!(j["tool_exit"], json!({"signal": 15}), "{j}");
    // Far below --timeout 30 and the 60 s sleep; the rest is the tool
    // starting on a loaded machine.
    assert!(out.elapsed < Duration::from_secs(15), "{:?}", out.elapsed);
    assert_group_gone(&read_pgid(&f, "pgid"));
}

#[test]
fn a_grandchild_that_left_the_group_is_still_not_waited_for() {
    // A tool that starts a new session for a grandchild escapes the group
    // kill; airlock must still finish instead of waiting for the pipe it
    // holds, and the grandchild must not outlive it: the PID namespace
    // ends it, and in the fallback the confinement stage's subreaper kills
    // what the tool left.
    for env in [&[][..], &[("AIRLOCK_NO_NAMESPACES", "1")][..]] {
        let f = Fixture::new();
        let out = f.run_env(
            &["--kill-grace", "0.3"],
            &f.py("if os.fork() == 0:\n    os.setsid(); mark(NOTES + '/esc'); time.sleep(30); os._exit(0)\n\
                 while not os.path.exists(NOTES + '/esc'): time.sleep(0.01)\n\
                 result('bye')\nos._exit(0)"),
            env,
        );
        out.completed();
        // Far below the 30 s the grandchild holds the pipe for; the rest is
        // the tool starting on a loaded machine.
        assert!(out.elapsed < Duration::from_secs(12), "{env:?}: {:?}", out.elapsed);
        // It ran and named itself, then is gone soon after airlock.
        assert_group_gone(&read_pgid(&f, "esc"));
    }
}

// ---------------------------------------------------------------- attacks

#[test]
fn attack_request_flood_without_reading_responses() {
    // 5 000 requests written before reading a single answer: airlock stops
    // reading at 64 unanswered, and the answers (4 KiB each) fill the
    // tool's stdin pipe after about a dozen, so the flood is far past both
    // thresholds; airlock must neither deadlock nor buffer it all.
    let f = Fixture::new();
    f.file("a", "A".repeat(4096));
    let out = f.run(
        &["--timeout", "20"],
        &f.py("import threading\n\
             got = []\n\
             def reader():\n\
             \x20   for _ in range(5000): got.append(recv())\n\
             t = threading.Thread(target=reader)\n\
             t.start()\n\
             for i in range(5000): request('fs.read', {'path': 'a'})\n\
             t.join()\n\
             result(str(sum(1 for r in got if r and 'result' in r)))"),
    );
    assert_eq!(out.text(), "5000");
    assert!(out.elapsed < Duration::from_secs(60), "{:?}", out.elapsed);
}

#[test]
fn attack_writer_that_never_reads_its_stdin() {
    // The tool floods requests and never reads one answer: airlock stops
    // reading at 64 unanswered; its answers fill the pipe; silence then
    // ends it as a timeout, not a hang or unbounded memory.
    let f = Fixture::new();
    f.file("a", "A".repeat(65536));
    let out = f.run(
        &["--timeout", "1", "--kill-grace", "0.2"],
        &f.py("while True: request('fs.read', {'path': 'a'})"),
    );
    out.expect("timeout", 124);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
}

#[test]
fn attack_huge_result_line_is_bounded() {
    let f = Fixture::new();
    let out = f.run(&["--max-line", "65536"], &f.py("result('x' * 10_000_000)"));
    out.expect("protocol_error", 4);
}

#[test]
fn attack_garbage_then_result_still_works() {
    let f = Fixture::new();
    let out = f.run(
        &[],
        &f.py(
            "for b in [b'\\x00\\x01\\x02\\n', b'{}\\n', b'null\\n', b'{\"jsonrpc\":\"2.0\",\"id\":1}\\n', b'{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"fs.read\"}\\n']:\n\
             \x20   send_raw(b); r = recv(); assert 'error' in r, r\n\
             result('survived')",
        ),
    );
    assert_eq!(out.text(), "survived");
}

#[test]
fn attack_cancel_race_with_completion() {
    // The tool cancels ids that are done, unknown, and in flight, many times:
    // exactly one response per id, never two.
    let f = Fixture::new();
    f.file("a", "A");
    let out = f.run(
        &[],
        &f.py("seen = {}\n\
             for i in range(1, 200):\n\
             \x20   request('fs.read', {'path': 'a'}, id=i)\n\
             \x20   send({'jsonrpc': '2.0', 'method': 'cancel', 'params': {'id': i}})\n\
             \x20   send({'jsonrpc': '2.0', 'method': 'cancel', 'params': {'id': 100000 + i}})\n\
             for i in range(1, 200):\n\
             \x20   r = recv(); seen[r['id']] = seen.get(r['id'], 0) + 1\n\
             request('fs.exists', {'path': 'a'}, id='last'); r = recv()\n\
             assert r['id'] == 'last', r\n\
             result(json.dumps([len(seen), max(seen.values())]))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got, json!([199, 1]));
}

#[test]
fn attack_result_then_flood_of_output() {
    let f = Fixture::new();
    let out = f
        .run(&["--kill-grace", "0.3"], &f.py("result('first')\nwhile True: send_raw(b'x' * 65536 + b'\\n')"));
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "first");
    assert!(out.elapsed < Duration::from_secs(5));
}

#[test]
fn attack_stderr_flood_is_bounded() {
    let f = Fixture::new();
    let out = f.run(
        &[],
        &f.py("for _ in range(2000): sys.stderr.write('e' * 65536)\nsys.stderr.flush()\nresult('ok')"),
    );
    assert_eq!(out.text(), "ok");
}

#[test]
fn attack_symlink_swapped_to_escape_between_calls() {
    let f = Fixture::new();
    f.file("inside.txt", "in");
    let outside = f.scratch.path().join("secret.txt");
    std::fs::write(&outside, "SECRET").unwrap();
    let link = f.root().join("l");
    let out = f.run(
        // The tool swaps the link itself, directly: the project granted.
        &["--allow-rw", ".", "--sandbox-rw", &f.root().display().to_string()],
        &f.py(&format!(
            "bad = 0\n\
             for i in range(100):\n\
             \x20   try: os.remove({l:?})\n\
             \x20   except FileNotFoundError: pass\n\
             \x20   os.symlink('inside.txt' if i % 2 else {o:?}, {l:?})\n\
             \x20   r = call('fs.read', {{'path': 'l'}})\n\
             \x20   if 'SECRET' in json.dumps(r): bad += 1\n\
             \x20   w = call('fs.write', {{'path': 'l', 'content': 'pwn'}})\n\
             result(str(bad))",
            l = link.display().to_string(),
            o = outside.display().to_string()
        )),
    );
    assert_eq!(out.text(), "0");
    assert_eq!(std::fs::read(&outside).unwrap(), b"SECRET");
}

// ---------------------------------------------------------------- scrubbing

#[test]
fn allowed_env_values_are_scrubbed_from_everything_the_tool_gets() {
    let f = Fixture::new();
    f.file("t.txt", "token=supersecret123 end");
    f.file("b.bin", b"\xff\xfesupersecret123");
    let out = f.run_env(
        &["--env-allow", "MY_TOKEN", "--allow-cmd", "sh"],
        &f.py(
            "a = ok('fs.read', {'path': 't.txt'})['content']\n\
             b = base64.b64decode(ok('fs.read', {'path': 'b.bin'})['content'])\n\
             c = ok('process.run', {'program': 'sh', 'args': ['-c', 'echo $MY_TOKEN; echo $MY_TOKEN >&2'], 'envs': ['MY_TOKEN']})\n\
             g = ok('fs.grep', {'pattern': 'token'})\n\
             result(json.dumps([a, b.decode('latin-1'), c['stdout'], c['stderr'], json.dumps(g), os.environ.get('MY_TOKEN')]))",
        ),
        &[("MY_TOKEN", "supersecret123")],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert!(!out.stdout().contains("supersecret123"), "{}", out.stdout());
    assert_eq!(got[0], "token=[REDACTED] end");
    assert!(got[1].as_str().unwrap().ends_with("[REDACTED]"), "{got}");
    assert_eq!(got[2], "[REDACTED]\n");
    assert_eq!(got[3], "[REDACTED]\n");
    assert!(got[4].as_str().unwrap().contains("[REDACTED]"));
    assert_eq!(got[5], Value::Null, "the variable itself is not in the tool's env");
}

/// An `--env-allow` value in any derived form a file may hold (percent-
/// and JSON-escaped, hex, base64 at each alignment, UTF-16 either way) is
/// scrubbed from `fs.read` and from what `fs.grep` searches and answers.
#[test]
fn every_encoded_form_of_an_allowed_value_is_scrubbed() {
    use base64::Engine as _;
    let secret = "sk-Test/+=42secret";
    let b64 = |prefix: &str| {
        base64::engine::general_purpose::STANDARD.encode([prefix.as_bytes(), secret.as_bytes()].concat())
    };
    let forms: Vec<String> = vec![
        secret.bytes().map(|b| format!("%{b:02X}")).collect(),
        secret.bytes().map(|b| format!("%{b:02x}")).collect(),
        secret.chars().map(|c| format!("\\u{:04x}", c as u32)).collect(),
        secret.replace('/', "\\/"),
        secret.bytes().map(|b| format!("{b:02x}")).collect(),
        secret.bytes().map(|b| format!("{b:02X}")).collect(),
        b64(""),
        b64("a"),
        b64("ab"),
    ];
    let f = Fixture::new();
    f.file("forms.txt", forms.iter().map(|l| format!("form {l} end\n")).collect::<String>());
    let le: Vec<u8> = secret.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let be: Vec<u8> = secret.encode_utf16().flat_map(u16::to_be_bytes).collect();
    f.file("wide.bin", [le.as_slice(), b"|", be.as_slice()].concat());
    let out = f.run_env(
        &["--env-allow", "SK"],
        &f.py("a = ok('fs.read', {'path': 'forms.txt'})['content']\n\
             w = base64.b64decode(ok('fs.read', {'path': 'wide.bin'})['content'])\n\
             g = ok('fs.grep', {'pattern': 'form', 'paths': ['forms.txt']})\n\
             result(json.dumps([a, w.hex(), g]))"),
        &[("SK", secret)],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let read = got[0].as_str().unwrap();
    assert_eq!(read.lines().count(), forms.len(), "{read}");
    for (line, form) in read.lines().zip(&forms) {
        assert!(line.contains("[REDACTED]") && !line.contains(form.as_str()), "{form} read as {line}");
    }
    let wide = got[1].as_str().unwrap();
    for raw in [&le, &be] {
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!wide.contains(&hex), "UTF-16 survives: {wide}");
    }
    let grep = got[2].to_string();
    assert_eq!(got[2]["matches"][0]["lines"].as_array().map(Vec::len), Some(forms.len()), "{grep}");
    for form in &forms {
        assert!(!grep.contains(form.as_str()), "{form} in {grep}");
    }
    assert!(!out.stdout().contains(secret));
}

#[test]
fn the_record_holds_no_secret() {
    let f = Fixture::new();
    f.file("t.txt", "token=supersecret123");
    let rec = f.scratch.path().join("trace.jsonl");
    let out = f.run_env(
        &["--env-allow", "MY_TOKEN", "--record", rec.to_str().unwrap()],
        &f.py("a = ok('fs.read', {'path': 't.txt'})\nresult(a['content'])"),
        &[("MY_TOKEN", "supersecret123")],
    );
    out.completed();
    let trace = std::fs::read_to_string(&rec).unwrap();
    assert!(trace.lines().count() > 3, "{trace}");
    // Bytes are base64 in a trace: look inside every string, decoded too.
    let mut texts = Vec::new();
    fn strings(v: &Value, out: &mut Vec<Vec<u8>>) {
        use base64::Engine as _;
        match v {
            Value::String(s) => {
                out.push(s.as_bytes().to_vec());
                if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(s) {
                    out.push(b);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    for line in trace.lines() {
        strings(&serde_json::from_str(line).unwrap(), &mut texts);
    }
    let has = |needle: &[u8]| texts.iter().any(|t| t.windows(needle.len()).any(|w| w == needle));
    assert!(!has(b"supersecret123"), "secret in the trace");
    assert!(has(b"fs.read") && has(b"token=[REDACTED]"), "{trace}");
    // What the host was given is scrubbed the same way as what it gave, so
    // the recording still replays.
    let (code, stdout) = replay(&rec);
    assert_eq!(code, Some(0), "{stdout}");
}

/// `airlock replay FILE`: its exit status and stdout.
fn replay(trace: &Path) -> (Option<i32>, String) {
    let out = Command::new(airlock()).arg("replay").arg(trace).output().expect("airlock runs");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_recording_replays_exactly_and_a_changed_output_is_named() {
    let f = Fixture::new();
    f.file("src/a.rs", "fn a() {}\n// TODO one\n");
    f.file("notes.txt", "n\n");
    let rec = f.scratch.path().join("run.jsonl");
    let out = f.run(
        &["--allow-rw", ".", "--allow-cmd", "sh", "--record", rec.to_str().unwrap()],
        &f.py("ok('fs.read', {'path': 'notes.txt'})\n\
             ok('fs.write', {'path': 'out/b.txt', 'content': 'b'})\n\
             ok('fs.list_dir', {'path': '.'})\n\
             ok('fs.grep', {'pattern': 'TODO'})\n\
             code('fs.read', {'path': '../etc/passwd'})\n\
             ok('process.run', {'program': 'sh', 'args': ['-c', 'echo hi']})\n\
             result('done')"),
    );
    out.completed();
    let (code, stdout) = replay(&rec);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("ok ("), "{stdout}");

    // Another answer in place of the recorded one: replay names the line
    // and shows both as JSON.
    let text = std::fs::read_to_string(&rec).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let idx = lines.iter().rposition(|l| l.starts_with(r#"{"output":{"tool_stdin""#)).unwrap();
    let forged = format!(r#"{{"jsonrpc":"2.0","id":99,"result":{{}}}}{}"#, "\n");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(forged);
    lines[idx] = format!(r#"{{"output":{{"tool_stdin":"{b64}"}}}}"#);
    std::fs::write(&rec, lines.join("\n")).unwrap();
    let (code, stdout) = replay(&rec);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains(&format!("line {}:", idx + 1)), "{stdout}");
    assert!(stdout.contains(r#""id\":99"#), "the difference shows the JSON: {stdout}");
}

// ---------------------------------------------------------------- process.run

#[test]
fn process_run_with_allow_cmd() {
    let f = Fixture::new();
    f.file("hello.txt", "hi");
    let out = f.run_env(
        &["--allow-cmd", "sh", "--allow-cmd", "/bin/echo", "--env-allow", "GREETING"],
        &f.py(
            "a = ok('process.run', {'program': 'sh', 'args': ['-c', 'cat hello.txt; pwd; echo err >&2; exit 3']})\n\
             b = ok('process.run', {'program': '/bin/echo', 'args': ['x']})\n\
             c = code('process.run', {'program': 'echo', 'args': ['x']})\n\
             d = code('process.run', {'program': 'sh', 'envs': ['HOME']})\n\
             e = ok('process.run', {'program': 'sh', 'args': ['-c', 'echo $GREETING; env | cut -d= -f1 | sort | tr \"\\n\" \" \"'], 'envs': ['GREETING']})\n\
             g = ok('process.run', {'program': 'sh', 'args': ['-c', 'kill -9 $$']})\n\
             result(json.dumps([a, b, c, d, e, g]))",
        ),
        &[("GREETING", "hello-there")],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let root = std::fs::canonicalize(f.root()).unwrap();
    assert_eq!(got[0]["stdout"], format!("hi{}\n", root.display()));
    assert_eq!(got[0]["stderr"], "err\n");
    assert_eq!(got[0]["exit_code"], 3);
    assert_eq!(got[1]["stdout"], "x\n");
    assert_eq!(got[2], -32001, "bare echo is not /bin/echo");
    assert_eq!(got[3], -32001, "envs not --env-allow'ed");
    let env_line = got[4]["stdout"].as_str().unwrap();
    // The value reached the process, and is scrubbed from its output.
    assert!(env_line.starts_with("[REDACTED]\n"), "{env_line}");
    let names: Vec<&str> = env_line.lines().nth(1).unwrap().split_whitespace().collect();
    for n in names {
        assert!(
            ["PATH", "GREETING", "PWD", "SHLVL", "_"].contains(&n),
            "{n} reached the process: {env_line}"
        );
    }
    assert_eq!(got[5]["signal"], 9);
}

/// process.run reaches the project directly, as `--sandbox-rw` would: a
/// protected name absent at the project's top is held (the run cannot
/// make it), and one made beneath a directory the run made is renamed
/// aside once the run is over, where no editor or agent runs it.
#[test]
fn process_run_cannot_leave_executable_configuration_in_the_project() {
    let f = Fixture::new();
    let out = f.run(
        &["--allow-rw", ".", "--allow-cmd", "sh"],
        &f.py(
            "r = ok('process.run', {'program': 'sh', 'args': ['-c', \
             'mkdir .vscode 2>/dev/null && echo TOP; mkdir -p deep/.claude && echo {} > deep/.claude/settings.json && echo DEEP']})\n\
             result(json.dumps(r))",
        ),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got["stdout"], "DEEP\n", "{got} {}", out.stderr());
    let root = f.root();
    assert!(!root.join(".vscode").exists(), "a placeholder stayed, or the run made .vscode");
    assert!(!root.join("deep/.claude").exists(), "deep/.claude stays where an agent runs it");
    assert!(root.join("deep/.claude.airlock-refused/settings.json").is_file(), "{}", out.stderr());
    assert!(out.stderr().contains("renamed to"), "{}", out.stderr());
}

#[test]
fn process_run_is_killed_with_its_group_on_op_timeout() {
    let f = Fixture::new();
    let out = f.run(
        &["--allow-cmd", "sh", "--op-timeout", "1"],
        &f.py(&format!(
            "r = call('process.run', {{'program': 'sh', 'args': ['-c', 'cp /bin/sleep {m}; echo $$ > {n}; {m} 60 & {m} 60']}})\n\
             result(json.dumps(r))",
            m = f.note(&f.marker()).display(),
            n = f.note("runpid").display(),
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got["error"]["code"], -32004, "{got}");
    assert!(out.elapsed < Duration::from_secs(10));
    assert!(f.note("runpid").exists(), "the process never ran: {}", out.stderr());
    // Both sleeps are named by the marker: found on the host whatever
    // their pids there.
    assert_group_gone(&f.marker());
}

#[test]
fn process_run_streams_are_bounded_by_max_file() {
    let f = Fixture::new();
    let out = f.run(
        &["--allow-cmd", "sh", "--max-file", "1000", "--op-timeout", "10"],
        &f.py("r = call('process.run', {'program': 'sh', 'args': ['-c', 'yes']})\nresult(json.dumps(r))"),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got["error"]["code"], -32603, "{got}");
    assert!(out.elapsed < Duration::from_secs(10));
}

// ---------------------------------------------------------------- http

/// A loopback HTTP server for the tests: `/echo` answers with the request
/// it got, `/redirect` with a 302, `/big` with 100 000 bytes, `/slow` after
/// 30 s. Serves until the test ends.
fn http_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_one(stream));
        }
    });
    format!("http://{addr}")
}

fn serve_one(mut s: std::net::TcpStream) {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let Ok(n) = s.read(&mut buf) else { return };
        if n == 0 {
            return;
        }
        req.extend_from_slice(&buf[..n]);
        if let Some(p) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&req[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while req.len() < head_end + len {
        let Ok(n) = s.read(&mut buf) else { return };
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (status, extra, body): (&str, &str, Vec<u8>) = match path.as_str() {
        "/redirect" => ("302 Found", "location: /echo\r\n", b"moved".to_vec()),
        "/big" => ("200 OK", "", vec![b'b'; 100_000]),
        "/binary" => ("200 OK", "x-kind: bin\r\n", vec![0xff, 0x00, 0x01]),
        "/slow" => {
            std::thread::sleep(Duration::from_secs(30));
            ("200 OK", "", b"late".to_vec())
        }
        _ => ("200 OK", "x-test: yes\r\n", req.clone()),
    };
    let _ =
        write!(s, "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n", body.len());
    let _ = s.write_all(&body);
}

#[test]
fn http_get_and_post_against_a_local_server() {
    let f = Fixture::new();
    let base = http_server();
    let prefix = format!("{base}/");
    let out = f.run_env(
        &["--allow-url", &prefix, "--env-allow", "API_TOKEN"],
        &f.py(&format!(
            "b = {base:?}\n\
             a = ok('http.get', {{'url': b + '/echo', 'headers': [{{'name': 'X-Token', 'value': 'Bearer ${{API_TOKEN}}'}}]}})\n\
             p = ok('http.post', {{'url': b + '/echo', 'body': 'payload-123'}})\n\
             r = ok('http.get', {{'url': b + '/redirect'}})\n\
             n = ok('http.get', {{'url': b + '/binary'}})\n\
             e1 = code('http.get', {{'url': b + '/echo', 'headers': [{{'name': 'X', 'value': '${{HOME}}'}}]}})\n\
             e2 = code('http.get', {{'url': b + '/echo', 'headers': [{{'name': 'X', 'value': '${{UNSET_VAR_X}}'}}]}})\n\
             result(json.dumps([a, p, r, n, e1, e2]))"
        )),
        &[("API_TOKEN", "tok-abcdef")],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0]["status"], 200);
    let echoed = got[0]["body"].as_str().unwrap();
    assert!(echoed.starts_with("GET /echo HTTP/1.1"), "{echoed}");
    assert!(
        echoed.to_lowercase().contains("x-token: bearer [redacted]"),
        "header sent, echo scrubbed: {echoed}"
    );
    assert!(got[0]["headers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["name"] == "x-test" && h["value"] == "yes"));
    assert!(got[1]["body"].as_str().unwrap().ends_with("payload-123"));
    assert_eq!(got[2]["status"], 302, "redirects are not followed");
    assert_eq!(got[3]["encoding"], "base64");
    assert_eq!(got[3]["body"], "/wAB");
    assert_eq!(got[4], -32001, "HOME is not --env-allow'ed");
    assert!(!out.stdout().contains("tok-abcdef"));
}

/// What `http.get` of each URL answered: `[status]` or `[code, message]`.
fn http_answers(f: &Fixture, args: &[&str], urls: &[String]) -> Vec<Value> {
    let out = f.run(
        args,
        &f.py(&format!(
            "got = []\n\
             for u in {urls:?}:\n\
             \x20   r = call('http.get', {{'url': u}})\n\
             \x20   got.append([r['result']['status']] if 'result' in r else [r['error']['code'], r['error']['message']])\n\
             result(json.dumps(got))"
        )),
    );
    serde_json::from_str(&out.text()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout()))
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `http.*` goes by `run`'s host patterns: an allowed name reaches its
/// server; another port, another name and a denied one are refused naming
/// the rule and the host; a name resolving to loopback reaches it only
/// when an `--allow-host` names the address; each request is audited.
#[test]
fn http_goes_by_the_host_patterns_and_each_request_is_audited() {
    let f = Fixture::new();
    let base = http_server();
    let port = base.rsplit(':').next().unwrap().to_owned();
    let audit = f.note("audit.jsonl");
    let audit_arg = audit.display().to_string();

    // localhost (looked up for real) is allowed by name, its address is not.
    let lp = format!("localhost:{port}");
    let got = http_answers(&f, &["--allow-host", &lp, "--audit", &audit_arg], &[format!("http://{lp}/echo")]);
    assert_eq!(got[0][0], -32001, "{got:?}");
    let msg = got[0][1].as_str().unwrap();
    assert!(msg.contains(&format!("connecting to localhost:{port} refused: loopback address")), "{msg}");
    assert!(msg.contains("not named by an --allow-host address or range"), "{msg}");
    let lines = audit_lines(&audit);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["op"], "egress");
    assert_eq!(lines[0]["proto"], "tool_http");
    assert_eq!(lines[0]["allowed"], false);
    assert_eq!(lines[0]["host"], "localhost");
    assert!(lines[0]["rule"].as_str().unwrap().starts_with("loopback address"), "{lines:?}");

    // With the address allowed too, the name reaches the server; the rest
    // is refused by rule and host before any connection.
    let fp = format!("forge.test:{port}");
    let args = [
        "--allow-host",
        &fp,
        "--allow-host",
        "127.0.0.1",
        "--allow-host",
        "bad.test",
        "--deny-host",
        "bad.test",
        "--resolve",
        "forge.test=127.0.0.1",
        "--resolve",
        "other.test=127.0.0.1",
        "--resolve",
        "bad.test=127.0.0.1",
        "--audit",
        &audit_arg,
    ];
    let urls = [
        format!("http://{fp}/echo"),
        "http://forge.test:1/echo".to_owned(),
        format!("http://other.test:{port}/echo"),
        format!("http://bad.test:{port}/echo"),
    ];
    let got = http_answers(&f, &args, &urls);
    assert_eq!(got[0], json!([200]), "{got:?}");
    assert_eq!(got[1][0], -32001);
    assert!(
        got[1][1].as_str().unwrap().ends_with("no --allow-host pattern matches (host forge.test:1)"),
        "{got:?}"
    );
    assert_eq!(got[2][0], -32001);
    assert!(
        got[2][1]
            .as_str()
            .unwrap()
            .ends_with(&format!("no --allow-host pattern matches (host other.test:{port})")),
        "{got:?}"
    );
    assert!(got[3][1].as_str().unwrap().contains("--deny-host bad.test"), "{got:?}");
    let lines = audit_lines(&audit);
    assert_eq!(lines.len(), 4, "one line per request: {lines:?}");
    let refused: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["allowed"] == false)
        .map(|l| (l["host"].as_str().unwrap(), l["rule"].as_str().unwrap()))
        .collect();
    let no_allow = |host: &str, port: &str| format!("no --allow-host pattern matches (host {host}:{port})");
    assert_eq!(
        refused,
        [
            ("forge.test", no_allow("forge.test", "1").as_str()),
            ("other.test", no_allow("other.test", &port).as_str()),
            ("bad.test", format!("--deny-host bad.test (host bad.test:{port})").as_str()),
        ],
        "{lines:?}"
    );
    let reached: Vec<&Value> = lines.iter().filter(|l| l["allowed"] == true).collect();
    assert_eq!(reached.len(), 1, "{lines:?}");
    let l = reached[0];
    assert_eq!(l["host"], "forge.test");
    assert_eq!(l["addr"], format!("127.0.0.1:{port}"));
    assert_eq!(l["rule"], format!("--allow-host forge.test:{port}"));
    assert_eq!(l["answer"], 200);
    assert!(l["down"].as_u64().unwrap() > 0, "{l}");
}

/// `--allow-url` alone: its prefixes' hosts are the patterns, so a prefix
/// naming `localhost` reaches no loopback address; with `--allow-host` a
/// prefix narrows what the patterns allow.
#[test]
fn http_url_prefixes_go_by_the_address_check_and_narrow_the_patterns() {
    let f = Fixture::new();
    let base = http_server();
    let port = base.rsplit(':').next().unwrap().to_owned();
    let lp = format!("http://localhost:{port}/");
    let got = http_answers(&f, &["--allow-url", &lp], &[format!("{lp}echo")]);
    assert_eq!(got[0][0], -32001, "{got:?}");
    assert!(got[0][1].as_str().unwrap().contains("loopback address"), "{got:?}");
    let got = http_answers(
        &f,
        &["--allow-url", &lp, "--allow-host", "127.0.0.1", "--allow-host", "localhost"],
        &[format!("{lp}echo"), format!("{base}/echo")],
    );
    assert_eq!(got[0], json!([200]), "{got:?}");
    assert!(got[1][1].as_str().unwrap().contains("under no --allow-url prefix"), "{got:?}");
}

#[test]
fn http_unset_allowed_var_is_32002() {
    let f = Fixture::new();
    let base = http_server();
    let out = f.run(
        &["--allow-url", &format!("{base}/"), "--env-allow", "NOT_SET_ANYWHERE_X"],
        &f.py(&format!(
            "result(str(code('http.get', {{'url': {:?}, 'headers': [{{'name': 'X', 'value': '${{NOT_SET_ANYWHERE_X}}'}}]}})))",
            format!("{base}/echo")
        )),
    );
    assert_eq!(out.text(), "-32002");
}

#[test]
fn http_policy_limits_and_timeouts() {
    let f = Fixture::new();
    let base = http_server();
    let port = base.rsplit(':').next().unwrap().to_owned();
    let out = f.run(
        &["--allow-url", &format!("{base}/api"), "--max-file", "1000", "--op-timeout", "1"],
        &f.py(&format!(
            "b = {base:?}\n\
             cases = [b + '/apix', b + '/other', 'http://localhost:{port}/api/x', 'https://127.0.0.1:{port}/api/x',\n\
             \x20   'http://127.0.0.1:1/api/x', 'http://u:p@127.0.0.1:{port}/api/x', b + '/api/../echo', b + '/api/%2e%2e/echo']\n\
             r = [code('http.get', {{'url': u}}) for u in cases]\n\
             r.append(call('http.get', {{'url': b + '/api'}}).get('result', {{}}).get('status'))\n\
             r.append(ok('http.get', {{'url': b + '/api/echo'}})['status'])\n\
             result(json.dumps(r))"
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    for (i, c) in got.as_array().unwrap()[..8].iter().enumerate() {
        assert_eq!(c, -32001, "url case {i}: {got}");
    }
    assert_eq!(got[8], 200);
    assert_eq!(got[9], 200);

    // Bodies over --max-file and slow servers.
    let out = f.run(
        &["--allow-url", &format!("{base}/"), "--max-file", "1000", "--op-timeout", "1"],
        &f.py(&format!(
            "result(json.dumps([code('http.get', {{'url': {b:?} + '/big'}}), code('http.get', {{'url': {b:?} + '/slow'}}),\n\
             \x20 code('http.post', {{'url': {b:?} + '/echo', 'body': 'x' * 5000}})]))",
            b = base
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got, json!([-32603, -32004, -32603]));
    assert!(out.elapsed < Duration::from_secs(10));
}

// ---------------------------------------------------------------- README and SDK

/// The Python tool of docs/tool.md, extracted verbatim.
fn readme_python_tool() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tool.md")).unwrap();
    let start = readme.find("<!-- tool-example -->").expect("docs/tool.md marks its Python tool");
    let rest = &readme[start..];
    let code = rest.split("```python\n").nth(1).expect("a python block follows the mark");
    code.split("```").next().unwrap().to_owned()
}

#[test]
fn the_readme_python_tool_works_when_pasted() {
    let f = Fixture::new();
    let code = readme_python_tool();
    assert!(code.lines().count() <= 12, "docs/tool.md promises a ten-line tool:\n{code}");
    let path = f.scratch.path().join("count_lines.py");
    std::fs::write(&path, &code).unwrap();
    f.file("notes.txt", "a\nb\nc\n");
    let out = f.run(&["--args", r#"{"path":"notes.txt"}"#], &["python3".into(), path.display().to_string()]);
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "notes.txt: 3 lines", "{j}");
}

#[test]
fn the_rust_example_tool_uses_the_sdk() {
    let f = Fixture::new();
    f.file("src/main.rs", "fn main() {}\n");
    // The example belongs to the SDK crate, which depends on neither airlock
    // nor the simulator: building it here compiles one small crate, whatever
    // features the outer `cargo test` unified.
    let exe = Path::new(airlock()).parent().unwrap().join("examples/vfs_tool");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "airlock-tool", "--example", "vfs_tool"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success());
    let out = f.run(&["--allow-rw", "."], &[exe.display().to_string()]);
    let j = out.completed();
    assert_eq!(j["content"][0]["text"], "Modified src/main.rs", "{j}");
    assert_eq!(f.read("src/main.rs").unwrap(), b"// edited by vfs_tool\nfn main() {}\n");
}

// ---------------------------------------------------------------- issue 30: URLs, scrubbing, secrets

/// A loopback server that reads paths as ordinary web servers do: the
/// whole path percent-decoded (`%2f` included), then its dot segments
/// removed. `/pub/file.txt` answers `PUBLIC`, `/private.txt` `PRIVATE`;
/// every path as the server resolved it is sent on `seen`.
fn decoding_server(seen: std::sync::mpsc::Sender<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let req = common::read_head(&mut s);
            let head = String::from_utf8_lossy(&req).into_owned();
            let target = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let path = target.split('?').next().unwrap_or("/");
            let decoded = percent_decode(path);
            let mut out: Vec<&str> = Vec::new();
            for seg in decoded.split(['/', '\\']) {
                match seg {
                    "" | "." => {}
                    ".." => {
                        out.pop();
                    }
                    s => out.push(s),
                }
            }
            let resolved = format!("/{}", out.join("/"));
            let body = match resolved.as_str() {
                "/pub/file.txt" => "PUBLIC",
                "/private.txt" => "PRIVATE",
                _ => "NONE",
            };
            let _ = seen.send(resolved);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = |x: u8| (x as char).to_digit(16);
        match (b[i], b.get(i + 1).and_then(|&x| hex(x)), b.get(i + 2).and_then(|&x| hex(x))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn encoded_urls_reach_only_what_the_prefix_allows() {
    let f = Fixture::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let base = decoding_server(tx);
    let out = f.run(
        &["--allow-url", &format!("{base}/pub/")],
        &f.py(&format!(
            "b = {base:?} + '/pub/'\n\
             tails = ['%2e%2e%2fprivate.txt', '..%2fprivate.txt', '..%2Fprivate.txt', '%2e%2e/private.txt',\n\
             \x20   '.%2e/private.txt', '%2E%2E%2Fprivate.txt', '..%5cprivate.txt', '..\\\\private.txt', '../private.txt',\n\
             \x20   'x/../../private.txt', '%2e%2e%5c..%5cprivate.txt', '%252e%252e%252fprivate.txt', 'file.txt',\n\
             \x20   'x/../file.txt', '%66ile.txt', './file.txt']\n\
             got = []\n\
             for t in tails:\n\
             \x20   r = call('http.get', {{'url': b + t}})\n\
             \x20   got.append([t, r['result']['body'] if 'result' in r else r['error']['code']])\n\
             result(json.dumps(got))"
        )),
    );
    let got: Vec<(String, Value)> = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got.len(), 16);
    for (tail, answer) in &got {
        assert_ne!(answer, "PRIVATE", "{tail} reached the private file: {got:?}");
    }
    // The ways to the allowed file through encodings and dot segments
    // within the prefix still get it, sent in their normalized form.
    for (tail, answer) in &got[12..] {
        assert_eq!(answer, "PUBLIC", "{tail}: {got:?}");
    }
    // Every encoded separator or encoded dot segment is refused, not sent.
    for (tail, answer) in &got[..8] {
        assert!(answer.is_i64(), "{tail} was sent: {got:?}");
    }
    drop(out);
    let seen: Vec<String> = rx.try_iter().collect();
    assert!(!seen.is_empty());
    for p in &seen {
        assert!(p.starts_with("/pub/"), "the server resolved a request to {p}: {seen:?}");
    }
}

/// A one-line secret the grep oracle attack would rebuild a byte at a
/// time: every pattern runs on the scrubbed text, so no answer depends on
/// the secret.
#[test]
fn grep_answers_nothing_about_a_secret() {
    let f = Fixture::new();
    let secret = "k3y-9f8e7d6c5b4a";
    f.file("conf.txt", format!("name=app\napi_key={secret}\n"));
    let out = f.run_env(
        &["--env-allow", "APP_KEY"],
        &f.py(
            "import re\n\
             alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789-'\n\
             known, asked = '', 0\n\
             while len(known) < 40:\n\
             \x20   for c in alphabet:\n\
             \x20       asked += 1\n\
             \x20       r = ok('fs.grep', {'pattern': '^api_key=' + re.escape(known + c), 'paths': ['conf.txt']})\n\
             \x20       if r['matches']:\n\
             \x20           known += c\n\
             \x20           break\n\
             \x20   else:\n\
             \x20       break\n\
             whole = ok('fs.grep', {'pattern': 'api_key=', 'paths': ['conf.txt']})\n\
             redacted = ok('fs.grep', {'pattern': r'^api_key=\\[REDACTED\\]$', 'paths': ['conf.txt']})\n\
             result(json.dumps([known, asked, whole, len(redacted['matches'])]))",
        ),
        &[("APP_KEY", secret)],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got[0], "", "the attack rebuilt a prefix of the secret: {got}");
    assert!(got[1].as_u64().unwrap() >= 37, "the attack ran: {got}");
    assert_eq!(got[2]["matches"][0]["lines"][0]["content"], "api_key=[REDACTED]", "{got}");
    assert_eq!(got[3], 1, "grep sees the scrubbed line: {got}");
    assert!(!out.stdout().contains(secret));
}

/// The lines of a PEM key, the secret whole.
const PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n\
MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n\
NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ\n\
-----END PRIVATE KEY-----";

/// Strings in a JSON trace line, and the decoded bytes of each that is
/// base64.
fn trace_strings(v: &Value, out: &mut Vec<Vec<u8>>) {
    use base64::Engine as _;
    match v {
        Value::String(s) => {
            out.push(s.as_bytes().to_vec());
            if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(s) {
                out.push(b);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| trace_strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| trace_strings(x, out)),
        _ => {}
    }
}

#[test]
fn a_multi_line_secret_is_redacted_whole_in_grep_read_and_the_record() {
    let f = Fixture::new();
    f.file("keys/server.pem", format!("# deploy key\n{PEM}\nEND-OF-FILE\n"));
    let rec = f.scratch.path().join("trace.jsonl");
    let out = f.run_env(
        &["--env-allow", "TLS_KEY", "--record", rec.to_str().unwrap()],
        &f.py("g = ok('fs.grep', {'pattern': '.', 'paths': ['keys']})\n\
             m = ok('fs.grep', {'pattern': 'END-OF-FILE|MII|KEY', 'paths': ['keys'], 'context': 2})\n\
             r = ok('fs.read', {'path': 'keys/server.pem'})\n\
             result(json.dumps([g, m, r]))"),
        &[("TLS_KEY", PEM)],
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    let lines = |v: &Value| -> Vec<(u64, String)> {
        v["matches"][0]["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["line_number"].as_u64().unwrap(), l["content"].as_str().unwrap().to_owned()))
            .collect()
    };
    // One line where the key was, numbered as in the text fs.read returns.
    let want: Vec<(u64, String)> =
        vec![(1, "# deploy key".into()), (2, "[REDACTED]".into()), (3, "END-OF-FILE".into())];
    assert_eq!(lines(&got[0]), want, "{got}");
    assert_eq!(lines(&got[1]), want, "{got}");
    assert_eq!(got[2]["content"], "# deploy key\n[REDACTED]\nEND-OF-FILE\n");
    let stdout = out.stdout();
    for line in PEM.lines() {
        assert!(!stdout.contains(line), "{line} reached the tool: {stdout}");
    }
    // The trace holds none of the key's lines, plain or in base64.
    let trace = std::fs::read_to_string(&rec).unwrap();
    let mut texts = Vec::new();
    for l in trace.lines() {
        trace_strings(&serde_json::from_str(l).unwrap(), &mut texts);
    }
    assert!(texts.iter().any(|t| t.windows(11).any(|w| w == b"END-OF-FILE")), "{trace}");
    for line in PEM.lines() {
        let needle = line.as_bytes();
        assert!(
            !texts.iter().any(|t| t.windows(needle.len()).any(|w| w == needle)),
            "{line} is in the trace"
        );
    }
    let (code, stdout) = replay(&rec);
    assert_eq!(code, Some(0), "the scrubbed recording replays: {stdout}");
}

/// What airlock's `/proc/<pid>/environ` holds while its tool runs, read
/// by the test as root (who may read a non-dumpable process's files): no
/// secret, since airlock removed it. The confined tool reaches no part of
/// its parent's `/proc` at all (Landlock grants none; by default it is in
/// a PID namespace of its own), in both modes, as root and, below, as an
/// ordinary user.
#[test]
fn the_tool_finds_no_secret_in_airlocks_environ() {
    let probe = "try:\n\
                 \x20   with open('/proc/%d/environ' % os.getppid(), 'rb') as fh:\n\
                 \x20       env = fh.read()\n\
                 \x20   r = ['read', b'sekrit-value-42' in env]\n\
                 except OSError:\n\
                 \x20   r = ['refused']\n\
                 note(NOTES + '/ready', 'y')\n\
                 while not os.path.exists(NOTES + '/go'): time.sleep(0.01)\n\
                 result(json.dumps(r))";
    let f = Fixture::new();
    for no_ns in ["0", "1"] {
        let _ = std::fs::remove_file(f.note("ready"));
        let _ = std::fs::remove_file(f.note("go"));
        let child = Command::new(airlock())
            .current_dir(f.root())
            .arg("tool")
            .args(f.grants())
            .args(["--env-allow", "HIDE_ME", "--"])
            .args(f.py(probe))
            .env("HIDE_ME", "sekrit-value-42")
            .env("AIRLOCK_NO_NAMESPACES", no_ns)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&f.note("ready"), Duration::from_secs(10));
        let env =
            std::fs::read(format!("/proc/{}/environ", child.id())).expect("root reads airlock's environ");
        assert!(!env.windows(15).any(|w| w == b"sekrit-value-42"), "the secret is in airlock's environ");
        std::fs::write(f.note("go"), "y").unwrap();
        let out = Out::new(child.wait_with_output().unwrap(), Duration::ZERO);
        let got: Value = serde_json::from_str(&out.text()).unwrap();
        assert_eq!(got, json!(["refused"]), "no namespaces: {no_ns}: the tool read its parent's environ");
    }

    // As an ordinary user, airlock and the tool alike (`go` is there).
    std::fs::remove_file(f.note("ready")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for d in [f.root(), f.scratch.path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let cmd = f.py(probe);
    for p in &cmd[1..] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(airlock())
        .arg("tool")
        .args(f.grants())
        .args(["--env-allow", "HIDE_ME", "--"])
        .args(&cmd)
        .current_dir(f.root())
        .env("HIDE_ME", "sekrit-value-42")
        .stdin(Stdio::null())
        .output()
        .expect("setpriv runs");
    let out = Out::new(output, Duration::ZERO);
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(got, json!(["refused"]), "a same-user tool reads airlock's environ");
}

#[test]
fn list_dir_names_are_relative_to_the_listed_directory() {
    let f = Fixture::new();
    f.file("src/main.rs", "fn main() {}\n");
    f.file("src/lib/mod.rs", "\n");
    f.file("src/a.key", "k\n");
    let out = f.run(
        &["--deny", "*.key"],
        &f.py(
            "l = ok('fs.list_dir', {'path': 'src'})\n\
             reads = [ok('fs.read', {'path': 'src/' + e['path']})['size'] for e in l['entries'] if e['kind'] == 'file']\n\
             d = ok('fs.list_dir', {'path': './src/lib/'})\n\
             result(json.dumps([l, reads, d]))",
        ),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap();
    assert_eq!(
        got[0],
        json!({"entries": [{"path": "lib", "kind": "dir"}, {"path": "main.rs", "kind": "file"}]}),
        "{got}"
    );
    assert_eq!(got[1], json!([13]), "a tool joining the name to the directory reads the file");
    assert_eq!(got[2], json!({"entries": [{"path": "mod.rs", "kind": "file"}]}));
}

// ------------------------------------------------- check-then-use races

/// A tool that may write `w/` swaps the directory `w/d` for a symlink to
/// the denied `secret/` or the read-only `ro/` in a tight loop (a forked
/// process), while it asks for every file operation on paths through
/// `w/d`. Each answer comes from the walk that checked it: no read, grep,
/// listing, `exists` or `metadata` shows anything of `secret/`, and
/// nothing in `ro/` or `secret/` is created, removed or moved.
#[test]
fn attack_swapping_a_middle_directory_never_redirects_an_operation() {
    let f = Fixture::new();
    f.file("w/d/k.txt", "public");
    f.file("secret/k.txt", "TOPSECRET-k");
    f.file("secret/only_secret.txt", "TOPSECRET-o");
    f.file("secret/victim.txt", "TOPSECRET-v");
    f.file("secret/mv.txt", "TOPSECRET-m");
    f.file("ro/k.txt", "rofile");
    f.file("ro/victim.txt", "rovictim");
    f.file("ro/mv.txt", "romv");
    std::os::unix::fs::symlink("../secret", f.root().join("w/d.s")).unwrap();
    std::os::unix::fs::symlink("../ro", f.root().join("w/d.r")).unwrap();
    let snapshot = |dir: &str| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(f.root().join(dir))
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    let (secret_before, ro_before) = (snapshot("secret"), snapshot("ro"));
    let rounds = 400;
    let out = f.run(
        &["--allow", ".", "--allow-rw", "w", "--deny", "secret/"],
        &f.py(&format!(
            "W = {w:?}\n\
             stop = os.path.join(NOTES, 'stop')\n\
             pid = os.fork()\n\
             if pid == 0:\n\
             \x20   n = 0\n\
             \x20   while not os.path.exists(stop):\n\
             \x20       link = W + ('/d.s' if n % 2 else '/d.r')\n\
             \x20       for a, b in ((W + '/d', W + '/d.real'), (link, W + '/d'), (W + '/d', link), (W + '/d.real', W + '/d')):\n\
             \x20           try: os.rename(a, b)\n\
             \x20           except OSError: pass\n\
             \x20       n += 1\n\
             \x20   open(os.path.join(NOTES, 'swaps'), 'w').write(str(n))\n\
             \x20   os._exit(0)\n\
             bad, refused, served = [], 0, 0\n\
             def ask(method, params):\n\
             \x20   global refused, served\n\
             \x20   r = call(method, params)\n\
             \x20   if 'error' in r: refused += 1\n\
             \x20   else: served += 1\n\
             \x20   return r\n\
             for i in range({rounds}):\n\
             \x20   rs = [ask('fs.read', {{'path': 'w/d/k.txt'}}),\n\
             \x20         ask('fs.list_dir', {{'path': 'w/d'}}),\n\
             \x20         ask('fs.grep', {{'pattern': 'TOPSECRET|rofile|public', 'paths': ['w/d', 'w']}})]\n\
             \x20   for r in rs:\n\
             \x20       if 'TOPSECRET' in json.dumps(r) or 'only_secret' in json.dumps(r): bad.append(r)\n\
             \x20   r = ask('fs.exists', {{'path': 'w/d/only_secret.txt'}})\n\
             \x20   if r.get('result', {{}}).get('exists'): bad.append(r)\n\
             \x20   r = ask('fs.metadata', {{'path': 'w/d/k.txt'}})\n\
             \x20   if r.get('result', {{}}).get('size') not in (None, 6, 6): bad.append(r)\n\
             \x20   ask('fs.write', {{'path': 'w/d/new%d.txt' % i, 'content': 'x'}})\n\
             \x20   ask('fs.delete', {{'path': 'w/d/victim.txt'}})\n\
             \x20   ask('fs.rename', {{'from': 'w/d/mv.txt', 'to': 'w/moved%d.txt' % i}})\n\
             open(stop, 'w').close()\n\
             os.waitpid(pid, 0)\n\
             result(json.dumps({{'bad': bad[:3], 'refused': refused, 'served': served}}))",
            w = f.root().join("w").display().to_string(),
        )),
    );
    let got: Value = serde_json::from_str(&out.text()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout()));
    assert_eq!(got["bad"], json!([]), "{got}");
    // The race was run: thousands of requests, some through the link
    // (refused), some through the directory (served).
    let (refused, served) = (got["refused"].as_u64().unwrap(), got["served"].as_u64().unwrap());
    assert_eq!(refused + served, 8 * rounds);
    assert!(refused > 0 && served > 0, "{got}");
    let swaps: u64 = std::fs::read_to_string(f.note("swaps")).unwrap().parse().unwrap();
    assert!(swaps > 100, "{swaps} swaps");
    assert_eq!(snapshot("secret"), secret_before);
    assert_eq!(snapshot("ro"), ro_before);
}

/// A refusal names the path the tool asked for and the rule, never where a
/// symlink on it leads: the names inside a denied directory stay unknown.
#[test]
fn attack_refusals_never_name_a_denied_symlink_target() {
    let f = Fixture::new();
    f.file("secret/hidden-name.txt", "TOPSECRET");
    f.file("pub/a.txt", "a");
    std::os::unix::fs::symlink("../secret/hidden-name.txt", f.root().join("pub/file-link")).unwrap();
    std::os::unix::fs::symlink("../secret", f.root().join("pub/dir-link")).unwrap();
    let out = f.run(
        &["--allow-rw", ".", "--deny", "secret/"],
        &f.py("rs = [call('fs.read', {'path': 'pub/file-link'}),\n\
             \x20     call('fs.write', {'path': 'pub/file-link', 'content': 'x'}),\n\
             \x20     call('fs.metadata', {'path': 'pub/file-link'}),\n\
             \x20     call('fs.exists', {'path': 'pub/dir-link/hidden-name.txt'}),\n\
             \x20     call('fs.read', {'path': 'pub/dir-link/nothing-here.txt'}),\n\
             \x20     call('fs.list_dir', {'path': 'pub/dir-link'})]\n\
             result(json.dumps(rs))"),
    );
    let text = out.text();
    let rs: Vec<Value> = serde_json::from_str(&text).unwrap();
    for (i, r) in rs.iter().enumerate() {
        assert_eq!(r["error"]["code"], -32001, "{r}");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(m.contains("--deny"), "the rule is named: {m}");
        assert!(!m.contains("secret"), "{m}");
        // The one request that names the file itself may see it echoed.
        assert!(i == 3 || !m.contains("hidden-name"), "{m}");
    }
    assert_eq!(f.read("secret/hidden-name.txt").unwrap(), b"TOPSECRET");
}
