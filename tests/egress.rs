//! Network egress by host name (issue 42), with the real binary: real
//! children under the default sandbox reach an HTTP server the test runs
//! on the host's 127.0.0.1 only through airlock's proxies, and only as
//! `--allow-host` says; everything else is refused in words (a 403 naming
//! the rule and the host, a SOCKS reply code) or reaches nothing at all.
//! The host side (the server's connections and the bytes each carried)
//! is counted by the test, outside the child. Every scenario runs in both
//! modes: in the forced fallback (`AIRLOCK_NO_NAMESPACES=1`) there is no
//! network namespace to put the proxies in, and `--allow-host` is refused
//! before the child runs, never silently open.

mod common;
mod confine_common;

use common::{airlock, SYSTEM_PATH};
use confine_common::{Mode, MODES, NO_NAMESPACES};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Exit status of a run airlock refuses to start.
const REFUSED: i32 = 125;
/// How long the test server waits on a silent peer.
const SERVER_TIMEOUT: Duration = Duration::from_secs(5);

/// One connection the test server took: the request line and the bytes
/// each way, as the host side counts them.
#[derive(Clone, Debug)]
struct Hit {
    request_line: String,
    bytes_in: u64,
    bytes_out: u64,
}

/// A tiny HTTP/1.0 server on the host's 127.0.0.1, answering every
/// request with a body that names its port.
struct Server {
    port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Server {
    fn start() -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let h = hits.clone();
        // Leaked: it lives as long as the test process.
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let h = h.clone();
                std::thread::spawn(move || {
                    s.set_read_timeout(Some(SERVER_TIMEOUT)).unwrap();
                    let head = common::read_head(&mut s);
                    let body = Server::body_of(port);
                    let answer = format!(
                        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes());
                    let _ = s.shutdown(Shutdown::Write);
                    // Whatever else comes is counted too.
                    let mut bytes_in = head.len() as u64;
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        bytes_in += n as u64;
                    }
                    let request_line = String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_owned();
                    h.lock().unwrap().push(Hit { request_line, bytes_in, bytes_out: answer.len() as u64 });
                });
            }
        });
        Server { port, hits }
    }

    fn body_of(port: u16) -> String {
        format!("hello from the test server on port {port}\n")
    }

    fn body(&self) -> String {
        Server::body_of(self.port)
    }

    /// The connections taken so far, once those in flight are done.
    fn hits(&self) -> Vec<Hit> {
        std::thread::sleep(Duration::from_millis(200));
        self.hits.lock().unwrap().clone()
    }
}

/// An `airlock run`'s results: its output, and the report and the audit
/// lines when it wrote them.
struct Run {
    mode: Mode,
    output: Output,
    report: Option<Value>,
    audit: Vec<Value>,
}

impl Run {
    fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn egress_report(&self) -> &Value {
        let r = self.report.as_ref().unwrap_or_else(|| panic!("no report; stderr: {}", self.stderr()));
        &r["egress"]
    }

    /// The audit's `op: egress` lines.
    fn egress_lines(&self) -> Vec<&Value> {
        self.audit.iter().filter(|l| l["op"] == "egress").collect()
    }

    /// With namespaces the child ran to its end; in the fallback airlock
    /// refused `--allow-host` before the child ran: exit 125, the reason
    /// on stderr, no output from the child, no report.
    fn ran(&self) -> bool {
        match self.mode {
            Mode::Namespaces => {
                assert_eq!(self.code(), Some(0), "stdout: {}\nstderr: {}", self.stdout(), self.stderr());
                true
            }
            Mode::Fallback => {
                assert_eq!(
                    self.code(),
                    Some(REFUSED),
                    "the fallback ran with --allow-host: {}",
                    self.stderr()
                );
                assert!(
                    self.stderr().contains("--allow-host needs a network namespace of the child's own"),
                    "stderr: {}",
                    self.stderr()
                );
                assert_eq!(self.stdout(), "", "the child ran in the fallback");
                assert!(self.report.is_none(), "a refused run wrote a report");
                false
            }
        }
    }
}

/// `airlock run ARGS --audit --report -- CMD` in `dir` under `mode`.
fn run(dir: &Path, mode: Mode, args: &[&str], cmd: &[&str]) -> Run {
    let n = unique();
    let report = dir.join(format!("report-{n}.json"));
    let audit = dir.join(format!("audit-{n}.jsonl"));
    let mut c = Command::new(airlock());
    c.current_dir(dir)
        .arg("run")
        .args(args)
        .arg("--audit")
        .arg(&audit)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .args(cmd)
        .env_remove("AIRLOCK_FD")
        .env_remove(NO_NAMESPACES)
        .env("PATH", SYSTEM_PATH)
        .stdin(Stdio::null());
    if mode == Mode::Fallback {
        c.env(NO_NAMESPACES, "1");
    }
    let output = c.output().expect("airlock runs");
    let report =
        std::fs::read_to_string(&report).ok().map(|t| serde_json::from_str(&t).expect("report is JSON"));
    let audit = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect();
    Run { mode, output, report, audit }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// `sh -c SCRIPT`.
fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

/// The child's `curl` line for `url` through the HTTP proxy its
/// environment names: the head, a blank line, the body.
fn curl(url: &str) -> String {
    format!("curl -sS -i --max-time 20 {url}; echo \"curl=$?\"")
}

/// Both the name and the address: `forge.test` answers 127.0.0.1, which
/// is reached only because a pattern names the address itself.
fn allow_forge(port: u16) -> Vec<String> {
    let p = port.to_string();
    vec![
        "--resolve".into(),
        "forge.test=127.0.0.1".into(),
        "--allow-host".into(),
        format!("forge.test:{p}"),
        "--allow-host".into(),
        format!("127.0.0.1:{p}"),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// An allowed name reaches the server through the HTTP proxy (curl
/// reads `http_proxy`); a name alone that resolves to loopback reaches
/// nothing until the address is allowed too.
#[test]
fn curl_reaches_an_allowed_name_and_loopback_only_when_the_address_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    for mode in MODES {
        let before = server.hits().len();
        let args = allow_forge(port);
        let r = run(dir.path(), mode, &strs(&args), &sh(&curl(&format!("http://forge.test:{port}/a"))));
        if !r.ran() {
            assert_eq!(server.hits().len(), before, "the fallback reached the server");
            continue;
        }
        let out = r.stdout();
        assert!(out.starts_with("HTTP/1.0 200 OK\r\n"), "{out}\n{}", r.stderr());
        assert!(out.ends_with(&format!("\r\n\r\n{}curl=0\n", server.body())), "{out}");
        let hits = server.hits();
        assert_eq!(hits.len(), before + 1, "{hits:?}");
        assert_eq!(hits[before].request_line, "GET /a HTTP/1.1");

        // localhost:PORT alone: the name is allowed, its address is not.
        let lp = format!("localhost:{port}");
        let r = run(dir.path(), mode, &["--allow-host", &lp], &sh(&curl(&format!("http://{lp}/"))));
        assert!(r.ran());
        let out = r.stdout();
        assert!(out.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{out}");
        assert!(
            out.contains(&format!(
                "X-Airlock-Refused: host={lp}; rule=\"loopback address 127.0.0.1 not named by an \
                 --allow-host address or range\"\r\n"
            )),
            "{out}"
        );
        assert!(out.contains("To allow it, the user can also pass --allow-host 127.0.0.1"), "{out}");
        assert_eq!(server.hits().len(), before + 1, "a refused request reached the server");

        // With the address allowed too, it does.
        let r = run(
            dir.path(),
            mode,
            &["--allow-host", &lp, "--allow-host", "127.0.0.1"],
            &sh(&curl(&format!("http://{lp}/b"))),
        );
        assert!(r.ran());
        assert!(r.stdout().starts_with("HTTP/1.0 200 OK\r\n"), "{}\n{}", r.stdout(), r.stderr());
        assert!(r.stdout().contains(&server.body()), "{}", r.stdout());
        assert_eq!(server.hits().len(), before + 2);
    }
}

/// Another port of the allowed name and another name on the allowed
/// port: a 403 whose header names the host and the rule and whose body
/// says what would allow it; through SOCKS5 (`--socks5-hostname`, the
/// name resolved by the proxy) the reply code 2, "not allowed by the
/// ruleset". Servers listen on both ports: nothing reaches either.
#[test]
fn another_port_and_another_name_are_refused_by_rule_and_host() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let other = Server::start();
    let (port, oport) = (server.port, other.port);
    let mut args = allow_forge(port);
    args.extend(["--resolve".into(), "other.test=127.0.0.1".into()]);
    args.extend(["--allow-host".into(), format!("127.0.0.1:{oport}")]);
    let script = [
        curl(&format!("http://forge.test:{oport}/")),
        curl(&format!("http://other.test:{port}/")),
        format!("curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 http://other.test:{port}/ 2>&1; echo \"curl=$?\""),
    ]
    .join("; echo ===; ");
    for mode in MODES {
        let r = run(dir.path(), mode, &strs(&args), &sh(&script));
        if !r.ran() {
            continue;
        }
        let out = r.stdout();
        let parts: Vec<&str> = out.split("===\n").collect();
        assert_eq!(parts.len(), 3, "{out}\n{}", r.stderr());
        for (part, host) in
            [(parts[0], format!("forge.test:{oport}")), (parts[1], format!("other.test:{port}"))]
        {
            assert!(part.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{part}");
            assert!(part.contains("X-Proxy-Error: blocked-by-airlock\r\n"), "{part}");
            assert!(
                part.contains(&format!(
                    "X-Airlock-Refused: host={host}; rule=\"no --allow-host pattern matches\"\r\n"
                )),
                "{part}"
            );
            let body = format!(
                "airlock refused GET {host}: no --allow-host pattern matches. To allow it, the user can \
                 pass --allow-host {host}.\n"
            );
            assert!(part.ends_with(&format!("\r\n\r\n{body}curl=0\n")), "{part}");
        }
        // curl 97: CURLE_PROXY; (2): the SOCKS5 reply code it was sent.
        assert!(parts[2].contains("Can't complete SOCKS5 connection to other.test. (2)"), "{}", parts[2]);
        assert!(parts[2].ends_with("curl=97\n"), "{}", parts[2]);
        let socks: Vec<_> =
            r.egress_lines().into_iter().filter(|l| l["proto"] == "socks5").cloned().collect();
        assert_eq!(socks.len(), 1, "{:?}", r.audit);
        assert_eq!(socks[0]["answer"], 2, "{}", socks[0]);
        assert_eq!(socks[0]["rule"], "no --allow-host pattern matches", "{}", socks[0]);
    }
    assert!(server.hits().is_empty(), "{:?}", server.hits());
    assert!(other.hits().is_empty(), "{:?}", other.hits());
}

/// Python's `urllib.request` reads the proxy variables airlock sets
/// and reaches the allowed server, plain and through the SOCKS5 proxy's
/// allowed path too (`curl --socks5-hostname`).
#[test]
fn python_urllib_and_socks_reach_the_allowed_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    let args = allow_forge(port);
    let script = format!(
        "python3 -c 'import urllib.request, sys; \
         sys.stdout.write(urllib.request.urlopen(\"http://forge.test:{port}/py\", timeout=20).read().decode())'; \
         echo \"py=$?\"; \
         curl -sS --max-time 20 --socks5-hostname 127.0.0.1:1080 http://forge.test:{port}/socks; echo \"curl=$?\""
    );
    for mode in MODES {
        let before = server.hits().len();
        let r = run(dir.path(), mode, &strs(&args), &sh(&script));
        if !r.ran() {
            assert_eq!(server.hits().len(), before, "the fallback reached the server");
            continue;
        }
        let body = server.body();
        assert_eq!(r.stdout(), format!("{body}py=0\n{body}curl=0\n"), "{}", r.stderr());
        let lines: Vec<String> = server.hits()[before..].iter().map(|h| h.request_line.clone()).collect();
        assert_eq!(lines, ["GET /py HTTP/1.1", "GET /socks HTTP/1.1"]);
    }
}

/// Sockets that ignore the proxy variables reach nothing. `connect`
/// and `sendto` with MSG_FASTOPEN (which connects without `connect`,
/// issue 39) are refused by Landlock (the proxies' ports alone are let
/// through); UDP meets the child's own network namespace: 127.0.0.1
/// there is the child's own loopback, where nothing listens, and an
/// outside address has no route. Even an allowed
/// address is reached only through the proxies. Each attempt prints
/// what it got; none gets a byte, and the host's TCP server and a UDP
/// socket beside it see nothing.
#[test]
fn a_socket_that_ignores_the_proxies_reaches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let (port, uport) = (server.port, udp.local_addr().unwrap().port());
    let mut args = allow_forge(port);
    args.extend(["--allow-host".into(), "1.1.1.1".into()]);
    let script = format!(
        r#"
import errno, socket
MSG_FASTOPEN = 0x20000000
def connect(addr):
    s = socket.create_connection(addr, timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    return s.recv(100)
def fastopen(addr):
    s = socket.socket()
    s.settimeout(5)
    s.sendto(b"GET / HTTP/1.0\r\n\r\n", MSG_FASTOPEN, addr)
    return s.recv(100)
def udp(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"ping", addr)
    s.settimeout(2)
    return s.recv(100)
for try_, addr in ((connect, ("127.0.0.1", {port})), (connect, ("1.1.1.1", 80)),
                   (fastopen, ("127.0.0.1", {port})), (fastopen, ("1.1.1.1", 80)),
                   (udp, ("127.0.0.1", {uport})), (udp, ("1.1.1.1", 53))):
    try:
        got = "data " + repr(try_(addr))
    except socket.timeout:
        got = "timeout"
    except OSError as e:
        got = errno.errorcode.get(e.errno, str(e.errno))
    print(try_.__name__, addr[0], got)
"#
    );
    for mode in MODES {
        let r = run(dir.path(), mode, &strs(&args), &["python3", "-c", &script]);
        if !r.ran() {
            continue;
        }
        let out = r.stdout();
        let got: Vec<&str> = out.lines().collect();
        assert_eq!(
            got,
            [
                "connect 127.0.0.1 EACCES",
                "connect 1.1.1.1 EACCES",
                "fastopen 127.0.0.1 EACCES",
                "fastopen 1.1.1.1 EACCES",
                // Nothing on the child's own loopback answers; no route out.
                "udp 127.0.0.1 timeout",
                "udp 1.1.1.1 ENETUNREACH",
            ],
            "{}",
            r.stderr()
        );
        // Nothing went through the proxies either.
        assert!(r.egress_lines().is_empty(), "{:?}", r.audit);
        assert_eq!(r.egress_report()["connections"], 0, "{}", r.egress_report());
    }
    assert!(server.hits().is_empty(), "{:?}", server.hits());
    let mut buf = [0u8; 16];
    let e = udp.recv_from(&mut buf).expect_err("a datagram reached the host");
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
}

/// The audit has a line per proxy connection naming the host, the
/// port, the rule, the answer and the bytes each way, which are the
/// bytes the server counted; the report's egress section has the
/// patterns and the counts.
#[test]
fn audit_and_report_count_every_connection_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    let args = allow_forge(port);
    let script = [curl(&format!("http://forge.test:{port}/x")), curl(&format!("http://other.test:{port}/"))]
        .join("; ");
    for mode in MODES {
        let before = server.hits().len();
        let r = run(dir.path(), mode, &strs(&args), &sh(&script));
        if !r.ran() {
            assert!(r.audit.iter().all(|l| l["op"] != "egress"), "{:?}", r.audit);
            continue;
        }
        let hits = server.hits();
        assert_eq!(hits.len(), before + 1, "{hits:?}");
        let hit = &hits[before];
        let lines = r.egress_lines();
        assert_eq!(lines.len(), 2, "{:?}", r.audit);
        // In the order they closed, which need not be the order they came.
        let (ok, no) = if lines[0]["allowed"] == true { (lines[0], lines[1]) } else { (lines[1], lines[0]) };
        assert_eq!(ok["host"], "forge.test", "{ok}");
        assert_eq!(ok["port"], port, "{ok}");
        assert_eq!(ok["addr"], format!("127.0.0.1:{port}"), "{ok}");
        assert_eq!(ok["allowed"], true, "{ok}");
        assert_eq!(ok["rule"], format!("--allow-host forge.test:{port}"), "{ok}");
        assert_eq!(ok["proto"], "forward", "{ok}");
        assert_eq!(ok["up"], hit.bytes_in, "{ok}");
        assert_eq!(ok["down"], hit.bytes_out, "{ok}");
        assert_eq!(no["host"], "other.test", "{no}");
        assert_eq!(no["port"], port, "{no}");
        assert_eq!(no["allowed"], false, "{no}");
        assert_eq!(no["rule"], "no --allow-host pattern matches", "{no}");
        assert_eq!(no["answer"], 403, "{no}");
        assert_eq!((no["up"].as_u64(), no["down"].as_u64()), (Some(0), Some(0)), "{no}");
        let e = r.egress_report();
        assert_eq!(
            e["allow_host"],
            serde_json::json!([format!("forge.test:{port}"), format!("127.0.0.1:{port}")])
        );
        assert_eq!(e["connections"], 2, "{e}");
        assert_eq!(e["tunnels"], 1, "{e}");
        assert_eq!(e["refused"], 1, "{e}");
        assert_eq!(e["bytes_up"], hit.bytes_in, "{e}");
        assert_eq!(e["bytes_down"], hit.bytes_out, "{e}");
        assert_eq!(e["refused_hosts"], serde_json::json!({ format!("other.test:{port}"): 1 }), "{e}");
        assert_eq!(e["by_rule"]["no --allow-host pattern matches"], 1, "{e}");
        assert_eq!(e["by_rule"][format!("--allow-host forge.test:{port}")], 1, "{e}");
    }
}

/// `--max-connections 1`: while one proxy connection is open, the
/// next is refused with a 429 naming the limit, and the report counts
/// it under the limit's rule: said, never silent.
#[test]
fn max_connections_reached_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    let mut args = allow_forge(port);
    args.extend(["--max-connections".into(), "1".into()]);
    // The first connection holds the only slot and says nothing.
    let script = format!(
        "import socket, subprocess, time\n\
         held = socket.create_connection((\"127.0.0.1\", 3128))\n\
         time.sleep(0.5)\n\
         subprocess.run([\"curl\", \"-sS\", \"-i\", \"--max-time\", \"20\", \"http://forge.test:{port}/\"])\n\
         held.close()\n"
    );
    for mode in MODES {
        let before = server.hits().len();
        let r = run(dir.path(), mode, &strs(&args), &["python3", "-c", &script]);
        if !r.ran() {
            assert_eq!(server.hits().len(), before, "the fallback reached the server");
            continue;
        }
        let out = r.stdout();
        assert!(out.starts_with("HTTP/1.1 429 Too Many Requests\r\n"), "{out}\n{}", r.stderr());
        assert!(
            out.contains(&format!(
                "X-Airlock-Refused: host=forge.test:{port}; rule=\"limit --max-connections\"\r\n"
            )),
            "{out}"
        );
        assert!(out.contains("The session's limit --max-connections is reached."), "{out}");
        assert_eq!(server.hits().len(), before, "a request past the limit reached the server");
        let e = r.egress_report();
        assert_eq!(e["by_rule"]["limit --max-connections"], 1, "{e}");
        assert_eq!(e["tunnels"], 0, "{e}");
        assert!(
            r.stderr().contains(
                "airlock: the session reached --max-connections 1: 1 proxy connection(s) past it were refused\n"
            ),
            "the limit was reached and airlock's stderr does not say so: {}",
            r.stderr()
        );
    }
}

/// `--allow-host` where it cannot work is refused before the child
/// runs, naming the flags: with `--no-sandbox` and with `--sandbox-net`
/// the child would have the host's whole network, and in the fallback
/// (no namespaces) the proxies' port would be open to it on every host.
#[test]
fn allow_host_without_a_network_namespace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let allow = format!("127.0.0.1:{}", server.port);
    let child = curl(&format!("http://127.0.0.1:{}/", server.port));
    for (mode, extra, says) in [
        (Mode::Namespaces, Some("--no-sandbox"), "with --no-sandbox the child has the host's whole network"),
        (Mode::Namespaces, Some("--sandbox-net"), "--allow-host and --sandbox-net contradict each other"),
        (Mode::Fallback, Some("--sandbox-net"), "--allow-host and --sandbox-net contradict each other"),
        (Mode::Fallback, None, "AIRLOCK_NO_NAMESPACES=1 switches namespaces off"),
    ] {
        let mut args: Vec<&str> = extra.into_iter().collect();
        args.extend(["--allow-host", &allow]);
        let r = run(dir.path(), mode, &args, &sh(&child));
        assert_eq!(r.code(), Some(REFUSED), "{mode:?} {extra:?}: {}", r.stderr());
        assert!(r.stderr().contains(says), "{mode:?} {extra:?}: {}", r.stderr());
        assert_eq!(r.stdout(), "", "{mode:?} {extra:?}: the child ran");
        assert!(r.report.is_none(), "{mode:?} {extra:?}: a refused run wrote a report");
    }
    assert!(server.hits().is_empty(), "{:?}", server.hits());
}

/// The `[egress]` section of `--config` does what the flags do: its
/// patterns and names let curl reach the server, and the report lists
/// them.
#[test]
fn the_config_section_allows_as_the_flags_do() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[egress]\nallow_host = [\"forge.test:{port}\", \"127.0.0.1:{port}\"]\n\
             [egress.resolve]\n\"forge.test\" = [\"127.0.0.1\"]\n"
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    for mode in MODES {
        let before = server.hits().len();
        let r =
            run(dir.path(), mode, &["--config", &config], &sh(&curl(&format!("http://forge.test:{port}/c"))));
        if !r.ran() {
            assert_eq!(server.hits().len(), before, "the fallback reached the server");
            continue;
        }
        assert!(r.stdout().starts_with("HTTP/1.0 200 OK\r\n"), "{}\n{}", r.stdout(), r.stderr());
        assert!(r.stdout().ends_with(&format!("{}curl=0\n", server.body())), "{}", r.stdout());
        assert_eq!(server.hits().len(), before + 1);
        let e = r.egress_report();
        let allowed = serde_json::json!([format!("forge.test:{port}"), format!("127.0.0.1:{port}")]);
        assert_eq!(e["allow_host"], allowed, "{e}");
        assert_eq!(e["tunnels"], 1, "{e}");
    }
}

/// `--max-egress-bytes` smaller than one exchange: the tunnel is cut
/// within the budget, the child never gets the body, the audit says the
/// limit ended it, and airlock's stderr says the limit was reached.
#[test]
fn max_egress_bytes_reached_is_said() {
    const BUDGET: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start();
    let port = server.port;
    let mut args = allow_forge(port);
    args.extend(["--max-egress-bytes".into(), BUDGET.to_string()]);
    for mode in MODES {
        let r = run(dir.path(), mode, &strs(&args), &sh(&curl(&format!("http://forge.test:{port}/big"))));
        if !r.ran() {
            continue;
        }
        assert!(!r.stdout().contains(&server.body()), "past the budget: {}", r.stdout());
        assert!(!r.stdout().ends_with("curl=0\n"), "{}", r.stdout());
        let lines = r.egress_lines();
        assert_eq!(lines.len(), 1, "{:?}", r.audit);
        assert_eq!(lines[0]["end"], "limit", "{}", lines[0]);
        let e = r.egress_report();
        let moved = e["bytes_up"].as_u64().unwrap() + e["bytes_down"].as_u64().unwrap();
        assert!(moved > 0 && moved <= BUDGET, "{e}");
        assert!(
            r.stderr().contains(&format!(
                "airlock: the session reached --max-egress-bytes {BUDGET}: 0 proxy connection(s) refused, 1 cut short\n"
            )),
            "the budget was reached and airlock's stderr does not say so: {}",
            r.stderr()
        );
    }
}

/// A directory served over HTTP by Python's `http.server` on the host's
/// 127.0.0.1 (a local package index, a dumb-HTTP git forge), its request
/// log kept; killed on drop.
struct Forge {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Forge {
    fn serve(root: &Path, log: &Path) -> Forge {
        let script = "import functools, http.server, sys\n\
                      h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
                      s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)\n\
                      print(s.server_port, flush=True)\n\
                      s.serve_forever()\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(root)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("the forge's port: {line:?}"));
        Forge { child, port, log: log.to_path_buf() }
    }

    /// The request lines the server logged (`"GET /path HTTP/1.1"`).
    fn requests(&self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(200));
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
            .collect()
    }
}

impl Drop for Forge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// On the host: a simple index (PEP 503) holding one handmade wheel, and
/// a bare repository served the dumb way (`git update-server-info`).
fn make_forge(root: &Path) {
    let wheel = "import base64, hashlib, os, sys, zipfile\n\
                 root = sys.argv[1]\n\
                 files = {\n\
                 \x20   'demo_pkg/__init__.py': 'VALUE = 42\\n',\n\
                 \x20   'demo_pkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\\nName: demo-pkg\\nVersion: 1.0\\n',\n\
                 \x20   'demo_pkg-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\\nGenerator: airlock-tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n',\n\
                 }\n\
                 def digest(b):\n\
                 \x20   return 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()\n\
                 record = ''.join(f'{p},{digest(t.encode())},{len(t.encode())}\\n' for p, t in files.items())\n\
                 files['demo_pkg-1.0.dist-info/RECORD'] = record + 'demo_pkg-1.0.dist-info/RECORD,,\\n'\n\
                 os.makedirs(f'{root}/packages')\n\
                 with zipfile.ZipFile(f'{root}/packages/demo_pkg-1.0-py3-none-any.whl', 'w') as z:\n\
                 \x20   for p, t in files.items():\n\
                 \x20       z.writestr(p, t)\n\
                 os.makedirs(f'{root}/simple/demo-pkg')\n\
                 with open(f'{root}/simple/index.html', 'w') as f:\n\
                 \x20   f.write('<html><body><a href=\"demo-pkg/\">demo-pkg</a></body></html>\\n')\n\
                 with open(f'{root}/simple/demo-pkg/index.html', 'w') as f:\n\
                 \x20   f.write('<html><body><a href=\"../../packages/demo_pkg-1.0-py3-none-any.whl\">demo_pkg-1.0-py3-none-any.whl</a></body></html>\\n')\n";
    let ok = Command::new("python3").args(["-c", wheel]).arg(root).status().unwrap();
    assert!(ok.success(), "making the index");
    let git = "set -e\n\
               git init -q -b main \"$1/src\"\n\
               cd \"$1/src\"\n\
               echo 'hello from the forge' > README\n\
               git add README\n\
               git -c user.name=t -c user.email=t@t commit -qm first\n\
               git clone -q --bare \"$1/src\" \"$1/repo.git\"\n\
               cd \"$1/repo.git\"\n\
               git update-server-info\n";
    let ok = Command::new("sh").args(["-c", git, "sh"]).arg(root).status().unwrap();
    assert!(ok.success(), "making the repository");
}

/// pip and git, unmodified, through the proxies: `pip install --target`
/// from a local simple index and `git clone` from a dumb-HTTP repository
/// reach the host's server by name when `--allow-host` allows it (the
/// name and its loopback address), and get nothing at all, the server
/// seeing no request, when the name is not allowed.
#[test]
fn pip_and_git_reach_a_local_index_and_forge_only_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("forge");
    make_forge(&root);
    let forge = Forge::serve(&root, &dir.path().join("forge.log"));
    let port = forge.port;
    let script = format!(
        "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --retries 0 --timeout 20 \
         --index-url http://forge.test:{port}/simple/ --trusted-host forge.test --target /tmp/site demo-pkg \
         >/tmp/pip.out 2>&1; echo \"pip=$?\"; \
         PYTHONPATH=/tmp/site python3 -c 'import demo_pkg; print(\"value\", demo_pkg.VALUE)'; \
         git -c http.lowSpeedTime=20 clone -q http://forge.test:{port}/repo.git /tmp/out >/tmp/git.out 2>&1; \
         echo \"git=$?\"; cat /tmp/out/README; cat /tmp/pip.out /tmp/git.out >&2"
    );
    for mode in MODES {
        let before = forge.requests().len();
        let r = run(dir.path(), mode, &strs(&allow_forge(port)), &sh(&script));
        if !r.ran() {
            assert_eq!(forge.requests().len(), before, "the fallback reached the forge");
            continue;
        }
        assert_eq!(r.stdout(), "pip=0\nvalue 42\ngit=0\nhello from the forge\n", "{}", r.stderr());
        let got = forge.requests()[before..].to_vec();
        assert!(got.iter().any(|l| l == "GET /simple/demo-pkg/ HTTP/1.1"), "{got:?}");
        assert!(got.iter().any(|l| l == "GET /packages/demo_pkg-1.0-py3-none-any.whl HTTP/1.1"), "{got:?}");
        assert!(
            got.iter().any(|l| l == "GET /repo.git/info/refs?service=git-upload-pack HTTP/1.1"),
            "{got:?}"
        );
        let reached: Vec<&Value> =
            r.audit.iter().filter(|l| l["op"] == "egress" && l["allowed"] == true).collect();
        assert!(reached.len() >= 3, "{:?}", r.audit);
        assert!(reached.iter().all(|l| l["host"] == "forge.test"), "{reached:?}");

        // The same, with only another name allowed: refused, and the
        // forge sees nothing.
        let before = forge.requests().len();
        let args = ["--resolve", "forge.test=127.0.0.1", "--allow-host", "pypi.org"];
        let r = run(dir.path(), mode, &args, &sh(&script));
        let out = r.stdout();
        assert!(out.starts_with("pip=1\n"), "{out}\n{}", r.stderr());
        assert!(out.contains("git=128\n"), "{out}\n{}", r.stderr());
        assert!(!out.contains("value 42") && !out.contains("hello from the forge"), "{out}");
        assert_eq!(forge.requests()[before..], [] as [String; 0], "the forge was reached");
        let refused: Vec<&Value> = r.audit.iter().filter(|l| l["op"] == "egress").collect();
        assert!(!refused.is_empty(), "{:?}", r.audit);
        assert!(
            refused.iter().all(|l| l["allowed"] == false && l["rule"] == "no --allow-host pattern matches"),
            "{refused:?}"
        );
    }
}
