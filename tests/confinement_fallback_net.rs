//! The network of the fallback without a network namespace (issue 39).
//! Landlock refuses `bind` and `connect`, but a `sendto` with
//! MSG_FASTOPEN connects to a host listener and delivers data, and a
//! `listen` without `bind` binds 0.0.0.0 on a port the network can reach.
//! Without `--sandbox-net` no internet socket is created at all, so
//! neither gets out, and the report's `net: denied` is true. With
//! namespaces the child's network is its own loopback. Both modes, as
//! root and as uid 65534; the same attack with `--sandbox-net` in the
//! fallback shows what it reaches when the network is granted.

mod common;
mod confine_common;
mod confine_who;

use confine_common::Mode;
use confine_who::*;
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a host listener saw: connections and the bytes they carried.
struct HostListener {
    port: u16,
    got: Arc<Mutex<(usize, Vec<u8>)>>,
    _thread: confine_common::Background,
}

impl HostListener {
    fn start() -> HostListener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new((0, Vec::new())));
        let g = got.clone();
        let thread = confine_common::Background::start(move || {
            while let Ok((mut s, _)) = l.accept() {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                let mut g = g.lock().unwrap();
                g.0 += 1;
                g.1.extend_from_slice(&buf);
            }
        });
        HostListener { port, got, _thread: thread }
    }
}

struct Outcome {
    got: std::collections::BTreeMap<String, String>,
    host_connected_to_child: bool,
    listener: (usize, Vec<u8>),
    report: serde_json::Value,
    text: String,
}

/// Run the attack; when the child says it listens, the host connects to
/// the port it names.
fn attack(f: &Fixture, mode: Mode, args: &[&str], marker: &str) -> Outcome {
    let host = HostListener::start();
    let report = f.report_path();
    let cmd = f.attack("net_fallback.py", &[host.port.to_string(), marker.to_owned()]);
    let mut airlock = f
        .run_command(mode, args, &report, &cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = String::new();
    let mut host_connected_to_child = false;
    for line in BufReader::new(airlock.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Ok(serde_json::Value::Array(v)) = serde_json::from_str::<serde_json::Value>(&line) {
            if v[0] == "listen" && v[1] == "ok" {
                let port: u16 = v[2].as_str().unwrap().parse().unwrap();
                host_connected_to_child |=
                    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))
                        .is_ok();
            }
        }
        text.push_str(&line);
        text.push('\n');
    }
    let mut err = String::new();
    airlock.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = airlock.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{mode:?}: {text}\n{err}");
    std::thread::sleep(Duration::from_millis(200));
    let listener = host.got.lock().unwrap().clone();
    let report = read_report(&report, &format!("{mode:?}"), &err);
    Outcome { got: outcomes(&text), host_connected_to_child, listener, report, text }
}

#[test]
fn without_the_network_no_internet_socket_gets_out() {
    for (mode, who) in cases() {
        let ctx = format!("{mode:?} as {who:?}");
        let f = Fixture::new(who);
        let marker = format!("airlock-tfo-{}", confine_common::unique());
        let o = attack(&f, mode, &[], &marker);
        let (connections, data) = &o.listener;
        assert_eq!(*connections, 0, "{ctx}: a host listener accepted the child's connection: {}", o.text);
        assert!(!String::from_utf8_lossy(data).contains(&marker), "{ctx}: Fast Open delivered data");
        assert_ne!(outcome(&o.got, "fastopen"), "ok", "{ctx}: {}", o.text);
        assert!(!o.host_connected_to_child, "{ctx}: the host reached the child's listen() port: {}", o.text);
        assert_eq!(outcome(&o.got, "done"), "ok");
        assert_eq!(o.report["sandbox"]["net"], "denied", "{ctx}: {}", o.report);
        let gaps = gaps(&o.report);
        assert!(!gaps.iter().any(|g| g == "tcp" || g == "udp"), "{ctx}: {gaps:?}");
        if mode == Mode::Fallback {
            for label in
                ["inet stream", "inet6 stream", "inet dgram", "inet6 dgram", "inet seqpacket", "listen"]
            {
                assert_eq!(outcome(&o.got, label), "EACCES", "{ctx}: {label}: {}", o.text);
            }
        } else {
            // Its own loopback: sockets, but nothing of the host's.
            assert_eq!(outcome(&o.got, "inet stream"), "ok", "{ctx}: {}", o.text);
        }
    }
}

/// The control: with `--sandbox-net` in the fallback the same Fast Open
/// reaches the host listener with its data, and the host reaches the
/// child's unbound listener: what the refusal above stops is real.
#[test]
fn with_the_network_granted_the_same_attack_gets_out() {
    for who in WHOS {
        let f = Fixture::new(who);
        let marker = format!("airlock-tfo-{}", confine_common::unique());
        let o = attack(&f, Mode::Fallback, &["--sandbox-net"], &marker);
        assert!(String::from_utf8_lossy(&o.listener.1).contains(&marker), "{who:?}: no data: {}", o.text);
        assert!(o.host_connected_to_child, "{who:?}: {}", o.text);
        assert_eq!(o.report["sandbox"]["net"], "allowed", "{who:?}: {}", o.report);
    }
}

fn gaps(report: &serde_json::Value) -> Vec<String> {
    report["sandbox"]["not_enforced"]
        .as_array()
        .unwrap_or_else(|| panic!("no sandbox.not_enforced: {report}"))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}
