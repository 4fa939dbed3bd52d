//! ToolExec over HTTP, end to end: the real `airlock toolexec serve`, real
//! tools (small sh/python scripts), and three real clients: curl, the POSIX
//! shim `write-shims` writes, and the Rust `toolexec shim`.
//!
//! Nothing here skips: a missing curl or python3 fails with a message.

use std::collections::BTreeMap;
use std::fs;
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TOKEN: &str = "s3cr3t-token-for-tests";
const UNSUPPORTED: &str = "Unsupported shim protocol; expected 1 or 2\n";

fn airlock() -> &'static str {
    env!("CARGO_BIN_EXE_airlock")
}

/// A program the tests cannot do without; its absence is a failure.
fn need(program: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(found, "{program} is not installed: the ToolExec tests need it (apt-get install {program})");
}

/// A temporary working directory holding the tools, the shims and the data.
struct Work {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Work {
    fn new() -> Work {
        need("curl");
        need("python3");
        let tmp = tempfile::tempdir().unwrap();
        let dir = fs::canonicalize(tmp.path()).unwrap().join("work");
        fs::create_dir_all(dir.join("tools")).unwrap();
        Work { _tmp: tmp, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// An sh tool; the `--tool NAME=PATH` that allows it.
    fn tool(&self, name: &str, body: &str) -> String {
        self.script(name, &format!("#!/bin/sh\n{body}\n"))
    }

    fn script(&self, name: &str, text: &str) -> String {
        let p = self.dir.join("tools").join(name);
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        format!("{name}={}", p.display())
    }

    /// `write-shims` into `shims/` (POSIX) and `rshims/` (Rust links).
    fn shims(&self, tools: &[&str]) {
        for (dir, client) in [("shims", "posix"), ("rshims", "rust")] {
            let mut cmd = Command::new(airlock());
            cmd.args(["toolexec", "write-shims"]).arg(self.dir.join(dir)).args(["--client", client]);
            for t in tools {
                cmd.args(["--tool", t]);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "write-shims: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

/// A running `airlock toolexec serve`, stopped with SIGTERM on drop.
struct Server {
    child: Option<Child>,
    urls: Vec<String>,
    stdout_rest: mpsc::Receiver<String>,
    /// Every stdout line read while waiting for the URLs.
    lines: Vec<String>,
    stderr: PathBuf,
}

impl Server {
    fn start(work: &Work, args: &[&str]) -> Server {
        Self::start_env(work, args, true, &[])
    }

    fn start_env(work: &Work, args: &[&str], token_file: bool, env: &[(&str, &str)]) -> Server {
        let listeners = args.iter().filter(|a| **a == "--listen").count().max(1);
        let stderr = work.path(&format!("server-{}.err", unique()));
        let mut cmd = Command::new(airlock());
        cmd.args(["toolexec", "serve"]).current_dir(&work.dir).env_remove("AIFO_TOOLEEXEC_TOKEN");
        if token_file {
            let tf = work.path("token");
            fs::write(&tf, format!("{TOKEN}\n")).unwrap();
            cmd.arg("--token-file").arg(&tf);
        }
        cmd.args(args).envs(env.iter().copied());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut urls = Vec::new();
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while urls.len() < listeners {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(u) = line.strip_prefix("AIFO_TOOLEEXEC_URL=") {
                        urls.push(u.to_string());
                    }
                    lines.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "server did not print {listeners} AIFO_TOOLEEXEC_URL line(s); got {urls:?}; stderr:\n{}",
                        fs::read_to_string(&stderr).unwrap_or_default()
                    );
                }
            }
        }
        Server { child: Some(child), urls, stdout_rest: rx, lines, stderr }
    }

    fn url(&self) -> &str {
        &self.urls[0]
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    fn addr(&self) -> String {
        let rest = self.url().strip_prefix("http://").expect("a TCP url");
        rest.split('/').next().unwrap().to_string()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then the exit status (SIGKILL after 15 s).
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let st = child.wait().unwrap();
                panic!("server ignored SIGTERM for 15 s ({st:?}); stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id() as i32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned; no memory is involved.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// One response as curl saw it.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    trailers: Vec<(String, String)>,
    body: Vec<u8>,
    elapsed: Duration,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn trailer(&self, name: &str) -> Option<&str> {
        self.trailers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// An error answer: one `toolexec: ...` line and `X-Exit-Code: 86`.
    fn assert_refusal(&self, status: u16) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("X-Exit-Code"), Some("86"), "{self:?}");
        let t = self.text();
        assert!(t.starts_with("toolexec: ") && t.ends_with('\n') && t.lines().count() == 1, "body {t:?}");
    }
}

/// A request through curl. `proto` None sends no `X-Aifo-Proto`.
struct Req<'a> {
    url: String,
    method: &'a str,
    token: Option<&'a str>,
    auth: Option<String>,
    proto: Option<&'a str>,
    te: bool,
    form: Vec<(&'a str, String)>,
    raw_body: Option<Vec<u8>>,
    extra: Vec<String>,
    unix: Option<PathBuf>,
}

impl<'a> Req<'a> {
    fn new(server: &Server, tool: &str) -> Req<'a> {
        Req {
            url: server.url().to_string(),
            method: "POST",
            token: Some(TOKEN),
            auth: None,
            proto: Some("2"),
            te: true,
            form: vec![("tool", tool.to_string())],
            raw_body: None,
            extra: Vec::new(),
            unix: None,
        }
    }
    fn proto(mut self, p: Option<&'a str>) -> Self {
        self.proto = p;
        self
    }
    fn v1(self) -> Self {
        self.proto(Some("1"))
    }
    fn te(mut self, te: bool) -> Self {
        self.te = te;
        self
    }
    fn arg(mut self, a: &str) -> Self {
        self.form.push(("arg", a.to_string()));
        self
    }
    fn send(self) -> Resp {
        let id = unique();
        let tmp = std::env::temp_dir().join(format!("toolexec-test-{}-{id}", std::process::id()));
        fs::create_dir_all(&tmp).unwrap();
        let (h, b) = (tmp.join("h"), tmp.join("b"));
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "60", "-D"]).arg(&h).arg("-o").arg(&b);
        cmd.args(["-X", self.method]);
        if let Some(a) = &self.auth {
            cmd.args(["-H", &format!("Authorization: {a}")]);
        } else if let Some(t) = self.token {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        if let Some(p) = self.proto {
            cmd.args(["-H", &format!("X-Aifo-Proto: {p}")]);
        }
        if self.te {
            cmd.args(["-H", "TE: trailers"]);
        }
        if let Some(raw) = &self.raw_body {
            let f = tmp.join("body");
            fs::write(&f, raw).unwrap();
            cmd.arg("--data-binary").arg(format!("@{}", f.display()));
        } else if self.method == "POST" {
            for (k, v) in &self.form {
                cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
            }
        }
        cmd.args(&self.extra);
        if let Some(s) = &self.unix {
            cmd.arg("--unix-socket").arg(s);
        }
        cmd.arg(&self.url);
        let start = Instant::now();
        let out = cmd.output().unwrap();
        let elapsed = start.elapsed();
        assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
        let head = fs::read(&h).unwrap();
        let body = fs::read(&b).unwrap_or_default();
        let _ = fs::remove_dir_all(&tmp);
        let text = String::from_utf8_lossy(&head).into_owned();
        // curl appends trailers to the header file after the blank line.
        let (top, tail) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = top.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let kv = |l: &str| l.split_once(':').map(|(k, v)| (k.to_string(), v.trim().to_string()));
        let headers = lines.filter_map(kv).collect();
        let trailers = tail.split("\r\n").filter_map(kv).collect();
        Resp { status, headers, trailers, body, elapsed }
    }
}

/// A raw HTTP exchange over TCP: write `req`, read until EOF (or `limit`).
fn raw(addr: &str, req: &[u8], limit: Duration) -> (Vec<u8>, Duration) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    let start = Instant::now();
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("no EOF within {limit:?} ({e}); got {:?}", String::from_utf8_lossy(&got)),
        }
    }
    (got, start.elapsed())
}

fn form(fields: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        s.append_pair(k, v);
    }
    s.finish()
}

fn request(host: &str, auth: &str, proto: &str, te: bool, body: &str) -> Vec<u8> {
    let mut r = format!("POST /exec HTTP/1.1\r\nHost: {host}\r\n");
    if !auth.is_empty() {
        r.push_str(&format!("Authorization: {auth}\r\n"));
    }
    if !proto.is_empty() {
        r.push_str(&format!("X-Aifo-Proto: {proto}\r\n"));
    }
    if te {
        r.push_str("TE: trailers\r\n");
    }
    r.push_str(&format!(
        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    r.into_bytes()
}

/// Run a shim (a path in shims/ or rshims/) in `cwd` against `url`.
fn shim(work: &Work, url: &str, program: &Path, args: &[&str], cwd: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env("AIFO_TOOLEEXEC_URL", url)
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .env("TMPDIR", &work.dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn spawn_shim(url: &str, program: &Path, args: &[&str], cwd: &Path) -> Child {
    Command::new(program)
        .args(args)
        .current_dir(cwd)
        .env("AIFO_TOOLEEXEC_URL", url)
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_pid(p: &Path) -> i32 {
    let mut pid = None;
    wait_for(&format!("pid file {}", p.display()), Duration::from_secs(10), || {
        pid = fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap()
}

/// Live (non-zombie) processes whose process group is `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 && f[0] != "Z" && f[2].parse::<i32>() == Ok(pgid) {
            live.push(pid);
        }
    }
    live
}

fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').map(|(_, r)| !r.trim_start().starts_with('Z')).unwrap_or(false),
        Err(_) => false,
    }
}

/// The tool's whole process group is gone (no live member) within `limit`.
fn assert_group_gone(pgid: i32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let live = group_members(pgid);
        if live.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tool group {pgid} still has live processes {live:?} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum is needed");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_string()
}

/// Deterministic incompressible bytes.
fn write_data(p: &Path, len: usize) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    fs::write(p, v).unwrap();
}

// ---------------------------------------------------------------- statuses

#[test]
fn refusals_have_their_status_a_one_line_body_and_exit_code_86() {
    let w = Work::new();
    let echo = w.tool("echo", "echo ran > ran");
    let noexec = w.path("tools/noexec");
    fs::write(&noexec, "#!/bin/sh\necho never\n").unwrap();
    fs::set_permissions(&noexec, fs::Permissions::from_mode(0o644)).unwrap();
    // A symlink loop: the program is there but exec fails (ELOOP).
    let looped = w.path("tools/loop");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let s = Server::start(
        &w,
        &[
            "--tool",
            &echo,
            "--tool",
            "ghost=/nonexistent/definitely-not-here",
            "--tool",
            "not-on-path-xyzzy",
            "--tool",
            &format!("noexec={}", noexec.display()),
            "--tool",
            &format!("loop={}", looped.display()),
            "--max-body",
            "1024",
        ],
    );

    // 404 and 405 come first.
    let mut r = Req::new(&s, "echo");
    r.url = s.url().replace("/exec", "/other");
    r.send().assert_refusal(404);
    let mut r = Req::new(&s, "echo");
    r.method = "GET";
    r.send().assert_refusal(405);

    // 401 with WWW-Authenticate: Bearer, for a missing and a wrong token.
    for token in [None, Some("wrong")] {
        let mut r = Req::new(&s, "echo");
        r.token = token;
        let resp = r.send();
        resp.assert_refusal(401);
        assert!(resp.header("WWW-Authenticate").is_some_and(|v| v.starts_with("Bearer")), "{resp:?}");
    }
    // 401 comes before 426, 403 and 409.
    let mut r = Req::new(&s, "ghost").proto(None);
    r.token = Some("wrong");
    r.send().assert_refusal(401);
    let mut r = Req::new(&s, "forbidden");
    r.token = Some("wrong");
    r.send().assert_refusal(401);

    // Any scheme whose last whitespace/'='-separated piece is the token.
    for auth in [format!("Token x={TOKEN}"), format!("Bearer   {TOKEN}"), TOKEN.to_string()] {
        let mut r = Req::new(&s, "echo").v1();
        r.auth = Some(auth.clone());
        let resp = r.send();
        assert_eq!(resp.status, 200, "{auth:?}: {resp:?}");
    }
    fs::remove_file(w.path("ran")).expect("the tool ran for a good token");

    // 426, exact body, for a missing or unsupported protocol.
    for proto in [None, Some("3"), Some("0"), Some("2.0")] {
        let resp = Req::new(&s, "echo").proto(proto).send();
        assert_eq!(resp.status, 426, "{proto:?}: {resp:?}");
        assert_eq!(resp.text(), UNSUPPORTED);
        assert_eq!(resp.header("X-Exit-Code"), Some("86"));
    }

    // 413 past --max-body, also for a chunked body.
    let mut r = Req::new(&s, "echo");
    r.form.push(("arg", "x".repeat(2000)));
    r.send().assert_refusal(413);
    let mut r = Req::new(&s, "echo");
    r.raw_body = Some(format!("tool=echo&arg={}", "y".repeat(4000)).into_bytes());
    r.extra = vec!["-H".into(), "Transfer-Encoding: chunked".into()];
    r.send().assert_refusal(413);

    // 400: no tool, two tools, a cwd outside the working directory, NUL.
    let mut r = Req::new(&s, "echo");
    r.form = vec![("arg", "x".into())];
    r.send().assert_refusal(400);
    let mut r = Req::new(&s, "echo");
    r.form.push(("tool", "echo".into()));
    r.send().assert_refusal(400);
    let mut r = Req::new(&s, "echo");
    r.form.push(("cwd", "/".into()));
    r.send().assert_refusal(400);
    let mut r = Req::new(&s, "echo");
    r.form.push(("cwd", "../..".into()));
    r.send().assert_refusal(400);
    let mut r = Req::new(&s, "echo");
    r.raw_body = Some(b"tool=echo&arg=a%00b".to_vec());
    r.send().assert_refusal(400);

    // 403 not allowed, 409 allowed but missing, 500 there but it cannot
    // run (not executable, a symlink loop).
    Req::new(&s, "forbidden").send().assert_refusal(403);
    Req::new(&s, "ghost").send().assert_refusal(409);
    Req::new(&s, "not-on-path-xyzzy").send().assert_refusal(409);
    Req::new(&s, "noexec").send().assert_refusal(500);
    Req::new(&s, "loop").send().assert_refusal(500);

    // No refusal ran the tool.
    assert!(!w.path("ran").exists(), "a refused request spawned the tool");
    // Unknown form keys are ignored.
    let mut r = Req::new(&s, "echo").v1();
    r.form.push(("colour", "blue".into()));
    assert_eq!(r.send().status, 200);
    assert!(w.path("ran").exists());
}

#[test]
fn unauthorized_is_answered_before_the_body_is_read() {
    let w = Work::new();
    let echo = w.tool("echo", "echo hi");
    let s = Server::start(&w, &["--tool", &echo, "--max-body", "1024"]);
    // Headers promise a body that never comes: the answer must not wait for it.
    let head = "POST /exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nX-Aifo-Proto: 2\r\nContent-Length: 100000\r\n\r\n";
    let (got, took) = raw(&s.addr(), head.as_bytes(), Duration::from_secs(10));
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(text.contains("\r\nWWW-Authenticate: Bearer"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Likewise a body over the limit is refused from Content-Length alone.
    let head = format!(
        "POST /exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nX-Aifo-Proto: 2\r\nContent-Length: 5000\r\n\r\n"
    );
    let (got, took) = raw(&s.addr(), head.as_bytes(), Duration::from_secs(10));
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn incomplete_headers_are_closed_after_the_header_timeout() {
    let w = Work::new();
    let echo = w.tool("echo", "echo hi");
    let s = Server::start(&w, &["--tool", &echo, "--header-timeout", "1"]);
    let (_, took) = raw(&s.addr(), b"POST /exec HTTP/1.1\r\nHost: x\r\n", Duration::from_secs(10));
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "took {took:?}");
}

// ---------------------------------------------------------- exit codes, order

#[test]
fn v1_carries_the_exit_code_in_a_header_and_v2_in_the_trailer() {
    let w = Work::new();
    let code = w.tool("code", "printf 'out\\n'; exit \"$1\"");
    let sig = w.tool("sig", "printf 'dying\\n'; kill -\"$1\" $$; sleep 5");
    let s = Server::start(&w, &["--tool", &code, "--tool", &sig]);

    // v1: buffered, everything in the head.
    let r = Req::new(&s, "code").v1().arg("7").send();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "out\n");
    assert_eq!(r.header("X-Exit-Code"), Some("7"));
    assert_eq!(r.header("Content-Length"), Some("4"));
    assert_eq!(r.header("Connection"), Some("close"));
    assert_eq!(r.header("Content-Type"), Some("text/plain; charset=utf-8"));
    assert!(r.trailers.is_empty());

    // v2 with TE: chunked, the code only in the trailer.
    let r = Req::new(&s, "code").arg("3").send();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "out\n");
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    assert_eq!(r.header("Trailer"), Some("X-Exit-Code"));
    assert_eq!(r.header("Connection"), Some("close"));
    assert_eq!(r.header("Content-Type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("X-Exit-Code"), None, "{r:?}");
    assert_eq!(r.trailer("X-Exit-Code"), Some("3"), "{r:?}");

    // v2 without TE: trailers would be dropped, so the answer is v1's.
    let r = Req::new(&s, "code").te(false).arg("4").send();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Exit-Code"), Some("4"), "{r:?}");
    assert_eq!(r.header("Content-Length"), Some("4"));

    // Death by signal N is 128+N, on both paths.
    for (signal, want) in [("TERM", "143"), ("KILL", "137")] {
        let r = Req::new(&s, "sig").arg(signal).send();
        assert_eq!(r.trailer("X-Exit-Code"), Some(want), "{r:?}");
        let r = Req::new(&s, "sig").v1().arg(signal).send();
        assert_eq!(r.header("X-Exit-Code"), Some(want), "{r:?}");
    }
}

#[test]
fn header_names_are_title_cased_on_the_wire() {
    let w = Work::new();
    let code = w.tool("code", "printf 'x'; exit 9");
    let s = Server::start(&w, &["--tool", &code]);
    let body = form(&[("tool", "code")]);
    let auth = format!("Bearer {TOKEN}");
    let (got, _) = raw(&s.addr(), &request("x", &auth, "1", false, &body), Duration::from_secs(20));
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    for h in [
        "\r\nX-Exit-Code: 9\r\n",
        "\r\nContent-Length: 1\r\n",
        "\r\nContent-Type: text/plain; charset=utf-8\r\n",
    ] {
        assert!(text.contains(h), "{h:?} not in {text:?}");
    }
    let (got, _) = raw(&s.addr(), &request("x", &auth, "2", true, &body), Duration::from_secs(20));
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("\r\nTransfer-Encoding: chunked\r\n"), "{text}");
    assert!(text.contains("\r\nTrailer: X-Exit-Code\r\n"), "{text}");
    assert!(text.ends_with("\r\n0\r\nX-Exit-Code: 9\r\n\r\n"), "{text:?}");

    // HTTP/1.0 has no chunked body and no trailers: v2 with TE is answered
    // as v1 there, or the exit code would be lost.
    let mut req = request("x", &auth, "2", true, &body);
    req.splice(..b"POST /exec HTTP/1.1".len(), b"POST /exec HTTP/1.0".iter().copied());
    let (got, _) = raw(&s.addr(), &req, Duration::from_secs(20));
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    assert!(text.contains("\r\nX-Exit-Code: 9\r\n") && text.ends_with("\r\n\r\nx"), "{text:?}");
}

#[test]
fn stdout_and_stderr_keep_their_write_order() {
    let w = Work::new();
    let t = w.tool(
        "inter",
        "i=0; while [ $i -lt 300 ]; do echo \"out $i\"; echo \"err $i\" >&2; i=$((i+1)); done",
    );
    let s = Server::start(&w, &["--tool", &t]);
    let want: String = (0..300).map(|i| format!("out {i}\nerr {i}\n")).collect();
    assert_eq!(Req::new(&s, "inter").send().text(), want);
    assert_eq!(Req::new(&s, "inter").v1().send().text(), want);
}

#[test]
fn arguments_and_cwd_arrive_byte_exact_through_both_shims() {
    let w = Work::new();
    let args = w.tool("args", "pwd -P; for a in \"$@\"; do printf '[%s]\\n' \"$a\"; done; exit 6");
    let s = Server::start(&w, &["--tool", &args]);
    w.shims(&["args"]);
    let sub = w.path("sub dir");
    fs::create_dir_all(&sub).unwrap();
    let given = ["a b", "x=y&z", "", "ü€", "%41", "+", "line\nbreak", "-n", "--", "'\"$(id)`"];
    let mut want = format!("{}\n", sub.display());
    for a in given {
        want.push_str(&format!("[{a}]\n"));
    }
    for program in [w.path("shims/args"), w.path("rshims/args")] {
        let out = shim(&w, s.url(), &program, &given, &sub);
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{}", program.display());
        assert_eq!(
            out.status.code(),
            Some(6),
            "{}: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // `airlock toolexec shim TOOL` is the same client as the link.
    let out = Command::new(airlock())
        .args(["toolexec", "shim", "args", "-x", "--", "y"])
        .current_dir(&w.dir)
        .env("AIFO_TOOLEEXEC_URL", s.url())
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n[-x]\n[--]\n[y]\n", w.dir.display()));
    assert_eq!(out.status.code(), Some(6));
}

#[test]
fn tools_get_no_token_no_stdin_and_their_own_group() {
    let w = Work::new();
    let env = w.tool("env", "env");
    let stdin = w.tool("stdin", "cat; echo end");
    let grp = w.tool("grp", "exec python3 -c 'import os; print(os.getpgid(0)); print(os.getppid())'");
    // Host pids: the fallback, without a PID namespace.
    let s = Server::start_env(
        &w,
        &["--tool", &env, "--tool", &stdin, "--tool", &grp],
        true,
        &[("AIRLOCK_NO_NAMESPACES", "1")],
    );
    let r = Req::new(&s, "env").send();
    assert_eq!(r.trailer("X-Exit-Code"), Some("0"));
    assert!(!r.text().contains(TOKEN), "the token leaked into the tool's environment");
    assert!(!r.text().contains("AIFO_TOOLEEXEC_TOKEN"), "{}", r.text());
    let r = Req::new(&s, "stdin").send();
    assert_eq!(r.text(), "end\n");
    let r = Req::new(&s, "grp").send();
    let lines: Vec<&str> = r.body.split(|b| *b == b'\n').map(|l| std::str::from_utf8(l).unwrap()).collect();
    // The confinement stage, the tool's parent, leads the tool's group.
    assert_eq!(lines[0], lines[1], "the tool is not in a group of its own: {}", r.text());
}

// ---------------------------------------------------------------- streaming

#[test]
fn v2_streams_output_before_the_tool_exits_through_both_shims() {
    let w = Work::new();
    let gate = w.tool("gate", "echo first; while [ ! -e \"$1\" ]; do sleep 0.02; done; echo second; exit 5");
    let s = Server::start(&w, &["--tool", &gate]);
    w.shims(&["gate"]);
    for (i, program) in [w.path("shims/gate"), w.path("rshims/gate")].into_iter().enumerate() {
        let open = w.path(&format!("open{i}"));
        let mut child = spawn_shim(s.url(), &program, &[open.to_str().unwrap()], &w.dir);
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "first\n");
        // The tool is still waiting for the gate: this line came while it ran.
        assert!(child.try_wait().unwrap().is_none(), "the shim ended before the tool did");
        fs::write(&open, "").unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "second\n");
        assert_eq!(child.wait().unwrap().code(), Some(5), "{}", program.display());
    }
}

/// 50 MiB through a reader that stalls: the tool blocks (nothing is dropped
/// or buffered without bound), then every byte arrives, in order.
#[test]
fn fifty_mib_arrive_byte_exact_through_a_stalled_reader() {
    let w = Work::new();
    let data = w.path("data.bin");
    write_data(&data, 50 << 20);
    let want = sha256(&data);
    let big = w.tool("big", "cat \"$1\"; touch \"$2\"");
    let s = Server::start(&w, &["--tool", &big]);
    w.shims(&["big"]);
    let clients = [
        ("posix", w.path("shims/big").display().to_string()),
        ("rust", w.path("rshims/big").display().to_string()),
    ];
    for (name, program) in clients {
        let done = w.path(&format!("done-{name}"));
        let got = w.path(&format!("got-{name}"));
        // The reader sleeps first; the tool must still be writing when it wakes.
        let script = r#"{ "$1" "$2" "$3"; echo $? > "$4.code"; } | { sleep 2; if [ -e "$3" ]; then echo NOT-STALLED > "$4.stall"; fi; cat > "$4"; }"#;
        let out = Command::new("sh")
            .args(["-c", script, "sh", &program])
            .arg(&data)
            .arg(&done)
            .arg(&got)
            .current_dir(&w.dir)
            .env("AIFO_TOOLEEXEC_URL", s.url())
            .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(
            !w.path(&format!("got-{name}.stall")).exists(),
            "{name}: the tool finished while the reader stalled: output was buffered without bound"
        );
        assert_eq!(fs::read_to_string(w.path(&format!("got-{name}.code"))).unwrap().trim(), "0", "{name}");
        assert_eq!(fs::metadata(&got).unwrap().len(), 50 << 20, "{name}");
        assert_eq!(sha256(&got), want, "{name}: bytes differ");
        fs::remove_file(&got).unwrap();
    }
    // v1 buffers (under --max-buffered's default of 64 MiB) and is exact too.
    let r =
        Req::new(&s, "big").v1().arg(data.to_str().unwrap()).arg(w.path("done-v1").to_str().unwrap()).send();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 50 << 20);
    let v1 = w.path("got-v1");
    fs::write(&v1, &r.body).unwrap();
    assert_eq!(sha256(&v1), want);
}

#[test]
fn v1_past_max_buffered_is_507() {
    let w = Work::new();
    let flood = w.tool("flood", "head -c 1048576 /dev/zero; echo $$ > pid; sleep 1000");
    let s = Server::start(&w, &["--tool", &flood, "--max-buffered", "65536"]);
    let r = Req::new(&s, "flood").v1().send();
    assert_eq!(r.status, 507, "{r:?}");
    assert!(r.header("X-Exit-Code").is_some(), "{r:?}");
    assert!(r.body.len() <= 65536 + 4096, "507 carried {} bytes", r.body.len());
}

// ---------------------------------------------------------------- timeouts

#[test]
fn timeouts_answer_504_or_a_timeout_line_within_timeout_plus_grace() {
    let w = Work::new();
    let hang = w.tool("hang", "[ \"$1\" = talk ] && echo partial; echo $$ > \"$2\"; exec sleep 1000");
    let s = Server::start(&w, &["--tool", &hang, "--timeout", "1", "--kill-grace", "1"]);
    let pid = |n: &str| w.path(n).to_str().unwrap().to_string();

    // v1, output then silence: 504 with what was said.
    let r = Req::new(&s, "hang").v1().arg("talk").arg(&pid("p1")).send();
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.header("X-Exit-Code"), Some("124"));
    assert!(r.text().starts_with("partial\n"), "{r:?}");
    assert!(r.elapsed >= Duration::from_millis(900) && r.elapsed < Duration::from_secs(4), "{:?}", r.elapsed);
    assert_group_gone(read_pid(&w.path("p1")), Duration::from_secs(5));

    // v2 silent: nothing was sent yet, so 504 too.
    let r = Req::new(&s, "hang").arg("quiet").arg(&pid("p2")).send();
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.header("X-Exit-Code"), Some("124"));
    assert!(r.elapsed < Duration::from_secs(4), "{:?}", r.elapsed);

    // v2 after output: the output, the timeout line, trailer 124.
    let r = Req::new(&s, "hang").arg("talk").arg(&pid("p3")).send();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.text(), "partial\ntoolexec: timed out after 1 s\n");
    assert_eq!(r.trailer("X-Exit-Code"), Some("124"));
    assert!(r.elapsed < Duration::from_secs(4), "{:?}", r.elapsed);
    assert_group_gone(read_pid(&w.path("p3")), Duration::from_secs(5));
}

#[test]
fn a_tool_ignoring_sigterm_is_killed_after_the_grace() {
    let w = Work::new();
    // The handler records each TERM and carries on; children inherit nothing.
    let stub = w.tool(
        "stubborn",
        "trap 'echo term >> \"$1.term\"' TERM; echo $$ > \"$1\"; echo started; while :; do sleep 0.05; done",
    );
    let s = Server::start(&w, &["--tool", &stub, "--timeout", "1", "--kill-grace", "2"]);
    let p = w.path("stub");
    let r = Req::new(&s, "stubborn").arg(p.to_str().unwrap()).send();
    assert_eq!(r.trailer("X-Exit-Code"), Some("124"), "{r:?}");
    assert!(r.text().starts_with("started\n"), "{r:?}");
    // TERM at the timeout, KILL at timeout + grace, not before.
    assert!(
        r.elapsed >= Duration::from_millis(2800),
        "answered after {:?}: killed before the grace",
        r.elapsed
    );
    assert!(r.elapsed < Duration::from_secs(6), "answered after {:?}", r.elapsed);
    assert!(fs::read_to_string(w.path("stub.term")).unwrap_or_default().contains("term"), "no SIGTERM came");
    assert_group_gone(read_pid(&p), Duration::from_secs(5));
}

// ------------------------------------------------------ disconnects, groups

/// A tool that leaves a grandchild on the pipe and hangs, silent or not.
const HOLD: &str =
    "echo $$ > \"$1\"; sleep 1000 & echo $! > \"$1.gc\"; [ \"$2\" = talk ] && echo started; wait";

#[test]
fn a_client_that_leaves_takes_the_whole_tool_group_with_it() {
    let w = Work::new();
    let hold = w.tool("hold", HOLD);
    // Host pids: the fallback, without a PID namespace.
    let s = Server::start_env(&w, &["--tool", &hold], true, &[("AIRLOCK_NO_NAMESPACES", "1")]);
    let auth = format!("Bearer {TOKEN}");
    for (i, (proto, te, talk)) in
        [("1", false, "quiet"), ("2", true, "quiet"), ("2", true, "talk"), ("1", false, "talk")]
            .into_iter()
            .enumerate()
    {
        let p = w.path(&format!("hold{i}"));
        let body = form(&[("tool", "hold"), ("arg", p.to_str().unwrap()), ("arg", talk)]);
        let mut sock = TcpStream::connect(s.addr()).unwrap();
        sock.write_all(&request("x", &auth, proto, te, &body)).unwrap();
        let pid = read_pid(&p);
        let gc = read_pid(&p.with_extension("gc"));
        assert!(alive(pid) && alive(gc));
        drop(sock);
        let t = Instant::now();
        // The group is the confinement stage's (the tool's parent leads it).
        wait_for("the tool to die", Duration::from_secs(5), || !alive(pid));
        wait_for("the grandchild to die", Duration::from_secs(5), || !alive(gc));
        assert!(t.elapsed() < Duration::from_secs(3), "v{proto} {talk}: kill took {:?}", t.elapsed());
    }
    // A client that leaves mid-body never gets a tool.
    let p = w.path("never");
    let body = form(&[("tool", "hold"), ("arg", p.to_str().unwrap())]);
    let mut req = request("x", &auth, "2", true, &body);
    req.truncate(req.len() - 5);
    let mut sock = TcpStream::connect(s.addr()).unwrap();
    sock.write_all(&req).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(sock);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!p.exists(), "the tool ran for an incomplete request");
}

#[test]
fn a_tool_exit_kills_its_group_and_ends_the_stream() {
    let w = Work::new();
    let t = w.tool("leave", "sleep 1000 & echo $! > \"$1\"; echo bye; exit 3");
    // The grandchild's pid is read on the host: the fallback, without a
    // PID namespace (inside one the namespace's end takes it anyway).
    let s = Server::start_env(&w, &["--tool", &t], true, &[("AIRLOCK_NO_NAMESPACES", "1")]);
    for v1 in [false, true] {
        let p = w.path(&format!("gc-{v1}"));
        let r = Req::new(&s, "leave").arg(p.to_str().unwrap());
        let r = if v1 { r.v1() } else { r };
        let resp = r.send();
        assert_eq!(resp.text(), "bye\n");
        assert!(resp.elapsed < Duration::from_secs(5), "the grandchild held the stream: {:?}", resp.elapsed);
        let code = if v1 { resp.header("X-Exit-Code") } else { resp.trailer("X-Exit-Code") };
        assert_eq!(code, Some("3"));
        let gc = read_pid(&p);
        wait_for("the grandchild to die", Duration::from_secs(5), || !alive(gc));
    }
}

#[test]
fn sigterm_ends_streams_kills_tools_and_exits_0() {
    let w = Work::new();
    let hold = w.tool("hold", HOLD);
    let sock = w.path("s.sock");
    // A stale socket from an earlier run is replaced.
    drop(UnixListener::bind(&sock).unwrap());
    let listen = format!("unix:{}", sock.display());
    let mut s = Server::start(&w, &["--tool", &hold, "--listen", &listen, "--listen", "127.0.0.1:0"]);
    let mode = fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    w.shims(&["hold"]);
    let p = w.path("h");
    let unix_url = s.urls.iter().find(|u| u.starts_with("unix://")).expect("a unix:// url").clone();
    let mut child = spawn_shim(&unix_url, &w.path("shims/hold"), &[p.to_str().unwrap(), "talk"], &w.dir);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let pid = read_pid(&p);
    let st = s.stop();
    assert_eq!(st.code(), Some(0), "stderr:\n{}", s.stderr());
    assert_group_gone(pid, Duration::from_secs(5));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let _ = child.wait().unwrap();
    assert!(!sock.exists(), "the socket outlived the server");
}

// ------------------------------------------------------------- transports

#[test]
fn unix_socket_serves_curl_and_both_shims() {
    let w = Work::new();
    let code = w.tool("code", "echo \"via $1\"; exit 42");
    let sock = w.path("t.sock");
    let listen = format!("unix:{}", sock.display());
    let s = Server::start(&w, &["--tool", &code, "--listen", &listen]);
    assert!(s.url().starts_with("unix://"), "{}", s.url());
    w.shims(&["code"]);
    let mut r = Req::new(&s, "code").arg("curl");
    r.url = "http://localhost/exec".into();
    r.unix = Some(sock.clone());
    let resp = r.send();
    assert_eq!(resp.text(), "via curl\n");
    assert_eq!(resp.trailer("X-Exit-Code"), Some("42"));
    for program in [w.path("shims/code"), w.path("rshims/code")] {
        let out = shim(&w, s.url(), &program, &["shim"], &w.dir);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "via shim\n");
        assert_eq!(out.status.code(), Some(42), "{}", program.display());
    }
    // The socket checks the token like TCP does.
    let mut c = UnixStream::connect(&sock).unwrap();
    c.write_all(&request("localhost", "Bearer nope", "2", true, "tool=code")).unwrap();
    let mut got = String::new();
    c.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
}

#[test]
fn a_hundred_clients_share_max_connections() {
    let w = Work::new();
    let conc = w.script(
        "conc",
        "#!/usr/bin/env python3\nimport fcntl, sys, time\np = sys.argv[1]\n\
def upd(d):\n    with open(p, 'a+') as f:\n        fcntl.flock(f, fcntl.LOCK_EX)\n        f.seek(0)\n        s = f.read().split()\n        cur, mx = (int(s[0]), int(s[1])) if s else (0, 0)\n        cur += d\n        mx = max(mx, cur)\n        f.seek(0)\n        f.truncate()\n        f.write(f'{cur} {mx}')\n\
upd(1)\ntime.sleep(0.05)\nupd(-1)\nprint('ok')\n",
    );
    let cap = 4;
    let s = Server::start(&w, &["--tool", &conc, "--max-connections", &cap.to_string()]);
    let counter = w.path("count");
    let server_pid = s.pid();
    let port: u16 = s.addr().rsplit(':').next().unwrap().parse().unwrap();
    // Accepted TCP connections the server holds: its socket descriptors
    // that /proc/net/tcp lists as established on the listening port. The
    // descriptors are read before and after the table and only those in
    // both count: a socket the server closed meanwhile can stay
    // established for a moment while a tool being spawned still holds
    // the copy fork gave it (close-on-exec drops it only at exec), and
    // it is not a connection the server holds.
    let socket_inodes = move || -> std::collections::BTreeSet<String> {
        fs::read_dir(format!("/proc/{server_pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| fs::read_link(e.path()).ok())
                    .filter_map(|l| {
                        let l = l.to_string_lossy().into_owned();
                        l.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')).map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let sockets = move || {
        let before = socket_inodes();
        let table = fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let inodes: std::collections::BTreeSet<String> =
            before.intersection(&socket_inodes()).cloned().collect();
        // Distinct sockets, not lines: /proc/net/tcp is produced a page per
        // read while connections come and go, so one socket can be listed
        // twice in one read.
        let held: std::collections::BTreeSet<&str> = table
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let on_port = f.len() > 9
                    && f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port);
                (on_port && f[3] == "01" && inodes.contains(f[9])).then_some(f[9])
            })
            .collect();
        held.len()
    };
    let idle = sockets();
    let snapshot = move || {
        let fds: Vec<String> = fs::read_dir(format!("/proc/{server_pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| fs::read_link(e.path()).ok())
                    .map(|l| l.display().to_string())
                    .collect()
            })
            .unwrap_or_default();
        format!("fds {fds:?}\ntcp:\n{}", fs::read_to_string("/proc/net/tcp").unwrap_or_default())
    };
    // Sample the server's open sockets while the clients run.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            let mut evidence = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = sockets();
                if n > cap && evidence.is_none() {
                    evidence = Some(snapshot());
                }
                most = most.max(n);
                std::thread::sleep(Duration::from_millis(5));
            }
            (most, evidence)
        })
    };
    let url = s.url().to_string();
    let threads: Vec<_> = (0..100)
        .map(|_| {
            let url = url.clone();
            let counter = counter.clone();
            std::thread::spawn(move || {
                Command::new("curl")
                    .args(["-sS", "--max-time", "120", "-H", &format!("Authorization: Bearer {TOKEN}")])
                    .args(["-H", "X-Aifo-Proto: 1", "--data-urlencode", "tool=conc", "--data-urlencode"])
                    .arg(format!("arg={}", counter.display()))
                    .arg(&url)
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let outs: Vec<Output> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_sockets, evidence) = sampler.join().unwrap();
    let mut seen = BTreeMap::new();
    for o in &outs {
        *seen.entry(String::from_utf8_lossy(&o.stdout).into_owned()).or_insert(0) += 1;
    }
    assert_eq!(seen.get("ok\n"), Some(&100), "answers: {seen:?}");
    let c = fs::read_to_string(&counter).unwrap();
    let most: usize = c.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(c.split_whitespace().next(), Some("0"));
    assert!(most <= cap && most >= 1, "{most} tools ran at once with --max-connections {cap}");
    assert_eq!(idle, 0, "connections before any client");
    assert!(most_sockets >= 1, "the sampler never saw a connection: it cannot see any");
    assert!(
        most_sockets <= cap,
        "the server held {most_sockets} connections at once, cap {cap}; {}",
        evidence.unwrap_or_default()
    );
}

// ------------------------------------------------------------- start-up

#[test]
fn bad_tokens_and_remote_listeners_are_refused_at_start() {
    let w = Work::new();
    let echo = w.tool("echo", "echo hi");
    for bad in ["", "two words", "a=b", "tab\there"] {
        let tf = w.path("badtoken");
        fs::write(&tf, bad).unwrap();
        let out = Command::new(airlock())
            .args(["toolexec", "serve", "--tool", &echo, "--token-file"])
            .arg(&tf)
            .current_dir(&w.dir)
            .env_remove("AIFO_TOOLEEXEC_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "token {bad:?}: {out:?}");
        assert!(!out.stderr.is_empty());
    }
    let out = Command::new(airlock())
        .args(["toolexec", "serve", "--tool", &echo, "--listen", "0.0.0.0:0"])
        .current_dir(&w.dir)
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "a non-loopback listener started without --allow-remote");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"), "{out:?}");
}

#[test]
fn the_token_comes_from_the_environment_or_is_generated() {
    let w = Work::new();
    let echo = w.tool("echo", "echo hi");
    let s = Server::start_env(&w, &["--tool", &echo], false, &[("AIFO_TOOLEEXEC_TOKEN", TOKEN)]);
    assert_eq!(Req::new(&s, "echo").send().text(), "hi\n");
    drop(s);
    // No token given: a random one, printed, and it works.
    let s = Server::start_env(&w, &["--tool", &echo], false, &[]);
    let mut token = s.lines.iter().find_map(|l| l.strip_prefix("AIFO_TOOLEEXEC_TOKEN=").map(str::to_string));
    let deadline = Instant::now() + Duration::from_secs(5);
    while token.is_none() && Instant::now() < deadline {
        if let Ok(l) = s.stdout_rest.recv_timeout(Duration::from_millis(200)) {
            token = l.strip_prefix("AIFO_TOOLEEXEC_TOKEN=").map(str::to_string);
        }
    }
    let token = token.expect("no AIFO_TOOLEEXEC_TOKEN= line for a generated token");
    assert!(token.len() >= 32 && token != TOKEN, "{token}");
    let mut r = Req::new(&s, "echo");
    r.token = Some(&token);
    assert_eq!(r.send().text(), "hi\n");
}

// ------------------------------------------------------------- the clients

#[test]
fn the_clients_report_refusals_and_transport_errors() {
    let w = Work::new();
    let echo = w.tool("echo", "echo hi");
    let s = Server::start(&w, &["--tool", &echo]);
    w.shims(&["echo", "forbidden"]);
    // A refusal: both exit 86; the Rust shim puts the reason on stderr.
    let out = shim(&w, s.url(), &w.path("shims/forbidden"), &[], &w.dir);
    assert_eq!(out.status.code(), Some(86));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("toolexec: "), "{out:?}");
    let out = shim(&w, s.url(), &w.path("rshims/forbidden"), &[], &w.dir);
    assert_eq!(out.status.code(), Some(86));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("toolexec: "), "{out:?}");
    // A wrong token.
    let out = Command::new(w.path("rshims/echo"))
        .current_dir(&w.dir)
        .env("AIFO_TOOLEEXEC_URL", s.url())
        .env("AIFO_TOOLEEXEC_TOKEN", "wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(86), "{out:?}");
    // Nobody listening: the Rust shim says so and exits 86; the POSIX shim
    // has no exit code header and falls back to 1, as the seed says.
    let dead = "http://127.0.0.1:9/exec";
    let out = shim(&w, dead, &w.path("rshims/echo"), &[], &w.dir);
    assert_eq!(out.status.code(), Some(86));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"), "{out:?}");
    let out = shim(&w, dead, &w.path("shims/echo"), &[], &w.dir);
    assert_eq!(out.status.code(), Some(1));
    // Not configured.
    for program in [w.path("shims/echo"), w.path("rshims/echo")] {
        let out = Command::new(&program).env_remove("AIFO_TOOLEEXEC_URL").output().unwrap();
        assert_eq!(out.status.code(), Some(86), "{}", program.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("AIFO_TOOLEEXEC_URL"));
    }
    // The POSIX shim cleans up its temporary directory (it holds the token).
    let left: Vec<_> = fs::read_dir(&w.dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("aifo-shim."))
        .collect();
    assert!(left.is_empty(), "temporary directories left: {left:?}");
}

#[test]
fn write_shims_writes_an_executable_shim_and_one_link_per_tool() {
    let w = Work::new();
    let dir = w.path("sh");
    let out = Command::new(airlock())
        .args(["toolexec", "write-shims"])
        .arg(&dir)
        .args(["--tool", "cargo", "--tool", "g++"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shim = dir.join("aifo-shim");
    assert_eq!(fs::metadata(&shim).unwrap().permissions().mode() & 0o777, 0o755);
    for t in ["cargo", "g++"] {
        assert_eq!(fs::read_link(dir.join(t)).unwrap(), PathBuf::from("aifo-shim"));
    }
    // Again: links are replaced, nothing fails.
    let again = Command::new(airlock())
        .args(["toolexec", "write-shims"])
        .arg(&dir)
        .args(["--tool", "cargo"])
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    // A path or the shim's own name is not a tool name.
    for bad in ["../x", "aifo-shim", ""] {
        let out = Command::new(airlock())
            .args(["toolexec", "write-shims"])
            .arg(&dir)
            .args(["--tool", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
    }
    // The shim is POSIX: dash parses it.
    let st = Command::new("sh").arg("-n").arg(&shim).status().unwrap();
    assert!(st.success());
}

// ---------------------------------------------------------------- network by host name

/// A tiny HTTP/1.0 server on the host's 127.0.0.1 answering every request
/// with a body that names it; its port.
fn forge_server() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                common::read_head(&mut s);
                let body = "hello from the forge\n";
                let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            });
        }
    });
    port
}

/// `--allow-host` gives each tool `run`'s proxies: an allowed name reaches
/// the host's server, another name or port is refused in words naming the
/// rule and the host, a name resolving to loopback reaches it only when a
/// pattern names the address, and each connection is an `--audit` line.
#[test]
fn allow_host_gives_tools_the_proxies_under_the_same_patterns() {
    let w = Work::new();
    let port = forge_server();
    let fetch = w.tool("fetch", "exec curl -sS -i --max-time 20 \"$1\"");
    let audit = w.path("audit.jsonl");
    let forge = format!("forge.test:{port}");
    let s = Server::start(
        &w,
        &[
            "--tool",
            &fetch,
            "--allow-host",
            &forge,
            "--allow-host",
            "127.0.0.1",
            "--resolve",
            "forge.test=127.0.0.1",
            "--resolve",
            "other.test=127.0.0.1",
            "--audit",
            audit.to_str().unwrap(),
        ],
    );
    assert!(s.stderr().contains("network through airlock's proxies (--allow-host"), "{}", s.stderr());
    let r = Req::new(&s, "fetch").arg(&format!("http://{forge}/pkg")).send();
    assert!(r.text().starts_with("HTTP/1.0 200 OK"), "{}", r.text());
    assert!(r.text().ends_with("hello from the forge\n"), "{}", r.text());
    for (host, rule) in [
        (format!("other.test:{port}"), "no --allow-host pattern matches"),
        ("forge.test:1".to_owned(), "no --allow-host pattern matches"),
    ] {
        let r = Req::new(&s, "fetch").arg(&format!("http://{host}/")).send();
        let t = r.text();
        assert!(t.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{t}");
        assert!(t.contains(&format!("X-Airlock-Refused: host={host}; rule=\"{rule}\"\r\n")), "{t}");
    }
    let lines: Vec<serde_json::Value> =
        fs::read_to_string(&audit).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l["op"] == "egress"), "{lines:?}");
    // Each line names the tool whose proxies wrote it.
    assert!(lines.iter().all(|l| l["tool"] == "fetch"), "{lines:?}");
    // Three tools, three services, one numbering in the one log.
    let mut conns: Vec<u64> = lines.iter().map(|l| l["conn"].as_u64().unwrap()).collect();
    conns.sort();
    conns.dedup();
    assert_eq!(conns.len(), 3, "{lines:?}");
    let ok: Vec<_> = lines.iter().filter(|l| l["allowed"] == true).collect();
    assert_eq!(ok.len(), 1, "{lines:?}");
    assert_eq!(ok[0]["host"], "forge.test");
    assert_eq!(ok[0]["addr"], format!("127.0.0.1:{port}"));
    assert_eq!(ok[0]["rule"], format!("--allow-host {forge}"));
    drop(s);

    // The name alone: its loopback address is not named.
    let lp = format!("localhost:{port}");
    let s = Server::start(&w, &["--tool", &fetch, "--allow-host", &lp]);
    let t = Req::new(&s, "fetch").arg(&format!("http://{lp}/")).send().text();
    assert!(t.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{t}");
    assert!(
        t.contains("loopback address") && t.contains("not named by an --allow-host address or range"),
        "{t}"
    );
}

/// Without `--allow-host` a tool reaches nothing; `--allow-host` refuses
/// to start beside `--tool-net` or `--no-sandbox`, naming the flags.
#[test]
fn allow_host_contradicts_tool_net_and_no_sandbox_and_is_needed_for_the_network() {
    let w = Work::new();
    let port = forge_server();
    let fetch = w.tool("fetch", "exec curl -sS -i --max-time 20 \"$1\"");
    let s = Server::start(&w, &["--tool", &fetch]);
    let r = Req::new(&s, "fetch").arg(&format!("http://127.0.0.1:{port}/")).send();
    assert!(!r.text().contains("hello from the forge"), "{}", r.text());
    assert_ne!(r.trailer("X-Exit-Code"), Some("0"), "{}", r.text());
    drop(s);
    for (extra, says) in [("--tool-net", "--tool-net"), ("--no-sandbox", "--no-sandbox")] {
        let out = Command::new(airlock())
            .args(["toolexec", "serve", "--tool", &fetch, "--allow-host", "127.0.0.1", extra])
            .current_dir(&w.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--allow-host") && err.contains(says), "{err}");
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}
