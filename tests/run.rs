//! `airlock run`: real children reading and writing through the proxy.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn child_reads_and_writes_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &sh(
            r#"printf 'hello\nworld\n' | "$AIRLOCK" fs write out.txt && "$AIRLOCK" fs cat out.txt && printf 'more\n' | "$AIRLOCK" fs append out.txt"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.stdout(), "hello\nworld\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap(), "hello\nworld\nmore\n");
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_opened"), 3);
    assert_eq!(run.report["errors_by_code"], serde_json::json!({}));
}

#[test]
fn large_binary_file_survives_the_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    // Deterministic, non-text bytes: every value, in a scrambled order.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(dir.path().join("in.bin"), &data).unwrap();
    let run = run_in(
        dir.path(),
        &["--allow", "in.bin", "--allow-rw", "copy.bin"],
        &sh(r#""$AIRLOCK" fs cat in.bin | "$AIRLOCK" fs write copy.bin"#),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert!(std::fs::read(dir.path().join("copy.bin")).unwrap() == data, "copy differs");
    run.assert_no_leaks();
}

#[test]
fn exit_status_is_the_childs() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run_in(dir.path(), &[], &sh("exit 7")).code(), Some(7));
    let killed = run_in(dir.path(), &[], &sh("kill -TERM $$"));
    assert_eq!(killed.code(), Some(128 + 15));
    assert_eq!(killed.report["child_exit"]["signal"], 15);
}

#[test]
fn sigkill_while_holding_handles_cleans_up_and_keeps_acknowledged_data() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &python(
            r#"
import os, signal
h = call("open", path="kept.txt", mode="w")["result"]["handle"]
out(call("write", h=h, data=b64(b"acknowledged\n")))
h2 = call("open", path="other.txt", mode="a", id="y")["result"]["handle"]
call("write", h=h2, data=b64(b"also\n"))
v = call("open", path="virtual-scratch", mode="w")["result"]["handle"]
os.kill(os.getpid(), signal.SIGKILL)
"#,
        ),
    );
    assert_eq!(run.code(), Some(128 + 9), "stderr: {}", run.stderr());
    assert_eq!(run.lines()[0]["result"]["written"], 13);
    assert_eq!(std::fs::read_to_string(dir.path().join("kept.txt")).unwrap(), "acknowledged\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("other.txt")).unwrap(), "also\n");
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_cleaned_up"), 3);
}

#[test]
fn death_is_seen_even_while_a_grandchild_holds_the_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    // The grandchild keeps a copy of fd 3 open for a minute; the child
    // dies at once holding a handle. airlock must not wait for EOF.
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &sh(
            r#"sleep 60 </dev/null >/dev/null 2>&1 & echo $! | "$AIRLOCK" fs write grandchild.pid; exec python3 -c "
from fsclient import *
import signal
call('open', path='held.txt', mode='w')
os.kill(os.getpid(), signal.SIGKILL)""#,
        ),
    );
    let pid = std::fs::read_to_string(dir.path().join("grandchild.pid")).unwrap_or_default();
    let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    assert_eq!(run.code(), Some(128 + 9), "stderr: {}", run.stderr());
    assert!(run.elapsed < Duration::from_secs(20), "airlock waited {:?} for the grandchild", run.elapsed);
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_cleaned_up"), 1);
}

#[test]
fn eof_without_close_cleans_up_while_the_child_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &python(
            r#"
import os, time
h = call("open", path="f.txt", mode="w")["result"]["handle"]
call("write", h=h, data=b64(b"x"))
os.close(FD)
time.sleep(0.3)
out("alive")
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.lines(), vec![serde_json::json!("alive")]);
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_cleaned_up"), 1);
    assert_eq!(std::fs::read_to_string(dir.path().join("f.txt")).unwrap(), "x");
}

#[test]
fn nested_airlock_forwards_and_cleans_up_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let inner_report = dir.path().join("inner.json");
    let inner = format!(
        r#""$AIRLOCK" run --sandbox-ro "$SUPPORT" --allow-rw . --report {} -- python3 -c "
from fsclient import *
import signal
h = call('open', path='deep.txt', mode='w')['result']['handle']
out(call('write', h=h, data=b64(b'through two levels\n')))
call('open', path='scratch', mode='w')
out(code(call('open', path='/etc/passwd', mode='r')))
os.kill(os.getpid(), signal.SIGKILL)""#,
        inner_report.display()
    );
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(&inner));
    assert_eq!(run.code(), Some(128 + 9), "stderr: {}", run.stderr());
    let lines = run.lines();
    assert_eq!(lines[0]["result"]["written"], 19);
    assert_eq!(lines[1], "E_PERM");
    assert_eq!(std::fs::read_to_string(dir.path().join("deep.txt")).unwrap(), "through two levels\n");
    // The outer level saw the inner airlock's closes for both handles, and
    // the inner's report, which a confined level writes through the proxy.
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_opened"), 3);
    let inner: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(inner_report).unwrap()).unwrap();
    assert_eq!(inner["upstream"], true);
    assert_eq!(inner["handles_leaked"], 0);
    assert_eq!(inner["handles_cleaned_up"], 2);
    assert_eq!(inner["child_exit"]["signal"], 9);
}

#[test]
fn policy_escapes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
    std::fs::write(root.join("ok.txt"), "fine").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("link-out")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", root.join("rel-link-out")).unwrap();
    std::os::unix::fs::symlink("ok.txt", root.join("link-in")).unwrap();
    std::fs::write(dir.path().join("ro.txt"), "read only").unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "root", "--allow", "ro.txt"],
        &python(
            r#"
import os
secret = os.path.abspath("secret.txt")
for path, mode in [("../x", "r"), ("root/../../x", "w"), ("/etc/passwd", "r"), (secret, "r"), (secret, "w"),
                   ("root/link-out", "r"), ("root/rel-link-out", "r"), ("root/link-out", "w"),
                   ("a\u0000b", "w"), ("ro.txt", "w"), ("ro.txt", "a"), ("ro.txt", "rw")]:
    out([path, mode, code(call("open", path=path, mode=mode))])
# A relative path under no root is the virtual namespace: the host file of
# that name is not reachable, and was never created there.
out(["secret.txt", code(call("open", path="secret.txt", mode="r"))])
out(["root/link-in", code(call("open", path="root/link-in", mode="r"))])
out(["ro.txt", code(call("open", path="ro.txt", mode="r"))])
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let lines = run.lines();
    let (refused, rest) = lines.split_at(lines.len() - 3);
    for l in refused {
        assert_eq!(l[2], "E_PERM", "{l}");
    }
    let (virtual_name, allowed) = rest.split_at(1);
    assert_eq!(virtual_name[0][1], "E_NOENT");
    for l in allowed {
        assert_eq!(l[1], serde_json::Value::Null, "{l}");
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("secret.txt")).unwrap(), "secret");
    assert_eq!(std::fs::read_to_string(dir.path().join("ro.txt")).unwrap(), "read only");
    run.assert_no_leaks();
}

#[test]
fn garbage_and_oversized_frames() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--max-frame", "1000"],
        &python(
            r#"
send_raw(b"not json")
out(recv())
send_raw(b"\xff\xfe")
out(recv())
send_raw(b"[1,2]")
out(recv())
send_raw(b'{"id": 5, "op": "open"}')
out(recv())
send_raw(b'{"id": "7", "op": "frobnicate"}')
out(recv())
out(call("open", path="v", mode="w"))
os.write(FD, (1001).to_bytes(4, "big"))
out(recv())
try:
    recv()
    out("still open")
except (EOFError, OSError):
    out("closed")
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let lines = run.lines();
    for l in &lines[..4] {
        assert_eq!(l["id"], serde_json::Value::Null, "{l}");
        assert_eq!(l["error"]["code"], "E_ARG", "{l}");
    }
    assert_eq!(lines[4]["id"], "7");
    assert_eq!(lines[4]["error"]["code"], "E_UNSUPPORTED");
    assert_eq!(lines[5]["result"]["handle"], 3, "the session continued after garbage");
    assert_eq!(lines[6]["error"]["code"], "E_RANGE");
    assert_eq!(lines[7], "closed");
    assert_eq!(run.report_u64("frames_rejected"), 1);
    run.assert_no_leaks();
}

#[test]
fn protocol_error_codes() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &python(
            r#"
h = call("open", path="f", mode="w")["result"]["handle"]
out(code(call("read", h=h, max=10)))            # E_PERM: write-only
out(code(call("write", h=h, data="!!")))        # E_ARG: not base64
r = call("open", path="f", mode="r")["result"]["handle"]
out(code(call("read", h=r, max=0)))             # E_ARG
out(code(call("read", h=r, max=4097)))          # E_RANGE
out(code(call("write", h=r, data=b64(b"x"))))   # E_PERM: read-only
out(code(call("close", h=r)))                    # None
out(code(call("close", h=r)))                    # E_CLOSED
out(code(call("read", h=999, max=1)))           # E_NOENT
out(code(call("open", path="missing", mode="r")))  # E_NOENT (virtual, never created)
out(code(call("open", path="f")))               # E_ARG: no mode
out(code(call("QUOTA")))                         # E_UNSUPPORTED
out(code(call("LLMCMD")))                        # E_UNSUPPORTED
out(h, r)
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let codes: Vec<_> = run.lines().into_iter().collect();
    let want = serde_json::json!([
        "E_PERM",
        "E_ARG",
        "E_ARG",
        "E_RANGE",
        "E_PERM",
        null,
        "E_CLOSED",
        "E_NOENT",
        "E_NOENT",
        "E_ARG",
        "E_UNSUPPORTED",
        "E_UNSUPPORTED",
        [3, 4]
    ]);
    assert_eq!(serde_json::Value::Array(codes), want);
    run.assert_no_leaks();
}

#[test]
fn pipelined_requests_each_get_one_answer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &python(
            r#"
send({"id": "o", "op": "open", "params": {"path": "p.txt", "mode": "w"}})
for i in range(200):
    send({"id": f"w{i}", "op": "write", "params": {"h": 3, "data": b64(b"%03d\n" % i)}})
send({"id": "c", "op": "close", "params": {"h": 3}})
ids = [recv()["id"] for _ in range(202)]
out(ids == ["o"] + [f"w{i}" for i in range(200)] + ["c"])
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.lines(), vec![serde_json::json!(true)]);
    let text = std::fs::read_to_string(dir.path().join("p.txt")).unwrap();
    let want: String = (0..200).map(|i| format!("{i:03}\n")).collect();
    assert_eq!(text, want);
    run.assert_no_leaks();
}

#[test]
fn stdio_handles_are_served_by_the_mux() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_with_stdin(
        dir.path(),
        &[],
        &python(
            r#"
import sys
d = call("read", h=0, max=100)["result"]
w = call("write", h=1, data=b64(b"via handle 1\n"))
e = call("write", h=2, data=b64(b"via handle 2\n"))
bad = call("read", h=1, max=10)
c = call("close", h=1)
sys.stderr.write(json.dumps([base64.b64decode(d["data"]).decode(), w["result"]["written"], code(e), code(bad), code(c)]) + "\n")
"#,
        ),
        std::process::Stdio::piped(),
    );
    // stdin was a closed pipe (nothing written): the read sees EOF.
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.stdout(), "via handle 1\n");
    assert!(run.stderr().contains("via handle 2\n"), "{}", run.stderr());
    assert!(run.stderr().contains(r#"["", 13, null, "E_PERM", null]"#), "{}", run.stderr());
    run.assert_no_leaks();
}

#[test]
fn fs_client_outside_airlock_says_so() {
    let out = std::process::Command::new(airlock())
        .args(["fs", "cat", "x"])
        .env_remove("AIRLOCK_FD")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("airlock run"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn attached_process_has_its_own_connection_and_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &python(
            r#"
import signal
mine = call("open", path="parent.txt", mode="w")["result"]["handle"]
pid = os.fork()
if pid == 0:
    fd, resp = attach()
    out(["attach", resp])
    # The parent's handle is not this connection's.
    out(["foreign", code(call("write", fd=fd, h=mine, data=b64(b"x")))])
    h = call("open", fd=fd, path="child.txt", mode="w")["result"]["handle"]
    call("write", fd=fd, h=h, data=b64(b"from the attached child\n"))
    os.kill(os.getpid(), signal.SIGKILL)
os.waitpid(pid, 0)
# The shared connection is untouched and still works.
out(["parent", call("write", h=mine, data=b64(b"parent\n"))["result"]])
out(["no descriptor", code(call("attach"))])
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let lines = run.lines();
    assert_eq!(lines[0], serde_json::json!(["attach", {"id": "a", "ok": true}]));
    assert_eq!(lines[1], serde_json::json!(["foreign", "E_NOENT"]));
    assert_eq!(lines[2], serde_json::json!(["parent", {"written": 7}]));
    assert_eq!(lines[3], serde_json::json!(["no descriptor", "E_ARG"]));
    assert_eq!(std::fs::read_to_string(dir.path().join("child.txt")).unwrap(), "from the attached child\n");
    // The killed process's handle was cleaned up when it died; the parent's
    // when the parent exited without closing it.
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_cleaned_up"), 2);
    assert_eq!(run.report_u64("clients"), 2);
}

#[test]
fn attached_processes_outliving_the_child_are_ended_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(
        dir.path(),
        &["--allow-rw", "."],
        &sh(r#"python3 -c "
from fsclient import *
import time
fd, _ = attach()
h = call('open', fd=fd, path='late.txt', mode='w')['result']['handle']
call('write', fd=fd, h=h, data=b64(b'written before the child left'))
call('close', fd=fd, h=call('open', fd=fd, path='ready', mode='w')['result']['handle'])
time.sleep(60)" </dev/null >/dev/null 2>&1 &
while ! "$AIRLOCK" fs cat ready >/dev/null 2>&1; do sleep 0.05; done
echo $! | "$AIRLOCK" fs write straggler.pid"#),
    );
    // The straggler's pid is its PID namespace's, not the host's: nothing
    // to kill from here, and nothing left to (the confinement ends every
    // process of the child's tree with it).
    assert!(dir.path().join("straggler.pid").exists());
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert!(run.elapsed < Duration::from_secs(20), "airlock waited {:?} for the straggler", run.elapsed);
    run.assert_no_leaks();
    assert_eq!(run.report_u64("handles_cleaned_up"), 1);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("late.txt")).unwrap(),
        "written before the child left"
    );
}

#[test]
fn start_up_failures_exit_125_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let start = |args: &[&str]| {
        let out = std::process::Command::new(airlock())
            .current_dir(dir.path())
            .arg("run")
            .args(args)
            .env_remove("AIRLOCK_FD")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = start(&["--", "/no/such/program"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("starting /no/such/program"), "{err}");
    let (code, err) = start(&["--allow", "/no/such/dir/file", "--", "true"]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("/no/such/dir/file"), "{err}");
}
