//! `airlock toolexec serve` attacked from separate processes: slow and
//! huge heads, bad tokens, connection floods, stalled readers, clients
//! that vanish, tools that ignore SIGTERM or leave grandchildren on the
//! pipe, and SIGTERM to the server. Each attack is a Python script
//! (tests/support/toolexec_attack.py holds the raw-socket client) that
//! asserts on what it saw. python3 is required: its absence fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "attack-token-0123";

struct Server {
    child: Child,
    dir: tempfile::TempDir,
    logs: tempfile::TempDir,
    port: u16,
    urls: Vec<String>,
}

fn airlock() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = tempfile::tempdir().expect("tempdir");
        let log = std::fs::File::create(logs.path().join("stderr")).expect("log file");
        let mut child = Command::new(airlock())
            .args(["toolexec", "serve", "--listen", "127.0.0.1:0", "--tool", "sh", "--tool", "python3"])
            .args(args)
            .current_dir(dir.path())
            // These attacks read the tools' pids and groups on the host:
            // the fallback, without a PID namespace.
            .env("AIRLOCK_NO_NAMESPACES", "1")
            .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("starting airlock toolexec serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut urls = Vec::new();
        let mut lines = BufReader::new(stdout).lines();
        let want = 1 + args.iter().filter(|a| a.starts_with("unix:")).count();
        while urls.len() < want {
            let line = lines.next().expect("a ready line").expect("utf-8 ready line");
            if let Some(url) = line.strip_prefix("AIFO_TOOLEEXEC_URL=") {
                urls.push(url.to_owned());
            }
        }
        let port = urls[0]
            .strip_prefix("http://127.0.0.1:")
            .and_then(|r| r.strip_suffix("/exec"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first URL {}", urls[0]));
        Server { child, dir, logs, port, urls }
    }

    /// What the server logged so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("stderr")).unwrap_or_default()
    }

    fn work(&self) -> &Path {
        self.dir.path()
    }

    /// Run `script` after `from toolexec_attack import *`; it must exit 0.
    fn attack(&self, script: &str) -> String {
        let support = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support");
        let out = Command::new("python3")
            .arg("-c")
            .arg(format!("from toolexec_attack import *\n{script}"))
            .env("PYTHONPATH", support)
            .env("PORT", self.port.to_string())
            .env("TOKEN", TOKEN)
            .env("WORK", self.work())
            .env("SERVER_PID", self.child.id().to_string())
            .output()
            .expect("python3 is required for the toolexec attack tests and was not found");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "attack script failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let end = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < end, "server still running after {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn slow_and_idle_heads_are_closed_by_the_header_timeout() {
    let s = Server::start(&["--header-timeout", "1"]);
    s.attack(
        r#"
import threading
results = {}
def idle():
    c = connect(); t = time.monotonic()
    assert read_all(c, 10) == b""
    results["idle"] = time.monotonic() - t
def drip():
    c = connect(); t = time.monotonic()
    try:
        for b in b"POST /exec HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100:
            c.sendall(bytes([b])); time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    read_all(c, 10)
    results["drip"] = time.monotonic() - t
ts = [threading.Thread(target=f) for f in (idle, drip)]
[t.start() for t in ts]; [t.join() for t in ts]
print(results)
assert 0.8 < results["idle"] < 5, results
assert 0.8 < results["drip"] < 5, results
st, h, body, tr = exchange(request(form("sh", "-c", "echo alive")))
assert (st, body, tr) == (200, b"alive\n", {"X-Exit-Code": "0"}), (st, body, tr)
# A complete head, then a body that drips: refused after the same timeout.
c = connect(); t = time.monotonic()
c.sendall(request(b"", length=100))
for _ in range(10):
    try:
        c.sendall(b"a"); time.sleep(0.3)
    except (BrokenPipeError, ConnectionResetError):
        break
st, h, body, _ = parse(read_all(c, 10))
took = time.monotonic() - t
assert st == 408 and header(h, "X-Exit-Code") == "86", (st, body)
assert 0.8 < took < 5, took
"#,
    );
}

#[test]
fn huge_bodies_are_refused_before_reading_never_truncated() {
    let s = Server::start(&["--max-body", "1000"]);
    s.attack(
        r#"
t = time.monotonic()
st, h, body, _ = exchange(request(b"", length=10**15), timeout=5)
assert st == 413 and header(h, "X-Exit-Code") == "86", (st, h)
assert body == b"toolexec: request body too large: limit 1000 bytes (--max-body)\n", body
assert time.monotonic() - t < 2
# Without a token the same head is 401: auth comes first, the body is never read.
st, h, _, _ = exchange(request(b"", length=10**15, token="nope"), timeout=5)
assert st == 401, st
# Chunked, so no Content-Length: counted while read, refused past the limit.
c = connect()
c.sendall(b"POST /exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() +
          b"\r\nX-Aifo-Proto: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
try:
    for _ in range(20):
        c.sendall(b"100\r\n" + b"arg=xxxx&" * 28 + b"arg=\r\n")
except (BrokenPipeError, ConnectionResetError):
    pass
st, h, body, _ = parse(read_all(c, 5))
assert st == 413, (st, body)
# One byte under the limit works: the limit truncates nothing.
args = "x" * 900
st, _, body, tr = exchange(request(form("sh", "-c", 'printf %s "$0"', args)))
assert (st, body, tr["X-Exit-Code"]) == (200, args.encode(), "0"), (st, body[:50])
"#,
    );
}

#[test]
fn bad_tokens_get_401_first_and_never_spawn() {
    let s = Server::start(&[]);
    s.attack(
        r#"
marker = os.path.join(os.environ["WORK"], "marked")
touch = form("sh", "-c", "touch marked")
bad = [
    request(touch, token=""),
    request(touch, token="attack-token-012"),
    request(touch, token="attack-token-01234"),
    request(touch, token="ATTACK-TOKEN-0123"),
    request(touch, token="x", proto="9"),
    request(form("nope"), token="x"),
    request(touch, extra=b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"),
    request(touch, token="", extra=b"Authorization: Bearer\r\n"),
    request(touch, token="", extra=b"Authorization: " + TOKEN.encode() + b"x\r\n"),
]
for payload in bad:
    st, h, body, _ = exchange(payload)
    assert st == 401, (st, payload, body)
    assert header(h, "WWW-Authenticate") == "Bearer", h
    assert header(h, "X-Exit-Code") == "86", h
    assert body == b"toolexec: unauthorized: missing or invalid token\n", body
assert not os.path.exists(marker), "a request without the token spawned"
# Other schemes carrying the token as their last piece are accepted.
st, _, _, tr = exchange(request(touch, token="", extra=b"Authorization: Token=" + TOKEN.encode() + b"\r\n"))
assert st == 200 and tr == {"X-Exit-Code": "0"}, (st, tr)
assert os.path.exists(marker)
st, _, body, _ = exchange(request(touch, proto="3"))
assert (st, body) == (426, b"Unsupported shim protocol; expected 1 or 2\n"), (st, body)
"#,
    );
}

#[test]
fn two_hundred_clients_never_pass_the_cap() {
    let s = Server::start(&["--max-connections", "8"]);
    s.attack(
        r#"
import threading
script = 'echo s >> log; sleep 0.1; echo e >> log; echo "ok $0"'
bad = []
def client(i):
    try:
        st, _, body, tr = exchange(request(form("sh", "-c", script, str(i))), timeout=120)
        if (st, body, tr) != (200, b"ok %d\n" % i, {"X-Exit-Code": "0"}):
            bad.append((i, st, body, tr))
    except Exception as e:
        bad.append((i, repr(e)))
ts = [threading.Thread(target=client, args=(i,)) for i in range(200)]
[t.start() for t in ts]; [t.join() for t in ts]
assert not bad, bad[:5]
live = peak = 0
for line in open(os.path.join(os.environ["WORK"], "log")):
    live += 1 if line == "s\n" else -1
    peak = max(peak, live)
print("peak", peak)
assert 1 <= peak <= 8, peak
"#,
    );
}

#[test]
fn a_stalled_reader_slows_the_tool_and_loses_no_byte() {
    let s = Server::start(&[]);
    s.attack(
        r#"
import hashlib
size = 50 * 1024 * 1024
gen = ("import sys\nb = bytes(range(256)) * 256\nfor i in range(%d):\n    sys.stdout.buffer.write(b)\n"
       "sys.stdout.flush()\nopen('finished', 'w').close()\n" % (size // len(bytes(range(256)) * 256)))
c = connect()
c.sendall(request(form("python3", "-c", gen)))
time.sleep(3)
# The reader has taken nothing: the tool must be blocked on its pipe and
# the server must hold only its window, not the output.
assert not os.path.exists(os.path.join(os.environ["WORK"], "finished")), "tool ran ahead of a stalled reader"
rss = [l for l in open("/proc/%s/status" % os.environ["SERVER_PID"]) if l.startswith("VmRSS")][0]
rss_kib = int(rss.split()[1])
print("server rss KiB", rss_kib)
assert rss_kib < 40 * 1024, rss
st, h, body, tr = parse(read_all(c, 120))
assert st == 200 and tr == {"X-Exit-Code": "0"}, (st, h, tr)
assert len(body) == size, len(body)
assert hashlib.sha256(body).digest() == hashlib.sha256(bytes(range(256)) * (size // 256)).digest()
"#,
    );
}

#[test]
fn a_client_gone_kills_the_group_at_once() {
    let s = Server::start(&[]);
    s.attack(
        r#"
work = os.environ["WORK"]
def pids():
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            a = int(open(os.path.join(work, "pid")).read()); b = int(open(os.path.join(work, "gc")).read())
            return a, b
        except (FileNotFoundError, ValueError):
            time.sleep(0.02)
    raise AssertionError("tool never started")
for proto, script in [
    ("2", 'sleep 1000 & echo $! > gc; echo $$ > pid; while :; do echo line; sleep 0.01; done'),
    ("1", 'sleep 1000 & echo $! > gc; echo $$ > pid; wait'),
]:
    for f in ("pid", "gc"):
        if os.path.exists(os.path.join(work, f)):
            os.remove(os.path.join(work, f))
    c = connect()
    c.sendall(request(form("sh", "-c", script), proto=proto))
    tool, gc = pids()
    if proto == "2":
        c.settimeout(5)
        assert b"line" in c.recv(4096)
    c.close()
    assert wait_dead(tool, 3), "tool %d survived its client (v%s)" % (tool, proto)
    assert wait_dead(gc, 3), "grandchild %d survived its client (v%s)" % (gc, proto)
"#,
    );
}

#[test]
fn a_tool_ignoring_sigterm_is_killed_after_the_grace() {
    let s = Server::start(&["--timeout", "1", "--kill-grace", "1"]);
    s.attack(
        r#"
script = 'trap "" TERM; echo $$ > pid; echo before; while :; do sleep 0.05; done'
t = time.monotonic()
st, h, body, _ = exchange(request(form("sh", "-c", script), proto="1"))
took = time.monotonic() - t
assert (st, header(h, "X-Exit-Code"), body) == (504, "124", b"before\n"), (st, h, body)
assert 1.8 < took < 6, took
assert wait_dead(int(open(os.path.join(os.environ["WORK"], "pid")).read()), 3)
t = time.monotonic()
st, h, body, tr = exchange(request(form("sh", "-c", script)))
took = time.monotonic() - t
assert (st, body, tr) == (200, b"before\ntoolexec: timed out after 1 s\n", {"X-Exit-Code": "124"}), (st, body, tr)
assert 1.8 < took < 6, took
# v2 with no output before the timeout: nothing sent yet, so 504.
st, h, body, _ = exchange(request(form("sh", "-c", 'trap "" TERM; while :; do sleep 0.05; done')))
assert (st, header(h, "X-Exit-Code"), body) == (504, "124", b""), (st, h, body)
"#,
    );
}

/// Grandchildren on the tool's pipe. One left in the tool's group dies
/// with it. One that left the group (`setsid`) is ended by the
/// confinement stage when the tool ends, so the answer comes at once and
/// nothing outlives it; an unconfined tool (`--no-sandbox`, no stage) can
/// leave one behind, and then the answer still comes, after the drain
/// grace.
#[test]
fn grandchildren_on_the_pipe_do_not_hold_the_answer() {
    let s = Server::start(&["--kill-grace", "2"]);
    s.attack(
        r#"
work = os.environ["WORK"]
t = time.monotonic()
st, _, body, tr = exchange(request(form("sh", "-c", 'sleep 1000 & echo $! > gc; echo hi')))
assert (st, body, tr) == (200, b"hi\n", {"X-Exit-Code": "0"}), (st, body, tr)
assert time.monotonic() - t < 3
assert wait_dead(int(open(os.path.join(work, "gc")).read()), 3), "grandchild outlived the tool"
t = time.monotonic()
st, _, body, tr = exchange(request(form("sh", "-c", 'setsid sleep 1000 & echo $! > esc; sleep 0.5; echo hi'), proto="1"))
took = time.monotonic() - t
assert (st, body) == (200, b"hi\n"), (st, body)
assert took < 2, "the answer waited for the drain grace: %.2f s" % took
assert wait_dead(int(open(os.path.join(work, "esc")).read()), 3), "a setsid grandchild outlived the confined tool"
"#,
    );
    let s = Server::start(&["--kill-grace", "2", "--no-sandbox"]);
    s.attack(
        r#"
work = os.environ["WORK"]
t = time.monotonic()
st, _, body, tr = exchange(request(form("sh", "-c", 'setsid sleep 1000 & echo $! > esc; sleep 0.5; echo hi'), proto="1"))
took = time.monotonic() - t
esc = int(open(os.path.join(work, "esc")).read())
alive = pid_alive(esc)
os.kill(esc, 9)
assert alive, "no escapee: the drain grace went untested"
assert (st, body) == (200, b"hi\n"), (st, body)
assert 2.3 < took < 6.5, took
"#,
    );
}

/// A server stalled (SIGSTOP) across the whole drain grace wakes to an
/// expired timer and a readable pipe at once: what the pipe holds then is
/// still read into the answer, whichever it handles first. Only an
/// unconfined tool can leave a writer behind past its own end (the
/// confinement stage ends a confined tool's, as the test above checks),
/// so this runs with `--no-sandbox`.
#[test]
fn a_server_stalled_past_the_drain_grace_still_reads_the_pipe() {
    let s = Server::start(&["--kill-grace", "1", "--no-sandbox"]);
    s.attack(
        r#"
import signal, threading
work = os.environ["WORK"]
pid = int(os.environ["SERVER_PID"])
def stall():
    time.sleep(0.5)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(2.0)
    os.kill(pid, signal.SIGCONT)
for n in range(3):
    th = threading.Thread(target=stall)
    th.start()
    # The writer has left the group before the tool exits (a group kill
    # would take it), and writes while the server is stopped.
    script = 'setsid sh -c "sleep 1; printf late; exec sleep 5" & echo $! > esc; sleep 0.2; echo hi'
    st, _, body, tr = exchange(request(form("sh", "-c", script), proto="1"))
    th.join()
    os.kill(int(open(os.path.join(work, "esc")).read()), 9)
    assert (st, body) == (200, b"hi\nlate"), (n, st, body)
"#,
    );
}

/// Grandchildren that left the group and flood the pipe cannot keep the
/// answer open. Confined, the stage ends them with the tool. Unconfined
/// (`--no-sandbox`), once the drain grace is over, the read that does not
/// wait ends the answer, with its trailer. (That this read stops after
/// `FINAL_DRAIN` bytes even if the pipe never runs dry is the core's unit
/// test: here the server drains faster than the writers fill.)
#[test]
fn a_flooding_escaped_grandchild_cannot_hold_the_answer_open() {
    for (args, confined) in
        [(&["--kill-grace", "1"][..], true), (&["--kill-grace", "1", "--no-sandbox"][..], false)]
    {
        let s = Server::start(args);
        s.attack(&format!(
            r#"
confined = {}
work = os.environ["WORK"]
c = connect()
# Four writers in a session of their own keep the pipe from ever running dry.
flood = 'setsid sh -c "yes flood & yes flood & yes flood & exec yes flood" & echo $! > esc; sleep 0.3; echo hi'
c.sendall(request(form("sh", "-c", flood)))
c.settimeout(30)
t = time.monotonic()
total, tail = 0, b""
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    total += len(b)
    tail = (tail + b)[-4096:]
took = time.monotonic() - t
esc = int(open(os.path.join(work, "esc")).read())
if confined:
    assert wait_dead(esc, 3), "the flooding grandchild outlived the confined tool"
else:
    # Once the answer ends the server closes the pipe and the writers
    # die of SIGPIPE; any still alive go now.
    try:
        os.killpg(esc, 9)
    except ProcessLookupError:
        pass
assert tail.endswith(b"0\r\nX-Exit-Code: 0\r\n\r\n"), tail[-200:]
if confined:
    assert took < 2, "the answer waited for the drain grace: %.2f s" % took
else:
    # The tool ends at 0.3 s; the writers hold the pipe through the 1 s grace.
    assert 1.2 < took < 6, took
print(total)
"#,
            if confined { "True" } else { "False" }
        ));
    }
}

#[test]
fn sigterm_ends_streams_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("tx.sock");
    let listen = format!("unix:{}", sock.display());
    let mut s = Server::start(&["--listen", &listen]);
    assert_eq!(s.urls[1], format!("unix://{}", sock.display()));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).expect("socket").permissions());
    assert_eq!(mode & 0o777, 0o600);
    s.attack(
        r#"
import signal
c = connect()
c.sendall(request(form("sh", "-c", 'echo $$ > pid; while :; do echo tick; sleep 0.05; done')))
c.settimeout(5)
first = c.recv(4096)
assert b"tick" in first, first
os.kill(int(os.environ["SERVER_PID"]), signal.SIGTERM)
st, h, body, tr = parse(first + read_all(c, 10))
assert st == 200 and tr == {"X-Exit-Code": "143"}, (st, tr)
assert wait_dead(int(open(os.path.join(os.environ["WORK"], "pid")).read()), 3)
"#,
    );
    let status = s.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "unix socket left behind");
}

#[test]
fn buffered_output_past_the_limit_is_507() {
    let s = Server::start(&["--max-buffered", "100000"]);
    s.attack(
        r#"
st, h, body, _ = exchange(request(form("sh", "-c", 'head -c 1000000 /dev/zero; echo $$ > pid; sleep 1000'), proto="1"))
assert (st, header(h, "X-Exit-Code")) == (507, "86"), (st, h)
assert body.startswith(b"toolexec: output exceeds 100000 bytes"), body
# v2 without TE: trailers is answered buffered, so the same limit holds.
st, _, _, _ = exchange(request(form("sh", "-c", 'head -c 1000000 /dev/zero'), te=False))
assert st == 507, st
# Streaming has no such limit.
st, _, body, tr = exchange(request(form("sh", "-c", 'head -c 1000000 /dev/zero')))
assert (st, len(body), tr) == (200, 1000000, {"X-Exit-Code": "0"}), (st, len(body), tr)
"#,
    );
}

#[test]
fn hostile_forms_and_paths() {
    let s = Server::start(&["--tool", "gone=/nonexistent/tool", "--tool", "noexec=/etc/passwd"]);
    std::os::unix::fs::symlink("/", s.work().join("up")).expect("symlink");
    std::fs::create_dir(s.work().join("sub")).expect("mkdir");
    s.attack(
        r#"
cases = [
    (b"tool=sh&tool=sh", 400), (b"tool=sh&arg=a%00b", 400), (b"tool=sh&arg=%zz", 400),
    (b"arg=x", 400), (b"tool=sh&cwd=a&cwd=b", 400), (b"tool=sh&cwd=../..", 400),
    (b"tool=sh&cwd=/etc", 400), (b"tool=sh&cwd=up", 400), (b"tool=sh&cwd=missing", 400),
    (b"tool=rm", 403), (b"tool=%2Fbin%2Fsh", 403), (b"tool=gone", 409), (b"tool=noexec", 500),
]
for body, want in cases:
    st, h, out, _ = exchange(request(body, proto="1"))
    assert st == want, (body, st, out)
    assert out.startswith(b"toolexec: ") and out.count(b"\n") == 1 and out.endswith(b"\n"), out
    assert header(h, "X-Exit-Code") == "86", h
st, _, out, _ = exchange(request(form("sh", "-c", 'pwd; printf "%s|" "$@"', "x", "a b", "", "$HOME", "*", cwd="sub"), proto="1"))
assert (st, out) == (200, (os.path.realpath(os.environ["WORK"]) + "/sub\na b||$HOME|*|").encode()), out
st, _, out, _ = exchange(request(form("sh", "-c", "env; cat; echo stdin-closed"), proto="1"), timeout=5)
assert st == 200 and out.endswith(b"stdin-closed\n"), out
assert TOKEN.encode() not in out and b"AIFO_TOOLEEXEC_TOKEN" not in out, "the token reached the tool"
for method, path, want in [(b"GET", b"/exec", 405), (b"POST", b"/other", 404)]:
    st, _, _, _ = exchange(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert st == want, (method, path, st)
"#,
    );
}

#[test]
fn unusable_tokens_and_remote_listens_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    for (env, extra) in [
        (Some("a b"), vec![]),
        (Some("a=b"), vec![]),
        (None, vec!["--token-file".to_owned(), empty.display().to_string()]),
    ] {
        let mut cmd = Command::new(airlock());
        cmd.args(["toolexec", "serve", "--tool", "sh"]).args(&extra).current_dir(dir.path());
        match env {
            Some(v) => cmd.env("AIFO_TOOLEEXEC_TOKEN", v),
            None => cmd.env_remove("AIFO_TOOLEEXEC_TOKEN"),
        };
        let out = cmd.output().expect("run airlock");
        assert_eq!(out.status.code(), Some(125), "{env:?} {extra:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("unusable token"));
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(airlock())
        .args(["toolexec", "serve", "--tool", "sh", "--listen", "0.0.0.0:0"])
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .current_dir(dir.path())
        .output()
        .expect("run airlock");
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"), "{out:?}");
}

/// The probe a tool runs: a write outside the working directory, one
/// inside, and a TCP connect back to the server.
const CONFINEMENT_PROBE: &str = r#"
import os, socket
def attempt(label, f):
    try:
        f(); print(label, "ok")
    except OSError as e:
        print(label, type(e).__name__)
attempt("outside", lambda: open("/tmp/toolexec-escape-%d" % os.getpid(), "w").close())
attempt("inside", lambda: open("inside", "w").close())
attempt("net", lambda: socket.create_connection(("127.0.0.1", int(os.environ["PORT"])), timeout=2).close())
"#;

fn probe_confinement(s: &Server) -> String {
    s.attack(&format!(
        "st, _, body, tr = exchange(request(form('python3', '-c', {CONFINEMENT_PROBE:?}.replace('os.environ[\"PORT\"]', str(PORT)))))\n\
         assert st == 200, (st, body)\nprint(body.decode(), end='')"
    ))
}

#[test]
fn tools_are_confined_unless_told_otherwise() {
    let s = Server::start(&[]);
    assert!(s.stderr().contains("sandbox: Landlock ABI"), "{}", s.stderr());
    assert!(s.stderr().contains("network denied"), "{}", s.stderr());
    assert_eq!(probe_confinement(&s), "outside PermissionError\ninside ok\nnet PermissionError\n");
    let s = Server::start(&["--tool-net"]);
    assert!(s.stderr().contains("network allowed"), "{}", s.stderr());
    assert_eq!(probe_confinement(&s), "outside PermissionError\ninside ok\nnet ok\n");
    let s = Server::start(&["--no-sandbox"]);
    assert!(s.stderr().contains("sandbox: none (--no-sandbox)"), "{}", s.stderr());
    let out = probe_confinement(&s);
    assert!(out.starts_with("outside ok\n") && out.ends_with("net ok\n"), "{out}");
    for leftover in std::fs::read_dir("/tmp").expect("/tmp").flatten() {
        if leftover.file_name().to_string_lossy().starts_with("toolexec-escape-") {
            let _ = std::fs::remove_file(leftover.path());
        }
    }
}

#[test]
fn sigterm_does_not_wait_for_a_stalled_reader() {
    let mut s = Server::start(&["--kill-grace", "1"]);
    s.attack(
        r#"
import signal
c = connect()
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
c.sendall(request(form("sh", "-c", 'echo $$ > pid; exec head -c 100000000 /dev/zero')))
time.sleep(1)
os.kill(int(os.environ["SERVER_PID"]), signal.SIGTERM)
# The client never reads and keeps the connection open: the server must
# still be gone within 2 x grace + 1 s (plus slack for a loaded machine),
# not wait for it.
assert wait_dead(int(os.environ["SERVER_PID"]), 10), "server waited for a stalled reader"
c.close()
"#,
    );
    // Killed tool, drain, then at most 2 x grace + 1 s for the stalled one.
    let status = s.wait_exit(Duration::from_secs(1));
    assert_eq!(status.code(), Some(0));
    assert!(s.stderr().contains("closing them"), "{}", s.stderr());
}
