//! Bounded resources against the real binary (issue 7, items 6–9 and 11):
//! each attack runs in a separate Python process, and while it holds what
//! it built, the test reads airlock's resident memory and descriptor count
//! from /proc; afterwards a plain file operation must still work.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Resident memory of `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for {pid}: {status}"));
    kb / 1024
}

/// `airlock run ARGS -- python3 -c SCRIPT`, its stdout read line by line
/// while it runs; stdin is a pipe the test holds.
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: BufReader<ChildStdout>,
    report: std::path::PathBuf,
}

impl Live {
    fn start(dir: &Path, args: &[&str], script: &str) -> Live {
        let report = dir.join("report.json");
        let mut child = Command::new(airlock())
            .current_dir(dir)
            .arg("run")
            // The tests' Python client library, read directly by the child.
            .arg("--sandbox-ro")
            .arg(support(""))
            .args(args)
            .arg("--report")
            .arg(&report)
            .arg("--")
            .args(python(script))
            .env_remove("AIRLOCK_FD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("airlock runs");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Live { child, stdin, lines, report }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> Value {
        let mut l = String::new();
        self.lines.read_line(&mut l).expect("a line");
        assert!(!l.is_empty(), "the child ended early");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))
    }

    /// Wait for the exit; the rest of stdout and the report.
    fn finish(mut self) -> (Option<i32>, Vec<Value>, Value) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "airlock did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest: Vec<Value> =
            self.lines.lines().map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
        let report = serde_json::from_str(&std::fs::read_to_string(&self.report).unwrap()).unwrap();
        (status.code(), rest, report)
    }
}

/// The child's last act in every attack: a host file written and read
/// back through fd 3.
const STILL_WORKS: &str = r#"
h = call("open", path="host/after.txt", mode="w")["result"]["handle"]
call("write", h=h, data=b64(b"still works"))
call("close", h=h)
h = call("open", path="host/after.txt", mode="r")["result"]["handle"]
out({"after": base64.b64decode(call("read", h=h, max=100)["result"]["data"]).decode()})
"#;

fn attack(args: &[&str], script: &str, max_rss_mib: u64, max_fds: u64) -> (Vec<Value>, Value) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("host")).unwrap();
    let mut allow = vec!["--allow-rw", "host"];
    allow.extend_from_slice(args);
    let script = format!("import base64, json, os, select, socket, struct, time\n{script}\nout('ready')\ntime.sleep(1.5)\n{STILL_WORKS}");
    let mut live = Live::start(dir.path(), &allow, &script);
    let mut first = Vec::new();
    loop {
        let l = live.line();
        if l == json!("ready") {
            break;
        }
        first.push(l);
    }
    let pid = live.pid();
    let (rss, fds) = (rss_mib(pid), descriptors(pid));
    assert!(rss <= max_rss_mib, "airlock holds {rss} MiB under attack: {first:?}");
    assert!(fds <= max_fds, "airlock holds {fds} descriptors under attack: {first:?}");
    let (code, rest, report) = live.finish();
    assert_eq!(code, Some(0), "{first:?} {rest:?} {report}");
    assert_eq!(rest.last(), Some(&json!({"after": "still works"})), "{rest:?}");
    assert_eq!(report["handles_leaked"], 0, "{report}");
    first.extend(rest);
    (first, report)
}

/// Item 7: 1,100 attaches, each connection then holding part of a 1 MiB
/// frame. At most `--max-clients` are served and host opens still work.
/// (Partial frames past `--max-buffered-bytes` in all end their
/// connection: a core unit test shows it.)
#[test]
fn an_attach_flood_holding_partial_frames_is_bounded() {
    let script = r#"
shared = socket.socket(fileno=os.dup(3))
kept, refused = [], 0
partial = struct.pack(">I", 1 << 20) + b" " * 200_000
for i in range(1100):
    ours, theirs = socket.socketpair()
    req = json.dumps({"id": "a%d" % i, "op": "attach"}).encode()
    socket.send_fds(shared, [struct.pack(">I", len(req)) + req], [theirs.fileno()])
    theirs.close()
    try:
        # Served: the answer comes on the new connection.
        assert recv(ours.fileno())["ok"]
    except EOFError:
        # Refused: its socket is closed, the answer comes on fd 3.
        resp = recv(3)
        assert resp["error"]["code"] == "E_RANGE" and "--max-clients" in resp["error"]["message"], resp
        refused += 1
        ours.close()
        continue
    try:
        ours.sendall(partial)
    except OSError:
        pass
    kept.append(ours)
out({"kept": len(kept), "refused": refused})
"#;
    let (lines, report) = attack(&[], script, 120, 200);
    assert_eq!(lines[0]["kept"], 63, "{lines:?}");
    assert_eq!(lines[0]["refused"], 1100 - 63);
    assert!(report["bounds_refused"].as_u64().unwrap() >= 1037, "{report}");
}

/// Item 7: datagram sockets passed with attach are closed on arrival, so
/// they never fill airlock's descriptor table.
#[test]
fn udp_sockets_passed_by_attach_are_refused_and_closed() {
    let script = r#"
shared = socket.socket(fileno=os.dup(3))
codes = {}
for i in range(1500):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    req = json.dumps({"id": "u%d" % i, "op": "attach"}).encode()
    socket.send_fds(shared, [struct.pack(">I", len(req)) + req], [u.fileno()])
    u.close()
    c = recv(3)["error"]["code"]
    codes[c] = codes.get(c, 0) + 1
out(codes)
"#;
    let (lines, _) = attack(&[], script, 60, 64);
    assert_eq!(lines[0], json!({"E_ARG": 1500}));
}

/// Item 6: 34 QUOTA frames of 1 MiB queued behind a read of stdin that
/// waits: all but the first few are refused at once, naming the bound.
#[test]
fn queued_big_frames_are_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import json, struct, time
send({"id": "stdin", "op": "read", "params": {"h": 0, "max": 1}})
pad = "x" * ((1 << 20) - 100)
for i in range(34):
    send({"id": "q%d" % i, "op": "QUOTA", "params": {"pad": pad}})
refused = []
while len(refused) < 30:
    r = recv()
    refused.append(r["id"])
    assert r["error"]["code"] == "E_RANGE" and "--max-queued-bytes" in r["error"]["message"], r
out({"refused": len(refused)})
out("ready")
rest = [recv() for _ in range(5)]
out(sorted(r["id"] for r in rest))
"#;
    let mut live = Live::start(dir.path(), &[], script);
    assert_eq!(live.line(), json!({"refused": 30}));
    assert_eq!(live.line(), json!("ready"));
    let pid = live.pid();
    let rss = rss_mib(pid);
    assert!(rss <= 120, "airlock holds {rss} MiB with 34 MiB sent");
    // Stdin gives a byte: the read is answered, then the queued QUOTAs.
    live.stdin.as_mut().unwrap().write_all(b"!").unwrap();
    live.stdin.as_mut().unwrap().flush().unwrap();
    let answered = live.line();
    assert_eq!(answered, json!(["q0", "q1", "q2", "q3", "stdin"]), "{answered}");
    let (code, _, report) = live.finish();
    assert_eq!(code, Some(0));
    assert_eq!(report["bounds_refused"], 30, "{report}");
}

/// Item 9: virtual files whose names are 1 MiB each: names count against
/// `--max-virtual-bytes`, so only so many are made.
#[test]
fn huge_virtual_names_count_against_the_limit() {
    let script = r#"
made, codes = 0, {}
for i in range(560):
    r = call("open", path="n%d-" % i + "n" * ((1 << 20) - 200), mode="w")
    if r["ok"]:
        made += 1
        call("close", h=r["result"]["handle"])
    else:
        codes[r["error"]["code"]] = codes.get(r["error"]["code"], 0) + 1
        assert "--max-virtual-bytes" in r["error"]["message"], r
out({"made": made, "codes": codes})
"#;
    let (lines, _) = attack(&[], script, 200, 64);
    assert_eq!(lines[0], json!({"made": 64, "codes": {"E_RANGE": 496}}));
    let (lines, _) = attack(
        &["--max-virtual-files", "10"],
        &script.replace("--max-virtual-bytes", "--max-virtual-files"),
        60,
        64,
    );
    assert_eq!(lines[0], json!({"made": 10, "codes": {"E_RANGE": 550}}));
}

fn python_process(dir: &Path, script: &str) -> std::process::Output {
    let prelude = format!(
        "import sys; sys.path.insert(0, {:?})\nfrom fsclient import *\nAIRLOCK_BIN = {:?}\nSUPPORT_DIR = {:?}\n",
        support("").display().to_string(),
        airlock(),
        support("").display().to_string()
    );
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(format!("{prelude}{script}")).current_dir(dir).env_remove("AIRLOCK_FD");
    output_within(cmd, Duration::from_secs(90))
}

fn output_within(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("timed out");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Item 8: both ends of one socketpair attached to `airlock serve`. Its
/// answers loop back as frames that are responses: none is answered, the
/// loop costs no CPU, and serve exits when its client leaves.
#[test]
fn a_self_loop_costs_nothing_and_serve_exits_with_its_client() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let script = format!(
        r#"
import json, os, socket, struct, subprocess, time
ours, theirs = socket.socketpair()
p = subprocess.Popen([AIRLOCK_BIN, "serve", "--fd", str(theirs.fileno()), "--allow-rw", ".", "--report", {report:?}],
                     pass_fds=[theirs.fileno()])
theirs.close()
a, b = socket.socketpair()
for i, s in enumerate([a, b]):
    req = json.dumps({{"id": "loop%d" % i, "op": "attach"}}).encode()
    socket.send_fds(ours, [struct.pack(">I", len(req)) + req], [s.fileno()])
a.close(); b.close()
h = call("open", fd=ours.fileno(), path="x.txt", mode="w")["result"]["handle"]
def ticks():
    f = open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
t0 = ticks()
time.sleep(2)
out({{"cpu_ticks": ticks() - t0}})
ours.close()
start = time.time()
out({{"exit": p.wait(timeout=20), "within": time.time() - start < 10}})
"#,
        report = report.display().to_string()
    );
    let output = python_process(dir.path(), &script);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // 100 ticks a second: a loop would take nearly 200.
    assert!(lines[0]["cpu_ticks"].as_u64().unwrap() <= 20, "{lines:?}");
    assert_eq!(lines[1], json!({"exit": 0, "within": true}));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    assert_eq!(report["responses_ignored"], 2, "{report}");
    assert_eq!(report["handles_leaked"], 0);
}

/// Item 11: a nested airlock whose upstream answers with frames over
/// 1 MiB. One of 1.5 MiB passes (the upstream limit is larger than the
/// children's); one over `--max-upstream-frame` fails its one request;
/// the link stays up and the next file operation works.
#[test]
fn an_oversized_upstream_answer_fails_one_request_not_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let grandchild = r#"
import base64
out({"q1": len(json.dumps(call("QUOTA")))})
r = call("QUOTA")
out({"q2": r["error"]["code"], "named": "--max-upstream-frame" in r["error"]["message"]})
h = call("open", path=os.path.join(os.getcwd(), "after.txt"), mode="w")["result"]["handle"]
out({"write": call("write", h=h, data=b64(b"ok"))["ok"], "close": call("close", h=h)["ok"]})
"#;
    let script = format!(
        r#"
import json, os, socket, struct, subprocess, time
top, theirs = socket.socketpair()
env = dict(os.environ, AIRLOCK_FD=str(theirs.fileno()))
gc = "import sys, json; sys.path.insert(0, %r)\nfrom fsclient import *\n" % SUPPORT_DIR + {grandchild:?}
# The confined grandchild reads this python's own install and the client
# library directly.
p = subprocess.Popen([AIRLOCK_BIN, "run", "--allow-rw", os.getcwd(), "--max-upstream-frame", "2000000",
                      "--sandbox-ro", sys.prefix, "--sandbox-ro", SUPPORT_DIR, "--", "python3", "-c", gc],
                     pass_fds=[theirs.fileno()], env=env, stdout=subprocess.PIPE)
theirs.close()
# The nested airlock attaches a connection of its own, then narrows it.
msg, fds, _, _ = socket.recv_fds(top, 65536, 4)
conn = socket.socket(fileno=fds[0])
fd = conn.fileno()
def answer(payload):
    data = json.dumps(payload).encode()
    conn.sendall(struct.pack(">I", len(data)) + data)
answer({{"id": json.loads(msg[4:])["id"], "ok": True}})
req = recv(fd)
assert req["op"] == "narrow", req
answer({{"id": req["id"], "ok": True, "result": {{}}}})
seen = []
for reply in [1_500_000, 3_000_000, None, None, None]:
    req = recv(fd)
    seen.append(req["op"])
    if reply:
        answer({{"id": req["id"], "ok": True, "result": {{"text": "t" * reply}}}})
    elif req["op"] == "open":
        answer({{"id": req["id"], "ok": True, "result": {{"handle": 9}}}})
    elif req["op"] == "write":
        answer({{"id": req["id"], "ok": True, "result": {{"written": 2}}}})
    else:
        answer({{"id": req["id"], "ok": True}})
child_out, _ = p.communicate(timeout=60)
for line in child_out.decode().splitlines():
    print(line)
out({{"seen": seen, "exit": p.returncode}})
"#
    );
    let mut cmd = Command::new("python3");
    let prelude = format!(
        "import sys; sys.path.insert(0, {:?})\nfrom fsclient import *\nAIRLOCK_BIN = {:?}\nSUPPORT_DIR = {:?}\n",
        support("").display().to_string(),
        airlock(),
        support("").display().to_string()
    );
    cmd.arg("-c").arg(format!("{prelude}{script}")).current_dir(dir.path()).env("SUPPORT", support(""));
    let output = output_within(cmd, Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines[0]["q1"].as_u64().unwrap() > 1_500_000, "{lines:?}");
    assert_eq!(lines[1], json!({"q2": "E_RANGE", "named": true}));
    assert_eq!(lines[2], json!({"write": true, "close": true}));
    assert_eq!(lines[3], json!({"seen": ["QUOTA", "QUOTA", "open", "write", "close"], "exit": 0}));
}
