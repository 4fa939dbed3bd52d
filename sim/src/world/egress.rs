//! The `egress` scenario: one session's egress machine, hostile clients on
//! its two listeners, and a simulated internet behind it.
//!
//! The world plays the shell and everything around it. Clients open
//! connections to the HTTP and SOCKS5 listeners and send CONNECTs, plain
//! requests and SOCKS5 requests for names and IP literals (in `inet_aton`
//! and IPv4-mapped forms) that the patterns allow, deny, or do not name;
//! their bytes arrive split at any byte, coalesced with pipelined requests
//! for other hosts, oversized, corrupt, a byte at a time, or never whole.
//! The simulated DNS answers from a fixed table in which some allowed names
//! lead to loopback, private or metadata addresses, and one (with
//! [`FaultKind::DnsRebind`]) answers a public address first and a private
//! one on every later lookup. Destinations refuse or never answer
//! ([`FaultKind::ConnectFail`]); tunnels carry bytes both ways within the
//! machine's credit, or stall when a client stops reading or a server never
//! answers ([`FaultKind::SlowTunnel`]); clients vanish at any point and the
//! clock jumps.
//!
//! Checked after every step:
//!
//! - `egress_destination` (DESIGN invariant 16): no connection is
//!   established to, and no byte delivered to, a destination this world's
//!   own reading of the patterns refuses for the host the client asked for,
//!   judged on the address actually connected to;
//! - `one_audit`: every close has exactly one audit record, and nothing is
//!   asked of a connection after its close;
//! - `refusal_said`: a client that sent a whole request and is still there
//!   is never closed without an answer (a complete HTTP response naming the
//!   rule, or a SOCKS5 reply), except past the hard cap of
//!   [`REFUSAL_SLACK`];
//! - `budget`: the bytes counted are the bytes moved, and never past
//!   `max_bytes`;
//! - `bounded_memory`: what the machine holds on the heap stays within its
//!   limits' allowance ([`Egress::heap_check`]);
//! - `liveness` and `session_end`: once clients stop, every connection
//!   closes within its timeouts, and after the session's end nothing is
//!   open (every tunnel closes with its session).

use super::Outcome;
use crate::swarm::{FaultKind, Rates, Swarm, PPM};
use crate::Failure;
use airlock_core::egress::{Config, ConnId, ConnectError, Egress, EgressBug, Input, Listener, Output, Rules};
use airlock_core::heapcount::{self, Tag};
use airlock_core::time::Instant;
use airlock_core::trace::egress as trace;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The machine's heap tag (0 is the world's own).
const HEAP: Tag = Tag::new(1);
/// Largest step of simulated time, in microseconds.
const MAX_STEP_US: u64 = 20_000;
/// Steps allowed after `max_steps` for everything to close.
const WIND_DOWN_STEPS: u64 = 100_000;

const ALLOW: &[&str] = &[
    "api.test:443",
    "*.cdn.test",
    "pypi.test",
    "local.test:8080",
    "127.0.0.1:8080",
    "rebind.test",
    "93.184.216.34",
];
const DENY: &[&str] = &["bad.cdn.test"];

/// What a client may ask for: the text it sends, the host it means
/// (normalized by hand, not by the core), the port.
const TARGETS: &[(&str, &str, u16)] = &[
    ("api.test", "api.test", 443),
    ("API.Test.", "api.test", 443),
    ("api.test", "api.test", 80),
    ("x.cdn.test", "x.cdn.test", 443),
    ("bad.cdn.test", "bad.cdn.test", 443),
    ("m.cdn.test", "m.cdn.test", 443),
    ("corp.cdn.test", "corp.cdn.test", 443),
    ("pypi.test", "pypi.test", 443),
    ("pypi.test", "pypi.test", 80),
    ("local.test", "local.test", 8080),
    ("local.test", "local.test", 22),
    ("rebind.test", "rebind.test", 443),
    ("evil.test", "evil.test", 443),
    ("nx.test", "nx.test", 443),
    ("127.0.0.1", "127.0.0.1", 8080),
    ("0x7f.1", "127.0.0.1", 8080),
    ("2130706433", "127.0.0.1", 22),
    ("[::ffff:127.0.0.1]", "127.0.0.1", 8080),
    ("10.0.0.5", "10.0.0.5", 443),
    ("169.254.169.254", "169.254.169.254", 80),
    ("93.184.216.34", "93.184.216.34", 443),
    ("0x5d.0xb8.0xd8.0x22", "93.184.216.34", 443),
];

/// The world's own reading of [`ALLOW`] and [`DENY`].
fn oracle_allows(host: &str, port: u16) -> bool {
    if host == "bad.cdn.test" {
        return false;
    }
    (host == "api.test" && port == 443)
        || host.ends_with(".cdn.test")
        || host == "pypi.test"
        || (host == "local.test" && port == 8080)
        || (host == "127.0.0.1" && port == 8080)
        || host == "rebind.test"
        || host == "93.184.216.34"
}

/// Addresses of this internet no name alone may reach.
fn special(ip: IpAddr) -> bool {
    ["127.0.0.1", "::1", "10.0.0.5", "169.254.169.254"].iter().any(|a| a.parse::<IpAddr>().ok() == Some(ip))
}

/// Whether a client that asked for `host`:`port` may reach `addr`.
fn oracle_reaches(host: &str, port: u16, addr: SocketAddr) -> bool {
    let named = addr == "127.0.0.1:8080".parse::<SocketAddr>().unwrap_or(addr) && port == 8080;
    oracle_allows(host, port) && addr.port() == port && (!special(addr.ip()) || named)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

/// The simulated DNS: `lookups` is how many times the name was asked
/// before.
fn dns(name: &str, lookups: u32, rebind: bool) -> Result<Vec<IpAddr>, String> {
    let v = |list: &[&str]| Ok(list.iter().map(|a| ip(a)).collect());
    match name {
        "api.test" => v(&["93.184.216.34"]),
        "x.cdn.test" | "bad.cdn.test" => v(&["104.16.0.1"]),
        "m.cdn.test" => v(&["169.254.169.254"]),
        "corp.cdn.test" => v(&["10.0.0.5", "104.16.0.1"]),
        "pypi.test" => v(&["151.101.0.223", "2a04:4e42::223"]),
        "local.test" => v(&["::1", "127.0.0.1"]),
        "rebind.test" if rebind && lookups > 0 => v(&["10.0.0.5"]),
        "rebind.test" => v(&["93.184.216.35"]),
        "evil.test" => v(&["6.6.6.6"]),
        _ => Err("no such host".to_owned()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Connect,
    Forward,
    Socks,
}

/// How a client behaves on one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Manner {
    Normal,
    /// Sends its head a byte at a time, slowly.
    Trickle,
    /// Sends part of its head and then nothing.
    Stall,
    /// Stops reading its tunnel.
    NoRead,
    /// Its server never answers.
    SilentServer,
}

struct Tunnel {
    /// Credit the machine granted and the world has not used.
    credit_up: u64,
    credit_down: u64,
    /// Bytes the client still has to send, the server to answer.
    up_left: u64,
    down_left: u64,
    ended: bool,
}

struct SimConn {
    client: usize,
    listener: Listener,
    host: &'static str,
    port: u16,
    /// Head bytes (and what the client pipelines behind them) not yet read.
    to_send: Vec<u8>,
    /// Whether the whole request was read by the machine.
    request_whole_at: usize,
    taken: usize,
    /// The one read the machine granted and the world has not answered.
    read: usize,
    /// A lookup the world will answer at this time.
    resolve: Option<(String, u64)>,
    connect: Option<(Vec<SocketAddr>, u64)>,
    peer: Option<SocketAddr>,
    tunnel: Option<Tunnel>,
    /// What the client received from airlock.
    got: Vec<u8>,
    manner: Manner,
    /// The client is gone (closed, died).
    gone: bool,
    /// The destination was reached: a success reply, or bytes for it.
    established: bool,
    closed: bool,
    audits: u32,
}

struct Client {
    ops_left: usize,
    open: usize,
}

struct World {
    rng: ChaCha8Rng,
    swarm: Swarm,
    rates: Rates,
    config: Config,
    m: Egress,
    now: u64,
    step: u64,
    clients: Vec<Client>,
    conns: BTreeMap<ConnId, SimConn>,
    next_conn: u64,
    lookups: BTreeMap<String, u32>,
    faults: BTreeMap<FaultKind, u64>,
    trace: Option<String>,
    failure: Option<Failure>,
    heap_base: u64,
    winding_down: bool,
    /// The session ends while connections are still open.
    abrupt_end: bool,
    /// Bytes the world moved or was sent for destinations, and back.
    moved: u64,
}

fn fail(invariant: &str, step: u64, conn: Option<ConnId>, message: String) -> Failure {
    Failure { invariant: invariant.to_owned(), step, message, level: None, client: conn.map(|c| c.0) }
}

pub(crate) fn config_for(rng: &mut ChaCha8Rng, bug: Option<EgressBug>) -> Config {
    let rules = Rules {
        allow: ALLOW.iter().map(|p| p.parse().expect("a valid pattern")).collect(),
        deny: DENY.iter().map(|p| p.parse().expect("a valid pattern")).collect(),
    };
    let mut config = Config::new(rules);
    config.max_connections = rng.gen_range(1..=8);
    config.max_bytes = if rng.gen_bool(0.3) { rng.gen_range(1_000..200_000) } else { 1 << 30 };
    config.max_head = if rng.gen_bool(0.3) { rng.gen_range(64..512) } else { 4096 };
    config.head_timeout = Duration::from_millis(rng.gen_range(500..3_000));
    config.connect_timeout = Duration::from_millis(rng.gen_range(500..3_000));
    config.idle_timeout = Duration::from_millis(rng.gen_range(500..5_000));
    config.window = rng.gen_range(512..65_536);
    config.planted_bug = bug;
    config
}

/// Run one egress world. `record`: keep a trace, whose header's meta notes
/// the failure when given.
pub(crate) fn run(seed: u64, swarm: Swarm, bug: Option<EgressBug>, record: Option<Option<Value>>) -> Outcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xe9_2e55);
    let config = config_for(&mut rng, bug);
    let trace = record.map(|note| {
        let mut header = trace::Header::new(&config);
        header.seed = Some(seed);
        let mut meta = serde_json::json!({ "scenario": "egress", "swarm": swarm });
        if let Some(note) = note {
            meta["failure"] = note;
        }
        header.meta = Some(meta);
        trace::header_line(&header)
    });
    let abrupt_end = rng.gen_bool(0.5);
    let heap_base = heapcount::live(HEAP).unwrap_or(0);
    let m = HEAP.scope(|| Egress::new(config.clone()));
    let clients = (0..swarm.clients.max(1))
        .map(|_| Client { ops_left: swarm.ops_per_client.min(60), open: 0 })
        .collect();
    let mut w = World {
        rng,
        rates: swarm.rates(),
        swarm,
        config,
        m,
        now: 0,
        step: 0,
        clients,
        conns: BTreeMap::new(),
        next_conn: 1,
        lookups: BTreeMap::new(),
        faults: BTreeMap::new(),
        trace,
        failure: None,
        heap_base,
        winding_down: false,
        abrupt_end: false,
        moved: 0,
    };
    w.abrupt_end = abrupt_end;
    w.run();
    Outcome {
        steps: w.step,
        now: w.now,
        faults: w.faults,
        failure: w.failure,
        trace: w.trace.map(String::into_bytes),
    }
}

impl World {
    fn fires(&mut self, kind: FaultKind) -> bool {
        let rate = self.rates.get(kind);
        if self.winding_down || rate == 0 {
            return false;
        }
        let hit = self.rng.gen_range(0..PPM) < rate;
        if hit {
            *self.faults.entry(kind).or_default() += 1;
        }
        hit
    }

    fn note(&mut self, text: &str) {
        if let Some(t) = &mut self.trace {
            t.push_str(&trace::note_line(text));
        }
    }

    fn violate(&mut self, invariant: &str, conn: Option<ConnId>, message: String) {
        if self.failure.is_none() {
            self.failure = Some(fail(invariant, self.step, conn, message));
        }
    }

    fn run(&mut self) {
        let max_steps = self.swarm.max_steps as u64;
        loop {
            if self.failure.is_some() {
                return;
            }
            self.step += 1;
            if self.step > max_steps || self.clients.iter().all(|c| c.ops_left == 0) {
                self.winding_down = true;
            }
            // The session ends when everything has closed, or (in half the
            // worlds) as soon as the clients stop, with tunnels still open.
            if self.winding_down && (self.abrupt_end || self.conns.values().all(|c| c.closed)) {
                break;
            }
            if self.step > max_steps.saturating_add(WIND_DOWN_STEPS) {
                let open: Vec<u64> =
                    self.conns.iter().filter(|(_, c)| !c.closed).map(|(id, _)| id.0).collect();
                self.violate(
                    "liveness",
                    None,
                    format!("connections {open:?} still open long after the clients stopped"),
                );
                return;
            }
            self.advance_time();
            self.act();
            self.check();
        }
        self.feed(Input::Shutdown);
        self.check();
        if self.failure.is_none() && self.m.open() != 0 {
            self.violate(
                "session_end",
                None,
                format!("{} connections open after the session ended", self.m.open()),
            );
        }
        if let Some((id, _)) = self.conns.iter().find(|(_, c)| !c.closed) {
            let id = *id;
            self.violate("session_end", Some(id), "a connection was never closed".into());
        }
    }

    fn advance_time(&mut self) {
        let mut dt = self.rng.gen_range(1..MAX_STEP_US);
        if self.fires(FaultKind::ClockJump) {
            dt += self.rng.gen_range(1_000_000..10_000_000);
            self.note("clock jumps");
        }
        self.now += dt;
        // Winding down with only timers left: skip to the next one.
        if self.winding_down && self.ready_actions().is_empty() {
            if let Some(t) = self.m.poll_timeout() {
                self.now = self.now.max(t.as_micros());
            }
        }
    }

    fn feed(&mut self, input: Input) {
        if let Some(t) = &mut self.trace {
            t.push_str(&trace::input_line(Instant::from_micros(self.now), &input));
        }
        let now = Instant::from_micros(self.now);
        HEAP.scope(|| self.m.handle(now, input));
        while let Some(o) = HEAP.scope(|| self.m.poll_output()) {
            if let Some(t) = &mut self.trace {
                t.push_str(&trace::output_line(&o));
            }
            self.output(o);
        }
    }

    /// What could happen now.
    fn ready_actions(&self) -> Vec<Action> {
        let mut acts = Vec::new();
        if self.m.poll_timeout().is_some_and(|t| t.as_micros() <= self.now) {
            acts.push(Action::Tick);
        }
        if !self.winding_down {
            for (i, c) in self.clients.iter().enumerate() {
                if c.ops_left > 0 && c.open < self.swarm.pipeline.max(1) {
                    acts.push(Action::Open(i));
                }
            }
        }
        for (id, c) in &self.conns {
            if c.closed {
                continue;
            }
            if c.read > 0 && !c.gone {
                let stalled = c.manner == Manner::Stall && c.taken > 0;
                if !c.to_send.is_empty() && !stalled {
                    acts.push(Action::Deliver(*id));
                } else if c.to_send.is_empty() && c.manner != Manner::Stall {
                    acts.push(Action::Eof(*id));
                }
            }
            if c.resolve.as_ref().is_some_and(|(_, at)| *at <= self.now) {
                acts.push(Action::Resolve(*id));
            }
            if c.connect.as_ref().is_some_and(|(_, at)| *at <= self.now) {
                acts.push(Action::Connect(*id));
            }
            if let Some(t) = &c.tunnel {
                if !t.ended {
                    acts.push(Action::Move(*id));
                }
            }
        }
        acts
    }

    fn act(&mut self) {
        let acts = self.ready_actions();
        if acts.is_empty() {
            return;
        }
        let a = acts[self.rng.gen_range(0..acts.len())];
        match a {
            Action::Tick => self.feed(Input::Tick),
            Action::Open(i) => self.open(i),
            Action::Deliver(id) => self.deliver(id),
            Action::Eof(id) => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.read = 0;
                }
                self.feed(Input::ClientGone { conn: id });
            }
            Action::Resolve(id) => self.answer_resolve(id),
            Action::Connect(id) => self.answer_connect(id),
            Action::Move(id) => self.move_bytes(id),
        }
        // A client may vanish at any point.
        if self.fires(FaultKind::ProcessDeath) || self.fires(FaultKind::Eof) {
            let open: Vec<ConnId> =
                self.conns.iter().filter(|(_, c)| !c.closed && !c.gone).map(|(id, _)| *id).collect();
            if !open.is_empty() {
                let id = open[self.rng.gen_range(0..open.len())];
                self.vanish(id);
            }
        }
    }

    fn vanish(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.gone = true;
        c.read = 0;
        let in_tunnel = c.tunnel.as_ref().is_some_and(|t| !t.ended);
        if let Some(t) = &mut c.tunnel {
            t.ended = true;
        }
        self.note(&format!("client of {} vanishes", id.0));
        if in_tunnel {
            self.feed(Input::RelayEnded { conn: id, error: Some("the client reset the connection".into()) });
        } else {
            self.feed(Input::ClientGone { conn: id });
        }
    }

    /// A client opens a connection and plans what it sends.
    fn open(&mut self, client: usize) {
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.clients[client].ops_left -= 1;
        self.clients[client].open += 1;
        let (text, host, port) = TARGETS[self.rng.gen_range(0..TARGETS.len())];
        let kind = [Kind::Connect, Kind::Forward, Kind::Socks][self.rng.gen_range(0..3)];
        let mut head = match kind {
            Kind::Connect => {
                format!("CONNECT {text}:{port} HTTP/1.1\r\nHost: {text}:{port}\r\n\r\n").into_bytes()
            }
            Kind::Forward => {
                let port_part = if port == 80 { String::new() } else { format!(":{port}") };
                format!("GET http://{text}{port_part}/simple/ HTTP/1.1\r\nUser-Agent: sim\r\nProxy-Connection: keep-alive\r\n\r\n")
                    .into_bytes()
            }
            Kind::Socks => {
                let mut b = vec![5, 1, 0, 5, 1, 0];
                match text.parse::<std::net::Ipv4Addr>() {
                    Ok(a) => {
                        b.push(1);
                        b.extend_from_slice(&a.octets());
                    }
                    Err(_) => {
                        b.push(3);
                        b.push(text.len() as u8);
                        b.extend_from_slice(text.as_bytes());
                    }
                }
                b.extend_from_slice(&port.to_be_bytes());
                b
            }
        };
        let listener = if kind == Kind::Socks { Listener::Socks } else { Listener::Http };
        let mut request_whole_at = head.len();
        // Hostile variants of the request.
        if self.fires(FaultKind::CorruptFrame) {
            let at = self.rng.gen_range(0..head.len());
            head[at] = self.rng.gen();
            request_whole_at = usize::MAX;
        } else if self.fires(FaultKind::NonUtf8Frame) {
            head = vec![0x16, 0x03, 0x01, 0xff, 0xfe, b'\r', b'\n', b'\r', b'\n'];
            request_whole_at = usize::MAX;
        } else if self.fires(FaultKind::OversizedFrame) {
            let filler = "X-Pad: ".to_owned() + &"p".repeat(self.config.max_head + 10) + "\r\n";
            head = format!("CONNECT api.test:443 HTTP/1.1\r\n{filler}\r\n").into_bytes();
            request_whole_at = usize::MAX;
        }
        if self.fires(FaultKind::CoalescedDelivery) {
            // A pipelined request for a host of the client's own choosing,
            // and early bytes.
            head.extend_from_slice(b"GET http://evil.test/steal HTTP/1.1\r\n\r\n\x16\x03\x01early");
        }
        let manner = if self.fires(FaultKind::SlowTunnel) {
            [Manner::Trickle, Manner::Stall, Manner::NoRead, Manner::SilentServer][self.rng.gen_range(0..4)]
        } else if self.fires(FaultKind::PartialFlood) {
            Manner::Stall
        } else {
            Manner::Normal
        };
        self.conns.insert(
            id,
            SimConn {
                client,
                listener,
                host,
                port,
                to_send: head,
                request_whole_at,
                taken: 0,
                read: 0,
                resolve: None,
                connect: None,
                peer: None,
                tunnel: None,
                got: Vec::new(),
                manner,
                gone: false,
                established: false,
                closed: false,
                audits: 0,
            },
        );
        self.feed(Input::Accepted { conn: id, listener });
    }

    fn deliver(&mut self, id: ConnId) {
        let split = self.fires(FaultKind::SplitDelivery);
        let Some(c) = self.conns.get_mut(&id) else { return };
        let mut n = c.read.min(c.to_send.len());
        if c.manner == Manner::Trickle {
            n = n.min(1);
        } else if split || c.manner == Manner::Stall {
            n = self.rng.gen_range(1..=n.max(1));
        }
        let data: Vec<u8> = c.to_send.drain(..n).collect();
        c.taken += n;
        c.read = 0;
        self.feed(Input::ClientBytes { conn: id, data });
    }

    fn answer_resolve(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let Some((name, _)) = c.resolve.take() else { return };
        let n = self.lookups.entry(name.clone()).or_default();
        let lookups = *n;
        *n += 1;
        let rebind = self.rates.get(FaultKind::DnsRebind) > 0;
        if rebind && name == "rebind.test" && lookups > 0 {
            *self.faults.entry(FaultKind::DnsRebind).or_default() += 1;
            self.note("dns: rebind.test now answers 10.0.0.5");
        }
        let result = dns(&name, lookups, rebind);
        self.feed(Input::Resolved { conn: id, result });
    }

    fn answer_connect(&mut self, id: ConnId) {
        let fail_it = self.fires(FaultKind::ConnectFail);
        let Some(c) = self.conns.get_mut(&id) else { return };
        let Some((addrs, _)) = c.connect.take() else { return };
        // The first address that answers: 6.6.6.6 never does, and a
        // refusing destination refuses.
        let reached = addrs.iter().find(|a| a.ip() != ip("6.6.6.6")).copied().filter(|_| !fail_it);
        let Some(peer) = reached else {
            let err = if fail_it { ConnectError::Refused } else { ConnectError::TimedOut };
            self.feed(Input::Connected { conn: id, result: Err(err) });
            return;
        };
        c.peer = Some(peer);
        // A connection is bytes reaching the destination already.
        if !oracle_reaches(c.host, c.port, peer) {
            let msg = format!("connected to {peer} for {}:{}", c.host, c.port);
            self.violate("egress_destination", Some(id), msg);
        }
        self.feed(Input::Connected { conn: id, result: Ok(peer) });
    }

    fn move_bytes(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let (host, port, peer, manner) = (c.host, c.port, c.peer, c.manner);
        let Some(t) = &mut c.tunnel else { return };
        let chunk = self.rng.gen_range(1..=16_384u64);
        let up = chunk.min(t.credit_up).min(t.up_left);
        let down = if manner == Manner::NoRead || manner == Manner::SilentServer {
            0
        } else {
            chunk.min(t.credit_down).min(t.down_left)
        };
        t.credit_up -= up;
        t.credit_down -= down;
        t.up_left -= up;
        t.down_left -= down;
        let finished = t.up_left == 0 && t.down_left == 0;
        if up > 0 {
            match peer {
                Some(p) if oracle_reaches(host, port, p) => {}
                other => {
                    let msg = format!("{up} bytes for {host}:{port} delivered to {other:?}");
                    self.violate("egress_destination", Some(id), msg);
                }
            }
        }
        self.moved += up + down;
        if up + down > 0 {
            self.feed(Input::Moved { conn: id, up, down });
        }
        if finished {
            if let Some(t) = self.conns.get_mut(&id).and_then(|c| c.tunnel.as_mut()) {
                if !t.ended {
                    t.ended = true;
                    self.feed(Input::RelayEnded { conn: id, error: None });
                }
            }
        }
    }

    fn output(&mut self, o: Output) {
        let id = match &o {
            Output::ReadClient { conn, .. }
            | Output::Send { conn, .. }
            | Output::Resolve { conn, .. }
            | Output::Connect { conn, .. }
            | Output::SendUpstream { conn, .. }
            | Output::Relay { conn, .. }
            | Output::Close { conn } => *conn,
            Output::Audit { record } => record.conn,
        };
        let now = self.now;
        let delay = |rng: &mut ChaCha8Rng| now + rng.gen_range(0..200_000);
        let Some(c) = self.conns.get_mut(&id) else {
            return self.violate(
                "one_audit",
                Some(id),
                format!("an output for a connection never accepted: {o:?}"),
            );
        };
        if c.closed && !matches!(o, Output::Audit { .. }) {
            return self.violate("one_audit", Some(id), format!("an output after its close: {o:?}"));
        }
        let mut broke: Option<(&'static str, String)> = None;
        let mut said: Option<airlock_core::egress::Record> = None;
        match o {
            Output::ReadClient { max, .. } => {
                if c.read != 0 {
                    broke = Some(("one_audit", "a second read granted before the first was answered".into()));
                }
                c.read = max;
            }
            Output::Send { data, .. } => {
                let success = data == airlock_core::egress::http::ESTABLISHED
                    || (c.listener == Listener::Socks && data.len() == 10 && data[1] == 0);
                c.established |= success;
                c.got.extend_from_slice(&data);
            }
            Output::Resolve { name, .. } => {
                // A lookup that never comes back, now and then.
                let at = if c.manner == Manner::SilentServer && self.rng.gen_bool(0.2) {
                    u64::MAX
                } else {
                    delay(&mut self.rng)
                };
                c.resolve = Some((name, at));
            }
            Output::Connect { addrs, .. } => c.connect = Some((addrs, delay(&mut self.rng))),
            Output::SendUpstream { data, .. } => {
                let ok = c.peer.is_some_and(|p| oracle_reaches(c.host, c.port, p));
                self.moved += data.len() as u64;
                c.established = true;
                if c.tunnel.is_none() {
                    let up_left = self.rng.gen_range(0..20_000);
                    let down_left = self.rng.gen_range(0..60_000);
                    c.tunnel =
                        Some(Tunnel { credit_up: 0, credit_down: 0, up_left, down_left, ended: false });
                }
                if !ok {
                    let msg = format!("{} bytes for {}:{} sent to {:?}", data.len(), c.host, c.port, c.peer);
                    broke = Some(("egress_destination", msg));
                }
            }
            Output::Relay { up, down, .. } => {
                if c.peer.is_none() {
                    broke = Some(("egress_destination", "credit for a connection never made".into()));
                }
                c.established = true;
                let t = c.tunnel.get_or_insert_with(|| Tunnel {
                    credit_up: 0,
                    credit_down: 0,
                    up_left: self.rng.gen_range(0..20_000),
                    down_left: self.rng.gen_range(0..60_000),
                    ended: false,
                });
                t.credit_up += up;
                t.credit_down += down;
            }
            Output::Close { .. } => {
                c.closed = true;
                c.read = 0;
                let client = c.client;
                self.clients[client].open = self.clients[client].open.saturating_sub(1);
            }
            Output::Audit { record } => {
                c.audits += 1;
                if !c.closed || c.audits > 1 {
                    broke = Some(("one_audit", format!("audit record {} for this connection", c.audits)));
                }
                if record.allowed && record.addr != c.peer {
                    broke = Some(("one_audit", format!("audited {:?}, reached {:?}", record.addr, c.peer)));
                }
                said = Some(record);
            }
        }
        if let Some((invariant, message)) = broke {
            self.violate(invariant, Some(id), message);
        }
        if let Some(record) = said {
            self.check_said(id, &record);
        }
    }

    /// A client still there that sent a whole request is answered before
    /// its connection closes: refused in words, or let through.
    fn check_said(&mut self, id: ConnId, record: &airlock_core::egress::Record) {
        let Some(c) = self.conns.get(&id) else { return };
        if c.gone || c.established || c.taken < c.request_whole_at {
            return;
        }
        // Past the hard cap a connection is closed unanswered, and only
        // then: every other refusal is said.
        if record.answer.is_none() && record.rule == "limit --max-connections" {
            return;
        }
        let said = match c.listener {
            Listener::Http => {
                let text = String::from_utf8_lossy(&c.got);
                text.starts_with("HTTP/1.1 ")
                    && text.contains("\r\nX-Airlock-Refused: ")
                    && text.contains("\r\n\r\n")
            }
            Listener::Socks => c.got.len() >= 12 && c.got[..2] == [5, 0] && c.got[2] == 5 && c.got[3] != 0,
        };
        if !said {
            let got = String::from_utf8_lossy(&c.got).into_owned();
            self.violate("refusal_said", Some(id), format!("closed with no answer; the client got {got:?}"));
        }
    }

    fn check(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let s = self.m.stats();
        if s.bytes_up + s.bytes_down != self.moved {
            let msg = format!("counted {} bytes, moved {}", s.bytes_up + s.bytes_down, self.moved);
            return self.violate("budget", None, msg);
        }
        if self.moved > self.config.max_bytes {
            return self.violate(
                "budget",
                None,
                format!("{} bytes moved, past {}", self.moved, self.config.max_bytes),
            );
        }
        if let Some(live) = heapcount::live(HEAP) {
            let held = live.wrapping_sub(self.heap_base);
            if let Err(m) = self.m.heap_check(held) {
                self.violate("bounded_memory", None, m);
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Tick,
    Open(usize),
    Deliver(ConnId),
    Eof(ConnId),
    Resolve(ConnId),
    Connect(ConnId),
    Move(ConnId),
}
