//! The egress machine, driven input by input: every path of a connection,
//! the refusals' transcripts (insta snapshots), and properties over
//! splits and hostile inputs.

use super::*;
use crate::egress::socks::Reply;
use crate::time::Instant;
use proptest::prelude::*;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

fn rules(allow: &[&str], deny: &[&str]) -> Rules {
    Rules {
        allow: allow.iter().map(|p| p.parse().unwrap()).collect(),
        deny: deny.iter().map(|p| p.parse().unwrap()).collect(),
    }
}

struct Harness {
    m: Egress,
    now: u64,
}

const C: ConnId = ConnId(1);

impl Harness {
    fn new(config: Config) -> Self {
        Harness { m: Egress::new(config), now: 0 }
    }

    fn with(allow: &[&str]) -> Self {
        Harness::new(Config::new(rules(allow, &[])))
    }

    fn feed(&mut self, input: Input) -> Vec<Output> {
        self.m.handle(Instant::from_micros(self.now), input);
        std::iter::from_fn(|| self.m.poll_output()).collect()
    }

    fn at(&mut self, d: Duration, input: Input) -> Vec<Output> {
        self.now += d.as_micros() as u64;
        self.feed(input)
    }

    fn accept(&mut self, conn: ConnId, listener: Listener) -> Vec<Output> {
        self.feed(Input::Accepted { conn, listener })
    }

    fn bytes(&mut self, conn: ConnId, data: &[u8]) -> Vec<Output> {
        self.feed(Input::ClientBytes { conn, data: data.to_vec() })
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Outputs as a person reads them: bytes as text where they are text.
fn transcript(outs: &[Output]) -> String {
    let mut s = String::new();
    for o in outs {
        let line = match o {
            Output::Send { conn, data } => format!("send {}: {}", conn.0, shown(data)),
            Output::SendUpstream { conn, data } => format!("send upstream {}: {}", conn.0, shown(data)),
            Output::Audit { record } => format!("audit {}", serde_json::to_string(record).unwrap()),
            other => serde_json::to_string(other).unwrap(),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

fn shown(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(t) => format!("{t:?}"),
        Err(_) => format!("{data:02x?}"),
    }
}

fn audit(outs: &[Output]) -> Record {
    outs.iter()
        .find_map(|o| match o {
            Output::Audit { record } => Some(record.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no audit record in {outs:?}"))
}

fn sent(outs: &[Output]) -> Vec<u8> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Send { data, .. } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn upstream(outs: &[Output]) -> Vec<u8> {
    outs.iter()
        .filter_map(|o| match o {
            Output::SendUpstream { data, .. } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn an_allowed_connect_is_resolved_checked_connected_and_relayed() {
    let mut h = Harness::with(&["pypi.org:443"]);
    assert_eq!(h.accept(C, Listener::Http), vec![Output::ReadClient { conn: C, max: DEFAULT_MAX_HEAD }]);
    let outs = h.bytes(C, b"CONNECT PyPI.org.:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n\x16\x03\x01hello");
    assert_eq!(outs, vec![Output::Resolve { conn: C, name: "pypi.org".into(), port: 443 }]);
    let outs = h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("151.101.0.223"), ip("10.0.0.1")]) });
    assert_eq!(outs, vec![Output::Connect { conn: C, addrs: vec![sa("151.101.0.223:443")] }]);
    let outs =
        h.at(Duration::from_millis(20), Input::Connected { conn: C, result: Ok(sa("151.101.0.223:443")) });
    insta::assert_snapshot!("connect_allowed", transcript(&outs));
    h.at(Duration::from_millis(10), Input::Moved { conn: C, up: 100, down: 5000 });
    let outs = h.at(Duration::from_millis(10), Input::RelayEnded { conn: C, error: None });
    let r = audit(&outs);
    assert_eq!(outs[0], Output::Close { conn: C });
    assert!(r.allowed);
    assert_eq!((r.up, r.down, r.duration_ms, r.end), (108, 5000, 40, End::Closed));
    assert_eq!(r.rule, "--allow-host pypi.org:443");
    assert_eq!(r.addr, Some(sa("151.101.0.223:443")));
    assert_eq!(h.m.stats().tunnels, 1);
    assert_eq!(h.m.open(), 0);
}

#[test]
fn a_refused_name_gets_a_403_naming_the_rule_and_nothing_is_looked_up() {
    let mut h = Harness::with(&["pypi.org:443"]);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n");
    insta::assert_snapshot!("connect_no_allow", transcript(&outs));
    let mut h = Harness::with(&["pypi.org:443"]);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"CONNECT pypi.org:8443 HTTP/1.1\r\n\r\n");
    assert!(String::from_utf8_lossy(&sent(&outs)).contains("--allow-host pypi.org:8443"));
    let mut h = Harness::new(Config::new(rules(&["*.example.com"], &["secret.example.com"])));
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"GET http://SECRET.example.com./x HTTP/1.1\r\n\r\n");
    insta::assert_snapshot!("forward_denied", transcript(&outs));
}

#[test]
fn a_name_resolving_to_loopback_is_refused_unless_the_address_is_allowed() {
    let mut h = Harness::with(&["localhost:8080"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"GET http://localhost:8080/ HTTP/1.1\r\n\r\n");
    let outs = h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("127.0.0.1"), ip("::1")]) });
    insta::assert_snapshot!("loopback_refused", transcript(&outs));

    let mut h = Harness::with(&["localhost:8080", "127.0.0.1"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"GET http://localhost:8080/ HTTP/1.1\r\n\r\n");
    let outs = h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("::1"), ip("127.0.0.1")]) });
    assert_eq!(outs, vec![Output::Connect { conn: C, addrs: vec![sa("127.0.0.1:8080")] }]);
    let outs = h.feed(Input::Connected { conn: C, result: Ok(sa("127.0.0.1:8080")) });
    assert_eq!(
        String::from_utf8(upstream(&outs)).unwrap(),
        "GET / HTTP/1.1\r\nHost: localhost:8080\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn ip_literals_in_every_form_are_their_address() {
    for target in ["0x7f.1", "2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]", "127.1"] {
        let mut h = Harness::with(&["*"]);
        h.accept(C, Listener::Http);
        let outs = h.bytes(C, format!("CONNECT {target}:22 HTTP/1.1\r\n\r\n").as_bytes());
        let r = audit(&outs);
        assert_eq!(r.host.as_deref(), Some("127.0.0.1"), "{target}");
        assert!(r.rule.starts_with("loopback address 127.0.0.1"), "{target}: {}", r.rule);
        assert!(!outs.iter().any(|o| matches!(o, Output::Connect { .. } | Output::Resolve { .. })));
    }
    let mut h = Harness::with(&["127.0.0.1:22"]);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"CONNECT 0x7f.1:22 HTTP/1.1\r\n\r\n");
    assert_eq!(outs, vec![Output::Connect { conn: C, addrs: vec![sa("127.0.0.1:22")] }]);
}

#[test]
fn the_address_connected_to_is_checked_again() {
    let mut h = Harness::with(&["pypi.org"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\nearly");
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("151.101.0.223")]) });
    // A shell that went its own way (a lookup of its own) reached
    // something else: nothing is sent to it, and the client is told.
    let outs = h.feed(Input::Connected { conn: C, result: Ok(sa("169.254.169.254:443")) });
    assert!(upstream(&outs).is_empty(), "{outs:?}");
    let r = audit(&outs);
    assert!(!r.allowed);
    assert!(r.rule.starts_with("metadata address 169.254.169.254"), "{}", r.rule);
    assert!(sent(&outs).starts_with(b"HTTP/1.1 403"));
    // A public address that was never offered is refused as well.
    let mut h = Harness::with(&["pypi.org"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\nearly");
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("151.101.0.223")]) });
    let outs = h.feed(Input::Connected { conn: C, result: Ok(sa("8.8.8.8:443")) });
    assert!(upstream(&outs).is_empty(), "{outs:?}");
    assert!(audit(&outs).rule.contains("never offered"));
    assert!(sent(&outs).starts_with(b"HTTP/1.1 502"));
}

#[test]
fn the_planted_bug_connects_where_a_second_lookup_leads() {
    let mut config = Config::new(rules(&["rebind.example"], &[]));
    config.planted_bug = Some(EgressBug::CheckFirstLookupOnly);
    let mut h = Harness::new(config);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT rebind.example:443 HTTP/1.1\r\n\r\n");
    let outs = h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("93.184.216.34")]) });
    assert!(matches!(outs[..], [Output::Resolve { .. }]));
    let outs = h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("10.0.0.5")]) });
    assert_eq!(outs, vec![Output::Connect { conn: C, addrs: vec![sa("10.0.0.5:443")] }]);
}

#[test]
fn a_head_split_anywhere_reads_as_it_does_whole() {
    let head: &[u8] = b"GET http://a.example/p HTTP/1.1\r\nHost: a.example\r\nX: y\r\n\r\nBODY";
    let whole = {
        let mut h = Harness::with(&["a.example"]);
        h.accept(C, Listener::Http);
        h.bytes(C, head)
    };
    for cut in 1..head.len() {
        let mut h = Harness::with(&["a.example"]);
        h.accept(C, Listener::Http);
        let first = h.bytes(C, &head[..cut]);
        let outs = if first.iter().any(|o| matches!(o, Output::ReadClient { .. })) {
            h.bytes(C, &head[cut..])
        } else {
            first
        };
        assert_eq!(outs, whole, "cut at {cut}");
    }
}

#[test]
fn a_pipelined_request_reaches_only_the_first_requests_origin() {
    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"GET http://a.example/ HTTP/1.1\r\n\r\nGET http://evil.example/ HTTP/1.1\r\n\r\n");
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("93.184.216.34")]) });
    let outs = h.feed(Input::Connected { conn: C, result: Ok(sa("93.184.216.34:80")) });
    assert_eq!(
        String::from_utf8(upstream(&outs)).unwrap(),
        "GET / HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\nGET http://evil.example/ HTTP/1.1\r\n\r\n"
    );
    assert!(outs.iter().all(|o| !matches!(o, Output::Resolve { .. } | Output::Connect { .. })));
}

#[test]
fn oversized_malformed_and_slow_heads_are_answered() {
    let mut config = Config::new(rules(&["*"], &[]));
    config.max_head = 64;
    let mut h = Harness::new(config);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, &[b'A'; 64]);
    insta::assert_snapshot!("head_too_large", transcript(&outs));

    let mut h = Harness::with(&["*"]);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\n");
    insta::assert_snapshot!("origin_form", transcript(&outs));

    let mut h = Harness::with(&["*"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT a.example:443 HTTP/1.1\r\n");
    assert_eq!(h.m.poll_timeout(), Some(Instant::from_micros(30_000_000)));
    let outs = h.at(Duration::from_secs(30), Input::Tick);
    assert!(sent(&outs).starts_with(b"HTTP/1.1 408 Request Timeout\r\n"), "{}", transcript(&outs));
    assert_eq!(h.m.open(), 0);
}

#[test]
fn lookups_and_connects_that_fail_or_hang_are_answered() {
    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT a.example:443 HTTP/1.1\r\n\r\n");
    let outs = h.feed(Input::Resolved { conn: C, result: Err("no such host".into()) });
    assert!(sent(&outs).starts_with(b"HTTP/1.1 502 Bad Gateway\r\n"));

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Http);
    h.bytes(C, b"CONNECT a.example:443 HTTP/1.1\r\n\r\n");
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("93.184.216.34")]) });
    let outs = h.at(Duration::from_secs(31), Input::Tick);
    assert!(sent(&outs).starts_with(b"HTTP/1.1 504 Gateway Timeout\r\n"), "{}", transcript(&outs));
    // A late answer for a connection already closed changes nothing.
    assert!(h.feed(Input::Connected { conn: C, result: Ok(sa("93.184.216.34:443")) }).is_empty());

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    h.bytes(C, b"\x05\x01\x00\x05\x01\x00\x03\x09a.example\x01\xbb");
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("93.184.216.34")]) });
    let outs = h.feed(Input::Connected { conn: C, result: Err(ConnectError::Refused) });
    assert_eq!(sent(&outs), Reply::ConnectionRefused.bytes());
}

#[test]
fn socks_clients_are_served_and_refused_in_socks() {
    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    let outs = h.bytes(C, b"\x05\x01\x00");
    assert_eq!(sent(&outs), vec![5, 0]);
    let outs = h.bytes(C, b"\x05\x01\x00\x03\x09a.example\x01\xbbEARLY");
    assert_eq!(outs, vec![Output::Resolve { conn: C, name: "a.example".into(), port: 443 }]);
    h.feed(Input::Resolved { conn: C, result: Ok(vec![ip("93.184.216.34")]) });
    let outs = h.feed(Input::Connected { conn: C, result: Ok(sa("93.184.216.34:443")) });
    assert_eq!(sent(&outs), Reply::Succeeded.bytes());
    assert_eq!(upstream(&outs), b"EARLY");

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    let outs = h.bytes(C, b"\x05\x01\x00\x05\x01\x00\x03\x0cevil.example\x01\xbb");
    insta::assert_snapshot!("socks_refused", transcript(&outs));

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    let outs = h.bytes(C, b"\x05\x01\x02");
    assert_eq!(sent(&outs), vec![5, 0xff]);
    assert!(matches!(outs.last(), Some(Output::Audit { .. })));

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    let outs = h.bytes(C, b"\x05\x01\x00\x05\x03\x00\x01\x01\x02\x03\x04\x00\x35");
    assert_eq!(sent(&outs), [&[5u8, 0][..], &Reply::CommandNotSupported.bytes()].concat());

    let mut h = Harness::with(&["a.example"]);
    h.accept(C, Listener::Socks);
    let outs = h.bytes(C, b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00");
    assert_eq!(sent(&outs), socks::SOCKS4_REJECTED);
}

#[test]
fn connections_past_the_limit_are_told_then_closed_unanswered() {
    let mut config = Config::new(rules(&["*"], &[]));
    config.max_connections = 2;
    let mut h = Harness::new(config);
    for n in 0..2 {
        h.accept(ConnId(n), Listener::Http);
    }
    h.accept(ConnId(2), Listener::Http);
    let outs = h.bytes(ConnId(2), b"CONNECT a.example:443 HTTP/1.1\r\n\r\n");
    insta::assert_snapshot!("max_connections", transcript(&outs));
    for n in 3..3 + REFUSAL_SLACK as u64 {
        h.accept(ConnId(n), Listener::Http);
    }
    let outs = h.accept(ConnId(100), Listener::Http);
    assert_eq!(outs[0], Output::Close { conn: ConnId(100) });
    assert_eq!(audit(&outs).rule, "limit --max-connections");
    assert_eq!(h.m.open(), 2 + REFUSAL_SLACK);
}

fn tunnel(h: &mut Harness, conn: ConnId) -> Vec<Output> {
    h.accept(conn, Listener::Http);
    h.bytes(conn, b"CONNECT a.example:443 HTTP/1.1\r\n\r\n");
    h.feed(Input::Resolved { conn, result: Ok(vec![ip("93.184.216.34")]) });
    h.feed(Input::Connected { conn, result: Ok(sa("93.184.216.34:443")) })
}

#[test]
fn the_byte_budget_is_never_granted_past_and_its_end_is_said() {
    let mut config = Config::new(rules(&["a.example"], &[]));
    config.max_bytes = 10_000;
    config.window = 4096;
    let mut h = Harness::new(config);
    let outs = tunnel(&mut h, C);
    assert_eq!(outs.last(), Some(&Output::Relay { conn: C, up: 4096, down: 4096 }));
    let outs = h.feed(Input::Moved { conn: C, up: 4096, down: 4000 });
    assert_eq!(outs, vec![Output::Relay { conn: C, up: 1808, down: 0 }]);
    let outs = h.feed(Input::Moved { conn: C, up: 1808, down: 96 });
    let r = audit(&outs);
    assert_eq!((r.end, r.rule.as_str(), r.up + r.down), (End::Limit, "--allow-host a.example", 10_000));
    // A new connection is refused once the budget is spent.
    h.accept(ConnId(2), Listener::Http);
    let outs = h.bytes(ConnId(2), b"CONNECT a.example:443 HTTP/1.1\r\n\r\n");
    assert!(sent(&outs).starts_with(b"HTTP/1.1 403"));
    assert_eq!(h.m.stats().bytes_up + h.m.stats().bytes_down, 10_000);
}

#[test]
fn idle_tunnels_close_and_the_session_end_closes_everything() {
    let mut h = Harness::with(&["a.example"]);
    tunnel(&mut h, C);
    h.at(Duration::from_secs(200), Input::Moved { conn: C, up: 1, down: 0 });
    assert!(h.at(Duration::from_secs(299), Input::Tick).is_empty());
    let outs = h.at(Duration::from_secs(1), Input::Tick);
    assert_eq!(audit(&outs).end, End::Idle);

    let mut h = Harness::with(&["a.example"]);
    tunnel(&mut h, ConnId(1));
    h.accept(ConnId(2), Listener::Http);
    h.accept(ConnId(3), Listener::Socks);
    let outs = h.feed(Input::Shutdown);
    insta::assert_snapshot!("shutdown", transcript(&outs));
    assert_eq!(h.m.open(), 0);
    let outs = h.accept(ConnId(4), Listener::Http);
    assert_eq!(outs[0], Output::Close { conn: ConnId(4) });
}

#[test]
fn static_names_are_never_looked_up_and_still_checked() {
    let mut config = Config::new(rules(&["forge.test"], &[]));
    config.hosts.insert("forge.test".into(), vec![ip("127.0.0.1")]);
    let mut h = Harness::new(config.clone());
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"CONNECT forge.test:443 HTTP/1.1\r\n\r\n");
    assert!(audit(&outs).rule.starts_with("loopback address"));
    config.rules = rules(&["forge.test", "127.0.0.1"], &[]);
    let mut h = Harness::new(config);
    h.accept(C, Listener::Http);
    let outs = h.bytes(C, b"CONNECT forge.test:443 HTTP/1.1\r\n\r\n");
    assert_eq!(outs, vec![Output::Connect { conn: C, addrs: vec![sa("127.0.0.1:443")] }]);
}

/// A hostile input stream for [`machine_inputs`].
fn any_input() -> impl Strategy<Value = Input> {
    let conn = (0u64..4).prop_map(ConnId);
    let addr = prop_oneof![
        Just(ip("93.184.216.34")),
        Just(ip("127.0.0.1")),
        Just(ip("10.0.0.5")),
        Just(ip("169.254.169.254")),
        Just(ip("::1")),
    ];
    let heads = prop_oneof![
        Just(b"CONNECT a.example:443 HTTP/1.1\r\n\r\n".to_vec()),
        Just(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n".to_vec()),
        Just(b"GET http://a.example/ HTTP/1.1\r\n\r\nmore".to_vec()),
        Just(b"\x05\x01\x00\x05\x01\x00\x03\x09a.example\x01\xbb".to_vec()),
        Just(b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x16".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    prop_oneof![
        (conn.clone(), any::<bool>()).prop_map(|(conn, s)| Input::Accepted {
            conn,
            listener: if s { Listener::Socks } else { Listener::Http }
        }),
        (conn.clone(), heads, 0usize..50).prop_map(|(conn, h, cut)| {
            let cut = cut.min(h.len());
            Input::ClientBytes { conn, data: h[..cut.max(1).min(h.len())].to_vec() }
        }),
        conn.clone().prop_map(|conn| Input::ClientGone { conn }),
        (conn.clone(), proptest::collection::vec(addr.clone(), 0..3))
            .prop_map(|(conn, a)| Input::Resolved { conn, result: Ok(a) }),
        (conn.clone(), addr, any::<u16>())
            .prop_map(|(conn, a, p)| Input::Connected { conn, result: Ok(SocketAddr::new(a, p % 2 + 442)) }),
        (conn.clone(), 0u64..10_000, 0u64..10_000).prop_map(|(conn, up, down)| Input::Moved {
            conn,
            up,
            down
        }),
        conn.prop_map(|conn| Input::RelayEnded { conn, error: None }),
        Just(Input::Tick),
    ]
}

proptest! {
    /// Whatever arrives in whatever order: nothing reaches a destination
    /// before a `Connect` to an address the rules pass and a `Connected`
    /// naming it; no connection holds more than its heads; every
    /// `Close` comes with one audit record; the budget holds.
    #[test]
    fn machine_inputs(inputs in proptest::collection::vec((0u64..5_000_000, any_input()), 1..60)) {
        let mut config = Config::new(rules(&["a.example:443", "127.0.0.1:443"], &[]));
        config.max_bytes = 50_000;
        config.window = 8192;
        config.max_connections = 2;
        let mut m = Egress::new(config.clone());
        let mut now = 0;
        let mut connected: std::collections::BTreeMap<ConnId, SocketAddr> = Default::default();
        let mut offered: std::collections::BTreeMap<ConnId, Vec<SocketAddr>> = Default::default();
        let mut closes = 0;
        let mut audits = 0;
        for (dt, input) in inputs.into_iter().chain([(0, Input::Shutdown)]) {
            now += dt;
            if let Input::Connected { conn, result: Ok(peer) } = &input {
                if m.is_open(*conn) && offered.get(conn).is_some_and(|o| o.contains(peer)) {
                    connected.insert(*conn, *peer);
                }
            }
            m.handle(Instant::from_micros(now), input);
            while let Some(o) = m.poll_output() {
                match o {
                    Output::Connect { conn, addrs } => {
                        for a in &addrs {
                            prop_assert!(config.rules.check_address(a.ip(), a.port()).is_ok(), "{a}");
                        }
                        offered.insert(conn, addrs);
                    }
                    Output::SendUpstream { conn, .. } | Output::Relay { conn, .. } => {
                        let peer = connected.get(&conn);
                        prop_assert!(peer.is_some(), "bytes for {conn} before a checked connect");
                        let peer = peer.copied().unwrap();
                        prop_assert!(config.rules.check_address(peer.ip(), peer.port()).is_ok());
                    }
                    Output::Close { conn } => {
                        closes += 1;
                        connected.remove(&conn);
                        offered.remove(&conn);
                    }
                    Output::Audit { .. } => audits += 1,
                    _ => {}
                }
            }
            let s = m.stats();
            prop_assert!(s.bytes_up + s.bytes_down <= config.max_bytes);
            prop_assert!(m.open() <= config.max_connections + REFUSAL_SLACK);
        }
        prop_assert_eq!(m.open(), 0);
        prop_assert_eq!(closes, audits);
    }
}
