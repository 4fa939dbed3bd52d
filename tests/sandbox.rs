//! `airlock run`'s sandbox, attacked by real children: direct file access,
//! writes, the network, /proc, ptrace, signals and abstract sockets must
//! all fail, while the proxy keeps working. This kernel has Landlock ABI 7,
//! so nothing here is skipped.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

/// Python that records, for each labelled attempt, "ok" or the errno name.
const PROBE: &str = r#"
import errno, os, socket, subprocess
def probe(label, f):
    try:
        f()
        out([label, "ok"])
    except OSError as e:
        out([label, errno.errorcode.get(e.errno, str(e.errno))])
def read(path):
    with open(path, "rb") as f:
        f.read(1)
def create(path):
    with open(path, "wb") as f:
        f.write(b"x")
"#;

fn probe(script: &str) -> Vec<String> {
    python(&format!("{PROBE}\n{script}"))
}

/// label → outcome, from the child's lines.
fn outcomes(run: &Run) -> std::collections::BTreeMap<String, String> {
    run.lines()
        .into_iter()
        .filter_map(|l| match l {
            Value::Array(v) if v.len() == 2 => Some((v[0].as_str()?.to_owned(), v[1].as_str()?.to_owned())),
            _ => None,
        })
        .collect()
}

fn assert_refused(got: &std::collections::BTreeMap<String, String>, labels: &[&str]) {
    for label in labels {
        let outcome = got.get(*label).unwrap_or_else(|| panic!("no outcome for {label}: {got:?}"));
        // Under the namespaces, a host path, process or socket is not in
        // the child's view at all (ENOENT, ESRCH) or read-only (EROFS); an
        // abstract name the host listens on does not exist in the child's
        // network namespace (ECONNREFUSED).
        assert!(
            ["EACCES", "EPERM", "EXDEV", "ENOENT", "ESRCH", "EROFS", "ECONNREFUSED"]
                .contains(&outcome.as_str()),
            "{label} was not refused: {outcome} (all: {got:?})"
        );
    }
}

struct Files {
    dir: tempfile::TempDir,
    outside: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::fs::write(dir.path().join("root/ok.txt"), "allowed\n").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "outside\n").unwrap();
        let home = tempfile::tempdir_in(std::env::var("HOME").expect("HOME is set")).unwrap();
        std::fs::write(home.path().join("h.txt"), "home\n").unwrap();
        Files { dir, outside, home }
    }

    fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).display().to_string()
    }

    fn untouched(&self) {
        assert_eq!(std::fs::read_to_string(self.dir.path().join("root/ok.txt")).unwrap(), "allowed\n");
        assert_eq!(std::fs::read_to_string(self.outside.path().join("secret.txt")).unwrap(), "outside\n");
        assert_eq!(std::fs::read_to_string(self.home.path().join("h.txt")).unwrap(), "home\n");
        let names = |p: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&self.dir.path().join("root")), ["ok.txt"]);
        assert_eq!(names(self.outside.path()), ["secret.txt"]);
        assert_eq!(names(self.home.path()), ["h.txt"]);
    }
}

#[test]
fn direct_reads_fail_while_the_proxy_serves_the_same_file() {
    let f = Files::new();
    let script = format!(
        r#"
ok, secret, home = {ok:?}, {secret:?}, {home:?}
ppid = os.getppid()
probe("allowed root file", lambda: read(ok))
probe("allowed root listing", lambda: os.listdir(os.path.dirname(ok)))
probe("temp file outside roots", lambda: read(secret))
probe("file under HOME", lambda: read(home))
probe("airlock environ", lambda: read("/proc/%d/environ" % ppid))
probe("airlock mem", lambda: read("/proc/%d/mem" % ppid))
probe("airlock cmdline", lambda: read("/proc/%d/cmdline" % ppid))
probe("/etc/passwd", lambda: read("/etc/passwd"))
probe("/", lambda: os.listdir("/"))
r = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", ok], capture_output=True, pass_fds=(3,))
out(["proxy", r.stdout.decode(), r.returncode])
"#,
        ok = f.path("root/ok.txt"),
        secret = f.outside.path().join("secret.txt").display().to_string(),
        home = f.home.path().join("h.txt").display().to_string(),
    );
    // The root reached directly, as the sandbox alone leaves it: served as
    // a filesystem it is airlock's to answer (tests/fuse.rs).
    let run = run_in(f.dir.path(), &["--allow-rw", "root", "--no-fuse"], &probe(&script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let got = outcomes(&run);
    assert_refused(
        &got,
        &[
            "allowed root file",
            "allowed root listing",
            "temp file outside roots",
            "file under HOME",
            "airlock environ",
            "airlock mem",
            "airlock cmdline",
            "/etc/passwd",
            "/",
        ],
    );
    assert!(run.lines().contains(&json!(["proxy", "allowed\n", 0])), "{:?}", run.lines());
    // The caller's python3 may be a version manager's: its installation
    // is then granted on its own and listed, and nothing else is.
    let mut sandbox = run.report["sandbox"].clone();
    if let Some(granted) = sandbox.as_object_mut().and_then(|o| o.remove("granted")) {
        for g in granted.as_array().unwrap() {
            assert!(g["reason"].as_str().unwrap().contains("the installation of"), "{g}");
            assert!(g.get("direct_read").is_none(), "{g}");
        }
    }
    // The bounds depend on the host's size (tests/confinement_bounds.rs).
    assert!(sandbox.as_object_mut().unwrap().remove("bounds").is_some(), "{sandbox}");
    assert_eq!(
        sandbox,
        json!({"landlock_abi": 7, "fs": "confined", "net": "denied",
               "scoped": ["abstract_unix_socket", "signal"],
               "namespaces": ["user", "pid", "ipc", "net", "uts", "mount"],
               "seccomp": true, "capabilities": "dropped",
               // Asked for: the roots reached through the proxy alone.
               "not_enforced": ["fuse"], "fuse_reason": "--no-fuse"})
    );
    run.assert_no_leaks();
    f.untouched();
}

#[test]
fn writes_outside_fail_by_every_route_and_leave_the_target_untouched() {
    let f = Files::new();
    let script = format!(
        r#"
ok, root, outside, home = {ok:?}, {root:?}, {outside:?}, {home:?}
probe("write root file", lambda: open(ok, "r+b"))
probe("append root file", lambda: open(ok, "ab"))
probe("truncate root file", lambda: os.truncate(ok, 0))
probe("create in root", lambda: create(root + "/new.txt"))
probe("create outside", lambda: create(outside + "/new.txt"))
probe("create under HOME", lambda: create(home + "/new.txt"))
probe("create in cwd", lambda: create("cwd.txt"))
probe("create in /tmp", lambda: create("/tmp/airlock-escape-%d" % os.getpid()))
probe("create in /dev/shm", lambda: create("/dev/shm/airlock-escape-%d" % os.getpid()))
probe("rename in root", lambda: os.rename(ok, root + "/moved.txt"))
probe("hard link out", lambda: os.link(ok, outside + "/linked.txt"))
probe("symlink in root", lambda: os.symlink("/etc/passwd", root + "/sym"))
probe("mkdir in root", lambda: os.mkdir(root + "/d"))
probe("unlink in root", lambda: os.unlink(ok))
probe("fifo in root", lambda: os.mkfifo(root + "/fifo"))
probe("unix socket file", lambda: socket.socket(socket.AF_UNIX).bind(outside + "/sock"))
probe("chmod root file", lambda: os.chmod(ok, 0o777))
probe("devnull", lambda: open("/dev/null", "wb").write(b"swallowed"))
"#,
        ok = f.path("root/ok.txt"),
        root = f.path("root"),
        outside = f.outside.path().display().to_string(),
        home = f.home.path().display().to_string(),
    );
    // The root reached directly, as the sandbox alone leaves it: served as
    // a filesystem it is airlock's to answer (tests/fuse.rs).
    let run = run_in(f.dir.path(), &["--allow-rw", "root", "--no-fuse"], &probe(&script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let got = outcomes(&run);
    assert_refused(
        &got,
        &[
            "write root file",
            "append root file",
            "truncate root file",
            "create in root",
            "create outside",
            "create under HOME",
            "create in cwd",
            "rename in root",
            "hard link out",
            "symlink in root",
            "mkdir in root",
            "unlink in root",
            "fifo in root",
            "unix socket file",
        ],
    );
    // Landlock does not govern metadata (chmod of a file the user owns
    // works in the fallback without namespaces, docs/decisions.md); in the
    // mount view the file is not there to chmod.
    assert_refused(&got, &["chmod root file"]);
    assert_eq!(got["devnull"], "ok", "{got:?}");
    // /tmp and /dev/shm are the child's own, private and size-bounded:
    // nothing lands in the host's.
    assert_eq!((got["create in /tmp"].as_str(), got["create in /dev/shm"].as_str()), ("ok", "ok"));
    for dir in ["/tmp", "/dev/shm"] {
        let leaked = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("airlock-escape-"));
        assert!(!leaked, "a file reached the host's {dir}");
    }
    f.untouched();
    assert!(!f.dir.path().join("cwd.txt").exists());
}

#[test]
fn tcp_is_denied_unless_sandbox_net() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        r#"
def connect():
    s = socket.create_connection(("127.0.0.1", {port}), timeout=5)
    s.sendall(b"hello from the child")
    s.close()
probe("connect", connect)
probe("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
"#
    );
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(dir.path(), &[], &probe(&script));
    let got = outcomes(&run);
    assert_refused(&got, &["connect", "bind"]);

    let run = run_in(dir.path(), &["--sandbox-net"], &probe(&script));
    let got = outcomes(&run);
    assert_eq!((got["connect"].as_str(), got["bind"].as_str()), ("ok", "ok"), "{}", run.stderr());
    assert_eq!(run.report["sandbox"]["net"], "allowed");
    let (mut conn, _) = listener.accept().unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut conn, &mut text).unwrap();
    assert_eq!(text, "hello from the child");
}

#[test]
fn an_older_abi_is_stated_in_the_report_not_hidden() {
    // ABI 3 has no network rules: the connect gets through, and the
    // report says so.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "probe('connect', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=5).close())\n\
         probe('environ', lambda: read('/proc/%d/environ' % os.getppid()))\n"
    );
    let run = run_in(dir.path(), &["--sandbox-abi", "3"], &probe(&script));
    let got = outcomes(&run);
    // Landlock ABI 3 cannot refuse TCP; the private network namespace
    // has no route to the host's listener.
    assert_eq!(got["connect"], "ECONNREFUSED", "{}", run.stderr());
    assert_refused(&got, &["environ"]);
    let s = &run.report["sandbox"];
    assert_eq!(
        (s["landlock_abi"].as_u64(), s["fs"].as_str(), s["net"].as_str()),
        (Some(3), Some("confined"), Some("denied"))
    );
    assert_eq!(s["scoped"], json!([]));
    // What the namespaces close (TCP, UDP, abstract names, signals) is
    // not listed; device ioctls stay open before ABI 5.
    assert_eq!(s["not_enforced"], json!(["ioctl_dev"]));
}

#[test]
fn shells_python_git_and_a_nested_airlock_work_under_the_default_list() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
set -e
echo "sh: $(echo works)"
python3 -c 'import json, subprocess, hashlib; print("python:", json.dumps(hashlib.sha256(b"x").hexdigest()[:8]))'
echo x | GIT_CONFIG_GLOBAL=/dev/null git hash-object --stdin
printf 'b\na\n' | sort | tr '\n' ' ' ; echo
echo "through two levels" | "$AIRLOCK" run --allow-rw . -- sh -c '
  "$AIRLOCK" fs write nested.txt && "$AIRLOCK" fs cat nested.txt
  cat nested.txt 2>/dev/null || echo "inner child: direct read refused"'
"#;
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(
        run.stdout(),
        "sh: works\npython: \"2d711642\"\n587be6b4c3f93f93c489c0111bba5596147a26cb\na b \n\
         through two levels\ninner child: direct read refused\n"
    );
    assert_eq!(std::fs::read_to_string(dir.path().join("nested.txt")).unwrap(), "through two levels\n");
    run.assert_no_leaks();
}

#[test]
fn no_sandbox_restores_direct_host_access() {
    let f = Files::new();
    let secret = f.outside.path().join("secret.txt");
    let target = f.outside.path().join("written.txt");
    let script = format!("cat {} && echo direct > {}", secret.display(), target.display());
    let run = run_in(f.dir.path(), &["--no-sandbox"], &sh(&script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.stdout(), "outside\n");
    assert_eq!(std::fs::read_to_string(target).unwrap(), "direct\n");
    assert_eq!(run.report["sandbox"]["fs"], "unconfined");
    assert_eq!(run.report["sandbox"]["net"], "unconfined");
}

#[test]
fn a_kernel_without_landlock_is_refused_naming_no_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(airlock())
        .current_dir(dir.path())
        .args(["run", "--sandbox-abi", "0", "--", "sh", "-c", "echo must not run"])
        .env_remove("AIRLOCK_FD")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("no Landlock") && err.contains("--no-sandbox"), "{err}");
    assert!(out.stdout.is_empty());

    let run = run_in(dir.path(), &["--sandbox-abi", "0", "--no-sandbox"], &sh("echo unconfined"));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(run.stdout(), "unconfined\n");
    assert_eq!(run.report["sandbox"]["landlock_abi"], 0);
}

#[test]
fn sandbox_ro_grants_reading_and_refuses_overlap_with_a_root() {
    let f = Files::new();
    let outside = f.outside.path().display().to_string();
    let script = format!("cat {outside}/secret.txt; echo x > {outside}/w.txt || echo write refused");
    let run = run_in(f.dir.path(), &["--sandbox-ro", &outside], &sh(&script));
    assert_eq!(run.stdout(), "outside\nwrite refused\n", "stderr: {}", run.stderr());
    f.untouched();

    // A --sandbox-ro over a root (here through a symlink) would let the
    // child read the root directly: refused at start-up.
    std::os::unix::fs::symlink(f.dir.path().join("root"), f.outside.path().join("link")).unwrap();
    for ro in [f.path("root"), f.dir.path().display().to_string(), format!("{outside}/link")] {
        let out = std::process::Command::new(airlock())
            .current_dir(f.dir.path())
            .args(["run", "--allow-rw", "root", "--sandbox-ro", &ro, "--", "true"])
            .env_remove("AIRLOCK_FD")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{ro}: {err}");
        assert!(err.contains("overlaps the allowed root"), "{err}");
    }
}

/// Attacks on airlock itself and on the world outside the sandbox.
#[test]
fn attacks_on_airlock_and_the_outside_fail() {
    let dir = tempfile::tempdir().unwrap();
    let abstract_name = format!("airlock-test-{}", std::process::id());
    let listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    let script = format!(
        r#"
import ctypes, signal
ppid, outside_pid = os.getppid(), {test_pid}
libc = ctypes.CDLL(None, use_errno=True)
def ptrace_attach():
    if libc.ptrace(16, ppid, None, None) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
probe("ptrace airlock", ptrace_attach)
probe("signal airlock", lambda: os.kill(ppid, signal.SIGTERM))
probe("signal 0 airlock", lambda: os.kill(ppid, 0))
probe("signal outside", lambda: os.kill(outside_pid, 0))
probe("abstract socket outside", lambda: socket.socket(socket.AF_UNIX).connect("\0{name}"))
probe("read airlock's fds", lambda: os.listdir("/proc/%d/fd" % ppid))
probe("airlock exe", lambda: read("/proc/%d/exe" % ppid))
probe("own environ", lambda: read("/proc/self/environ"))
# A child may still signal what it started itself.
import subprocess
p = subprocess.Popen(["sleep", "30"])
probe("signal own child", lambda: os.kill(p.pid, signal.SIGTERM))
p.wait()
out(["alive", True])
"#,
        test_pid = std::process::id(),
        name = abstract_name,
    );
    let run = run_in(dir.path(), &[], &probe(&script));
    assert_eq!(run.code(), Some(0), "airlock must survive; stderr: {}", run.stderr());
    let got = outcomes(&run);
    assert_refused(
        &got,
        &[
            "ptrace airlock",
            "signal airlock",
            "signal 0 airlock",
            "signal outside",
            "abstract socket outside",
            "read airlock's fds",
            "airlock exe",
            "own environ",
        ],
    );
    assert_eq!(got["signal own child"], "ok");
    // The same abstract connect unconfined gets through: the refusal above
    // is the sandbox's doing.
    let connect = format!("probe('abstract socket outside', lambda: socket.socket(socket.AF_UNIX).connect('\\0{abstract_name}'))");
    let run = run_in(dir.path(), &["--no-sandbox"], &probe(&connect));
    assert_eq!(outcomes(&run)["abstract socket outside"], "ok", "{}", run.stderr());
    drop(listener);
}

/// The API key is gone from airlock's environment, even from the block
/// `/proc/<pid>/environ` shows: unconfined (and as root, whom
/// non-dumpable does not stop) a child reading it finds no key.
#[test]
fn the_api_key_is_scrubbed_from_airlocks_own_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("airlock.toml"),
        "[broker]\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key_env = \"AIRLOCK_TEST_SCRUB_KEY\"\n",
    )
    .unwrap();
    let script = r#"
env = open("/proc/%d/environ" % os.getppid(), "rb").read()
out(["key in environ", b"sk-scrub-me-0123456789" in env])
out(["name left", b"AIRLOCK_TEST_SCRUB_KEY=" in env])
out(["own env", os.environ.get("AIRLOCK_TEST_SCRUB_KEY")])
"#;
    let out = std::process::Command::new(airlock())
        .current_dir(dir.path())
        .args(["run", "--no-sandbox", "--config", "airlock.toml", "--"])
        .args(python(script))
        .env_remove("AIRLOCK_FD")
        .env("AIRLOCK_TEST_SCRUB_KEY", "sk-scrub-me-0123456789")
        .env("PYTHONPATH", support(""))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.contains(&json!(["key in environ", false])), "{lines:?}");
    assert!(lines.contains(&json!(["own env", null])), "{lines:?}");
}

/// On a terminal: a `/dev/tty` the child opens takes writes but no ioctls
/// (no `TIOCSTI` into the user's shell); the terminal it inherits keeps
/// them (Landlock checks at open; see docs/decisions.md).
#[test]
fn a_dev_tty_the_child_opens_takes_no_ioctls() {
    let child = r#"
import fcntl, termios, os
t = os.open("/dev/tty", os.O_RDWR)
for name, fd in [("opened", t), ("inherited", 0)]:
    try:
        fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
        print(name, "ok")
    except OSError as e:
        print(name, e.errno)
os.write(t, b"written to the tty\n")
"#;
    // The harness puts airlock on a fresh pseudo-terminal and collects it.
    let harness = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "run", "--", "python3", "-c", sys.argv[2]])
out = b""
while True:
    try:
        d = os.read(fd, 1024)
    except OSError:
        break
    if not d:
        break
    out += d
_, status = os.waitpid(pid, 0)
sys.stdout.write(out.decode().replace("\r\n", "\n"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", harness, airlock(), child])
        .env_remove("AIRLOCK_FD")
        // The system python: a version manager's under $HOME is out of the
        // sandbox's reach.
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text, "opened 13\ninherited ok\nwritten to the tty\n");
}

/// A nested airlock is confined too: its `--record` and `--report` go
/// through the outer proxy (and so obey the outer policy), and the trace
/// still replays.
#[test]
fn a_nested_airlock_records_and_reports_through_its_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let inner = r#""$AIRLOCK" run --allow-rw . --record inner.jsonl --report inner.json -- sh -c 'echo x | "$AIRLOCK" fs write v.txt'"#;
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(inner));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(std::fs::read_to_string(dir.path().join("v.txt")).unwrap(), "x\n");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("inner.json")).unwrap()).unwrap();
    assert_eq!(report["upstream"], true);
    assert_eq!(report["sandbox"]["fs"], "confined");
    let replay = std::process::Command::new(airlock())
        .arg("replay")
        .arg(dir.path().join("inner.jsonl"))
        .output()
        .unwrap();
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
    run.assert_no_leaks();

    // Where the outer level does not allow it, the nested one cannot
    // write its report at all: start-up fails, naming the file.
    let run = run_in(dir.path(), &[], &sh(r#""$AIRLOCK" run --report /tmp/nowhere.json -- true"#));
    assert_eq!(run.code(), Some(125), "stderr: {}", run.stderr());
    assert!(run.stderr().contains("creating report /tmp/nowhere.json"), "{}", run.stderr());
}

/// Named unix sockets outside the sandbox (an ssh agent, a container
/// daemon): before Landlock ABI 9 (this kernel has 7) a seccomp filter
/// refuses `socket(AF_UNIX)`, so no connect is possible, while
/// `socketpair` (attach, the child's own pipes) keeps working. Unconfined,
/// the same connect gets through.
#[test]
fn named_unix_sockets_outside_are_out_of_reach() {
    let outside = tempfile::tempdir().unwrap();
    let path = outside.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "probe('connect', lambda: socket.socket(socket.AF_UNIX).connect({p:?}))\n\
         probe('datagram', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'x', {p:?}))\n\
         probe('socketpair', lambda: socket.socketpair())\n\
         import ctypes\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def uring():\n\
         \x20   if libc.syscall(425, 8, ctypes.create_string_buffer(120)) < 0:\n\
         \x20       raise OSError(ctypes.get_errno(), 'io_uring_setup')\n\
         probe('io_uring', uring)\n\
         r = subprocess.run([os.environ['AIRLOCK'], 'fs', 'cat', 'v'], pass_fds=(3,), capture_output=True)\n\
         out(['attach', r.returncode, r.stderr.decode()])\n",
        p = path.display().to_string()
    );
    let run = run_in(dir.path(), &[], &probe(&script));
    let got = outcomes(&run);
    assert_refused(&got, &["connect", "datagram", "io_uring"]);
    assert_eq!(got["socketpair"], "ok", "{got:?}");
    // `fs cat` of a virtual file never written: the attach worked, the
    // proxy answered E_NOENT.
    let attach = run.lines().into_iter().find(|l| l[0] == "attach").unwrap();
    assert!(attach[2].as_str().unwrap().contains("E_NOENT"), "{attach}");
    assert!(!run.report["sandbox"]["not_enforced"]
        .as_array()
        .unwrap()
        .contains(&json!("unix_socket_connect")));

    let run = run_in(dir.path(), &["--no-sandbox"], &probe(&script));
    let got = outcomes(&run);
    assert_eq!((got["connect"].as_str(), got["io_uring"].as_str()), ("ok", "ok"), "{}", run.stderr());
    drop(listener);
}
