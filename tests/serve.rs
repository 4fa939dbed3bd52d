//! `airlock serve --fd N`: the upstream role, on a socket a parent hands it.

mod common;

use common::*;

/// The stdout of python3 run with `args`, outside any airlock (no
/// inherited proxy descriptor); fails the test unless it exits 0.
fn python_ok(args: &[&std::ffi::OsStr], dir: Option<&std::path::Path>) -> String {
    let mut cmd = std::process::Command::new("python3");
    cmd.args(args).env_remove("AIRLOCK_FD");
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let output = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[test]
fn serve_answers_on_the_given_descriptor_refuses_stdio_and_exits_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let script = format!(
        r#"
import os, socket, subprocess, sys, time
sys.path.insert(0, {support:?})
from fsclient import *
ours, theirs = socket.socketpair()
p = subprocess.Popen([{airlock:?}, "serve", "--fd", str(theirs.fileno()), "--allow-rw", ".", "--report", {report:?}],
                     pass_fds=[theirs.fileno()])
theirs.close()
fd = ours.fileno()
h = call("open", fd=fd, path="served.txt", mode="w")["result"]["handle"]
out(h)
out(call("write", fd=fd, h=h, data=b64(b"served\n"))["result"])
out([code(call("read", fd=fd, h=0, max=10)), code(call("write", fd=fd, h=1, data=b64(b"x"))), code(call("close", fd=fd, h=2))])
out(code(call("QUOTA", fd=fd)))
ours.close()
start = time.time()
out(p.wait(timeout=20))
"#,
        support = support("").display().to_string(),
        airlock = airlock(),
        report = report.display().to_string(),
    );
    let stdout = python_ok(&["-c".as_ref(), script.as_ref()], Some(dir.path()));
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!(3),
            serde_json::json!({"written": 7}),
            serde_json::json!(["E_PERM", "E_PERM", "E_PERM"]),
            serde_json::json!("E_UNSUPPORTED"),
            serde_json::json!(0),
        ]
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("served.txt")).unwrap(), "served\n");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    assert_eq!(report["handles_leaked"], 0);
    assert_eq!(report["handles_cleaned_up"], 1);
    assert_eq!(report["errors_by_code"]["E_PERM"], 3);
}

#[test]
fn serve_refuses_a_descriptor_that_is_not_a_socket() {
    let out = std::process::Command::new(airlock()).args(["serve", "--fd", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a socket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The request fast path's hostile spellings, from a separate process
/// against the real binary (`support/spellings_attack.py`): each answered
/// as its JSON means, the writes landed, and the server exits 0 at EOF.
#[test]
fn serve_answers_each_spelling_of_a_request_as_its_json_means() {
    let stdout = python_ok(&[support("spellings_attack.py").as_ref(), airlock().as_ref()], None);
    assert_eq!(stdout.lines().count(), 23, "{stdout}");
    assert!(stdout.ends_with("all answered as their JSON means; server exited 0\n"), "{stdout}");
}

/// Requests delivered every awkward way a socket allows, from a separate
/// process against the real binary (`support/delivery_attack.py`): a flood
/// past the queue bound in one write, a frame split around a passed
/// descriptor, an out-of-band byte between frames, a frame a byte at a
/// time. Every request is answered once and the server exits 0 at EOF: a
/// connection's reader that stopped reading with bytes still queued (a
/// read that stops short, an answer it waits for) would hang here.
#[test]
fn serve_answers_every_request_however_its_bytes_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let stdout =
        python_ok(&[support("delivery_attack.py").as_ref(), airlock().as_ref(), dir.path().as_ref()], None);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(lines[0].starts_with("flood: 2000 answered, "), "{stdout}");
    assert_eq!(
        lines[1..],
        [
            "descriptor mid-frame: both answered",
            "out-of-band byte: both answered",
            "trickled: answered",
            "server exited 0"
        ]
    );
}
