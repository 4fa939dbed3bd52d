//! The session socket against the real binary: a process of the session
//! whose descriptor 3 was closed on the way (Python's default
//! `subprocess`, `exec 3>&-`) still reaches the session through
//! `AIRLOCK_SOCKET`, proved with `AIRLOCK_TOKEN`; nobody else does.
//!
//! Under the default sandbox on a kernel before Landlock ABI 9 the child
//! may not create unix sockets at all (a seccomp filter stands in for
//! Landlock's missing control of named sockets), so the tests that go
//! through the socket run with `--no-sandbox`; the default sandbox is
//! covered by the test that the refusal there is explained, and by the
//! fallback a child keeps: its descriptor, passed on.

mod common;

use common::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Helpers for a python child: a connection through the session socket
/// (with this session's secret unless told otherwise) and the greeting it
/// gets.
const SOCKET_PRELUDE: &str = r#"
import os, socket
def sconnect(path=None, token=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path or os.environ["AIRLOCK_SOCKET"])
    s.sendall((os.environ["AIRLOCK_TOKEN"] if token is None else token).encode())
    return s
def greeting(s):
    # Neither an answer nor a close within 10 s is a hang, and fails.
    import select
    if not select.select([s], [], [], 10)[0]:
        raise SystemExit("the session neither answered nor closed the connection within 10 s")
    try:
        return recv(s.fileno())
    except (EOFError, ConnectionResetError):
        return None
"#;

fn py(script: &str) -> Vec<String> {
    python(&format!("{SOCKET_PRELUDE}{script}"))
}

fn no_sandbox() -> &'static str {
    "--no-sandbox"
}

/// An agent written as people write them: default `subprocess` (which
/// closes every descriptor above 2) calling `$AIRLOCK fs cat`, and a shell
/// that closes descriptor 3 first. Both read the file, through the socket.
#[test]
fn a_python_agent_with_default_subprocess_reaches_the_session() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "hello from the project\n").unwrap();
    let script = r#"
import subprocess
r = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, text=True)
out([r.returncode, r.stdout, r.stderr])
r = subprocess.run(["sh", "-c", 'exec 3>&-; "$AIRLOCK" fs cat data.txt'], capture_output=True, text=True)
out([r.returncode, r.stdout, r.stderr])
"#;
    let run = run_in(dir.path(), &[no_sandbox(), "--allow", "data.txt"], &py(script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let want = serde_json::json!([0, "hello from the project\n", ""]);
    assert_eq!(run.lines(), vec![want.clone(), want], "{}", run.stderr());
    assert_eq!(run.report_u64("socket_clients"), 2, "{}", run.report);
    assert_eq!(run.report_u64("socket_unauthenticated"), 0, "{}", run.report);
    run.assert_no_leaks();
}

/// Under the default sandbox a process that closed descriptor 3 reaches
/// the session through its socket (the only host socket in the minimal
/// view). In the fallback without namespaces (no unix sockets before
/// Landlock ABI 9) the closed descriptor is explained instead: what
/// happened and how to avoid it; and the way it names works.
#[test]
fn under_the_default_sandbox_a_closed_descriptor_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "hi\n").unwrap();
    let script = r#"
import subprocess
r = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, text=True)
out([r.returncode, r.stdout, r.stderr])
r = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, text=True, pass_fds=[3])
out([r.returncode, r.stdout])
"#;
    let run = run_in(dir.path(), &["--allow", "data.txt"], &py(script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let lines = run.lines();
    assert_eq!(lines[0], serde_json::json!([0, "hi\n", ""]), "{}", run.stderr());
    assert_eq!(lines[1], serde_json::json!([0, "hi\n"]));
    assert_eq!(run.report_u64("socket_clients"), 1, "{}", run.report);

    let run =
        run_in_env(dir.path(), &["--allow", "data.txt"], &py(script), &[("AIRLOCK_NO_NAMESPACES", "1")]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let lines = run.lines();
    let first = lines[0].as_array().expect("triple");
    let stderr = first[2].as_str().unwrap_or_default();
    assert_ne!(first[0], 0, "{stderr}");
    assert!(stderr.contains("descriptor 3 (AIRLOCK_FD) is not open: a parent process closed it"), "{stderr}");
    assert!(stderr.contains("pass_fds=[3]"), "{stderr}");
    assert!(!stderr.contains("is this process running under"), "{stderr}");
    assert_eq!(lines[1], serde_json::json!([0, "hi\n"]));
}

/// Without a socket named, the message still says the descriptor was
/// closed, not that airlock is absent.
#[test]
fn a_closed_descriptor_without_a_socket_says_so() {
    let script = r#"exec 3>&-; env -u AIRLOCK_SOCKET "$AIRLOCK" fs cat x"#;
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(dir.path(), &[no_sandbox()], &sh(script));
    assert_ne!(run.code(), Some(0));
    let err = run.stderr();
    assert!(err.contains("a parent process closed it"), "{err}");
    assert!(err.contains("no session socket is named"), "{err}");
}

/// A session that stays up until its stdin closes, having written its
/// socket and secret to `dir/<name>.env`.
struct Live {
    child: Child,
    report: PathBuf,
    socket: String,
    token: String,
}

fn live(dir: &Path, name: &str) -> Live {
    let report = dir.join(format!("{name}-report.json"));
    let env = dir.join(format!("{name}.env"));
    let script = format!(
        "printf '%s\\n%s\\n' \"$AIRLOCK_SOCKET\" \"$AIRLOCK_TOKEN\" > {env}.tmp && mv {env}.tmp {env}; cat >/dev/null",
        env = env.display()
    );
    let child = Command::new(airlock())
        .current_dir(dir)
        .args(["run", "--no-sandbox", "--allow", "."])
        .arg("--report")
        .arg(&report)
        .args(["--", "sh", "-c", &script])
        .env_remove("AIRLOCK_FD")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("airlock runs");
    let start = Instant::now();
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(&env) {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "session {name} never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut lines = text.lines().map(str::to_owned);
    let socket = lines.next().expect("socket line");
    let token = lines.next().expect("token line");
    assert!(!socket.is_empty() && token.len() == 64, "{text:?}");
    Live { child, report, socket, token }
}

impl Live {
    fn end(mut self) -> serde_json::Value {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("airlock exits");
        assert!(status.success(), "{status}");
        let text = std::fs::read_to_string(&self.report).expect("report");
        serde_json::from_str(&text).expect("report is JSON")
    }
}

/// Reads `s` to its end: what came before the session closed it, and how
/// long that took. A read that times out is no close, and fails the test.
fn read_until_closed(s: &mut UnixStream) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        // The session may close with our bytes unread: a reset is a close.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the session did not close the connection ({e}) after {:?}", start.elapsed()),
    }
    (got, start.elapsed())
}

/// What a connection to `path` gets back after sending `first`: nothing at
/// all, by the time the session closes it, which it does at once (a wrong
/// secret needs no timeout).
fn host_attempt(path: &str, first: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(path).expect("the socket accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(first);
    let open = br#"{"id":"o","op":"open","params":{"path":"secret.txt","mode":"r"}}"#;
    let mut framed = (open.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(open);
    let _ = s.write_all(&framed);
    let (got, waited) = read_until_closed(&mut s);
    assert!(waited < Duration::from_secs(3), "closed only after {waited:?}");
    got
}

/// Two live sessions: a process of A that learns B's socket gets nothing
/// from it, neither without a secret nor with A's; nor does a host
/// process. B counts each; with its own secret, A's process reaches B only
/// to prove the socket was live all along.
#[test]
fn another_session_or_the_host_gets_nothing_from_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret.txt"), "b's file\n").unwrap();
    let b = live(dir.path(), "b");
    assert_ne!(std::fs::metadata(&b.socket).map(|m| m.len()).ok(), None);
    let script = format!(
        r#"
import json
b_socket, b_token = {socket:?}, {token:?}
def ask(s):
    # B may close the connection before the request is written.
    try:
        send({{"id": "o", "op": "open", "params": {{"path": "secret.txt", "mode": "r"}}}}, s.fileno())
    except (BrokenPipeError, ConnectionResetError):
        pass
# Without a secret: the first request's bytes are taken for one.
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(b_socket)
ask(s)
out(greeting(s))
# With A's own secret.
s = sconnect(b_socket)
ask(s)
out(greeting(s))
# A's secret is not B's; B's is.
out(os.environ["AIRLOCK_TOKEN"] != b_token)
s = sconnect(b_socket, b_token)
out(greeting(s)["ok"])
"#,
        socket = b.socket,
        token = b.token
    );
    let a = run_in(dir.path(), &[no_sandbox()], &py(&script));
    assert_eq!(a.code(), Some(0), "{}", a.stderr());
    assert_eq!(
        a.lines(),
        [serde_json::Value::Null, serde_json::Value::Null, serde_json::json!(true), serde_json::json!(true)],
        "{}",
        a.stderr()
    );
    assert_eq!(host_attempt(&b.socket, b""), b"", "no secret");
    assert_eq!(host_attempt(&b.socket, &[b'0'; 64]), b"", "a guessed secret");
    let report = b.end();
    assert_eq!(report["socket_unauthenticated"], serde_json::json!(4), "{report}");
    assert_eq!(report["socket_clients"], serde_json::json!(1), "{report}");
    assert_eq!(report["handles_opened"], serde_json::json!(0), "{report}");
}

/// The socket and its private directory exist while the session runs and
/// are gone when it ends.
#[test]
fn the_socket_is_private_and_gone_when_the_session_ends() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let b = live(dir.path(), "s");
    let socket = PathBuf::from(&b.socket);
    let parent = socket.parent().expect("a directory").to_path_buf();
    assert!(std::fs::symlink_metadata(&socket).expect("socket").file_type().is_socket());
    assert_eq!(std::fs::metadata(&parent).expect("dir").permissions().mode() & 0o777, 0o700);
    b.end();
    assert!(!socket.exists() && !parent.exists(), "{} left behind", parent.display());
}

/// A flood of connections through the socket hits `--max-clients` as
/// attaches do, counted together with them.
#[test]
fn a_flood_through_the_socket_hits_the_client_cap() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
held = [attach()]
answers = []
for i in range(12):
    s = sconnect()
    g = greeting(s)
    answers.append(code(g))
    if g["ok"]:
        held.append(s)
    else:
        assert "--max-clients" in g["error"]["message"], g
        s.close()
out(answers)
"#;
    let run = run_in(dir.path(), &[no_sandbox(), "--max-clients", "4"], &py(script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // The child and its attached connection leave room for two.
    let mut want = vec![serde_json::Value::Null; 2];
    want.extend(vec![serde_json::json!("E_RANGE"); 10]);
    assert_eq!(run.lines(), [serde_json::Value::Array(want)], "{}", run.stderr());
    assert_eq!(run.report_u64("socket_clients"), 2);
    assert_eq!(run.report_u64("bounds_refused"), 10);
    run.assert_no_leaks();
}

/// A connection through the socket has the session's policy, no more:
/// outside the roots and writing a read-only root are refused exactly as
/// over the inherited descriptor.
#[test]
fn a_socket_connection_has_exactly_the_sessions_policy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "inside\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "outside\n").unwrap();
    let script = format!(
        r#"
def tries(fd):
    return [code(call("open", fd, id=str(i), path=p, mode=m))
            for i, (p, m) in enumerate([("data.txt", "r"), ("data.txt", "w"), ({secret:?}, "r"), ("/etc/passwd", "r")])]
s = sconnect()
assert greeting(s)["ok"]
out(tries(s.fileno()))
out(tries(attach()[0]))
"#,
        secret = secret.display().to_string()
    );
    let run = run_in(dir.path(), &[no_sandbox(), "--allow", "data.txt"], &py(&script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let lines = run.lines();
    assert_eq!(lines[0], serde_json::json!([null, "E_PERM", "E_PERM", "E_PERM"]), "{}", run.stderr());
    assert_eq!(lines[0], lines[1]);
    run.assert_no_leaks();
}

/// A nested airlock whose descriptor 3 was closed reaches the outer
/// session through the socket; its child gets the inner session's socket,
/// never the outer's, so the inner level's narrower policy holds for it.
#[test]
fn a_nested_airlock_reaches_its_upstream_through_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "shared\n").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "outer only\n").unwrap();
    let inner = r#"exec 3>&-; "$AIRLOCK" fs cat data.txt; "$AIRLOCK" fs cat secret.txt; echo "secret=$?""#;
    let outer = format!(
        r#"exec 3>&-; outer="$AIRLOCK_SOCKET"; "$AIRLOCK" run --no-sandbox --allow data.txt -- sh -c '[ "$AIRLOCK_SOCKET" != "'"$outer"'" ] && echo distinct; {inner}'"#,
    );
    let run = run_in(dir.path(), &[no_sandbox(), "--allow", "."], &sh(&outer));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "distinct\nshared\nsecret=1\n", "{}", run.stderr());
    assert!(run.stderr().contains("secret.txt"), "{}", run.stderr());
    // The inner airlock's own connection came through the socket.
    assert_eq!(run.report_u64("socket_clients"), 1, "{}", run.report);
    run.assert_no_leaks();
}

/// A connection that never sends the secret holds its slot only until the
/// handshake's timeout, then is closed unanswered and counted.
#[test]
fn a_silent_connection_is_closed_at_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let b = live(dir.path(), "q");
    let start = Instant::now();
    let mut s = UnixStream::connect(&b.socket).expect("the socket accepts");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (got, _) = read_until_closed(&mut s);
    let waited = start.elapsed();
    assert!(got.is_empty(), "{got:?}");
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(15), "{waited:?}");
    let report = b.end();
    assert_eq!(report["socket_unauthenticated"], serde_json::json!(1), "{report}");
}

/// Issue 40, narrowing holds: a parent narrows a connection of its own to
/// read-only and starts a child on it with the Python client's
/// environment. The child has the narrowed scope's secret, never the
/// session's; whether it keeps the descriptor, loses it (default
/// `subprocess`) and reconnects through the socket, or connects there by
/// hand with the secret it has, a write is refused. The parent, never
/// narrowed, still writes. Under the default sandbox.
#[test]
fn a_narrowed_child_reconnecting_through_the_socket_stays_narrow() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "before\n").unwrap();
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python").display().to_string();
    // The child: what it was given, then a write and a read three ways.
    let child = format!(
        r#"
import os, sys, json, socket, struct, subprocess
sys.path.insert(0, {client:?})
from airlock_client import Client, AirlockError
res = {{"token_is_session": os.environ["AIRLOCK_TOKEN"] == sys.argv[1]}}
def tries(c):
    got = []
    try:
        c.write_file("data.txt", b"child\n"); got.append("wrote")
    except AirlockError as e:
        got.append(e.code)
    got.append(c.read_file("data.txt").decode())
    return got
res["fd"] = os.environ["AIRLOCK_FD"] != "3" and os.path.exists("/proc/self/fd/" + os.environ["AIRLOCK_FD"])
res["from_env"] = tries(Client.from_env())
res["by_hand"] = tries(Client.from_socket(os.environ["AIRLOCK_SOCKET"], os.environ["AIRLOCK_TOKEN"]))
r = subprocess.run(["sh", "-c", 'echo cli | "$AIRLOCK" fs write data.txt'], capture_output=True, text=True)
res["cli"] = [r.returncode, "E_PERM" in r.stderr or "read-only" in r.stderr]
print(json.dumps(res), flush=True)
"#
    );
    let script = format!(
        r#"
import os, sys, json, subprocess
sys.path.insert(0, {client:?})
from airlock_client import Client
c = Client.from_env()
with c.narrowed([{{"path": os.getcwd(), "access": "r"}}]) as sub:
    env = sub.child_env()
    # Kept: the child's descriptor is the narrowed connection.
    kept = subprocess.run([sys.executable, "-c", {child:?}, os.environ["AIRLOCK_TOKEN"]],
                          pass_fds=[sub.fileno()], env=env, capture_output=True, text=True)
    # Lost: Python's default closes it; the child comes back through the socket.
    lost = subprocess.run([sys.executable, "-c", {child:?}, os.environ["AIRLOCK_TOKEN"]],
                          env=env, capture_output=True, text=True)
for r in (kept, lost):
    print(r.stdout.strip() or json.dumps({{"child_failed": r.stderr}}), flush=True)
c.write_file("data.txt", b"parent\n")
print(json.dumps(c.read_file("data.txt").decode()), flush=True)
"#
    );
    let run = run_in(
        dir.path(),
        &["--sandbox-ro", &client, "--allow-rw", "."],
        &["python3".into(), "-c".into(), script],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let lines = run.lines();
    assert_eq!(lines.len(), 3, "{lines:?} {}", run.stderr());
    for (i, l) in lines[..2].iter().enumerate() {
        assert_eq!(l["token_is_session"], serde_json::json!(false), "child {i}: {l}");
        assert_eq!(l["from_env"], serde_json::json!(["E_PERM", "before\n"]), "child {i}: {l}");
        assert_eq!(l["by_hand"], serde_json::json!(["E_PERM", "before\n"]), "child {i}: {l}");
        assert_eq!(l["cli"][1], serde_json::json!(true), "child {i}: {l}");
        assert_ne!(l["cli"][0], serde_json::json!(0), "child {i}: {l}");
    }
    assert_eq!(lines[0]["fd"], serde_json::json!(true), "{}", lines[0]);
    assert_eq!(lines[1]["fd"], serde_json::json!(false), "{}", lines[1]);
    assert_eq!(lines[2], serde_json::json!("parent\n"), "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(dir.path().join("data.txt")).unwrap(), "parent\n");
    // The lost descriptor's child and every by-hand connection came
    // through the socket with a secret it knew.
    assert!(run.report_u64("socket_clients") >= 3, "{}", run.report);
    assert_eq!(run.report_u64("socket_unauthenticated"), 0, "{}", run.report);
    run.assert_no_leaks();
}

/// The CLI's `airlock narrow`: the command it starts gets the narrowed
/// connection and the narrowed scope's secret, not the session's; with
/// its descriptor closed it comes back through the socket read-only, and
/// the shell that started it still writes. Under the default sandbox.
#[test]
fn the_cli_starts_a_narrowed_command_with_its_own_secret() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "before\n").unwrap();
    let inner = r#"[ "$AIRLOCK_TOKEN" != "$OUTER" ] && echo own-secret; "$AIRLOCK" fs cat data.txt; exec 3>&-; "$AIRLOCK" fs cat data.txt; echo child | "$AIRLOCK" fs write data.txt || echo refused"#;
    let script = format!(
        r#"OUTER="$AIRLOCK_TOKEN"; export OUTER; "$AIRLOCK" narrow --ro . -- sh -c '{inner}'; echo parent | "$AIRLOCK" fs write data.txt && echo parent-wrote"#
    );
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(&script));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stdout(), "own-secret\nbefore\nbefore\nrefused\nparent-wrote\n", "{}", run.stderr());
    assert_eq!(std::fs::read_to_string(dir.path().join("data.txt")).unwrap(), "parent\n");
    assert_eq!(run.report_u64("socket_unauthenticated"), 0, "{}", run.report);
    run.assert_no_leaks();
}
