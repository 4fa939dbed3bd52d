//! The egress machine: every proxy connection of one session, sans-I/O.
//!
//! The shell accepts a connection on the HTTP or SOCKS5 listener inside
//! the child's network namespace and says so ([`Input::Accepted`]). From
//! then on the machine decides and the shell only carries out:
//!
//! 1. Head. The machine grants one read at a time ([`Output::ReadClient`],
//!    at most what the head may still grow by); the shell answers with
//!    [`Input::ClientBytes`] or [`Input::ClientGone`]. The request is read
//!    however it is split; bytes behind it (a TLS hello sent early, a
//!    pipelined request) are kept, bounded by the head limit, for the
//!    destination.
//! 2. Decision: deny patterns, then allow patterns, on the normalized host
//!    and port ([`Rules::check_request`]).
//! 3. Resolution: an IP literal is its own address, a `--resolve` name
//!    has its configured ones, any other name is looked up by the shell
//!    ([`Output::Resolve`], answered by [`Input::Resolved`]). Every
//!    address is checked ([`Rules::check_address`]); only those that pass
//!    are offered to connect to, in order ([`Output::Connect`]).
//! 4. Connection: [`Input::Connected`] names the peer actually reached;
//!    it is checked again (it must be one offered, and pass), so no lookup
//!    the shell might make on its own can lead anywhere else. Only then does
//!    anything reach it: the CONNECT or SOCKS success reply to the client,
//!    the rewritten head of a plain request and the early bytes upstream.
//! 5. Tunnel: the shell moves bytes both ways within the credit the
//!    machine grants ([`Output::Relay`], at most [`Config::window`] ahead
//!    per direction and never past the session's byte budget), reporting
//!    each move ([`Input::Moved`]); the machine counts, tops up, and ends
//!    the tunnel when the budget is spent, when it is idle past
//!    [`Config::idle_timeout`], or when the shell reports both directions
//!    done ([`Input::RelayEnded`]).
//!
//! Every refusal is said: an HTTP answer (403 for the policy, 429 for the
//! connection limit, 400/431 for what cannot be read, 502/504 when the
//! destination cannot be reached, 408 for a head that never came, 503 at
//! the session's end) with the rule in `X-Airlock-Refused` and in the
//! body, or a SOCKS5 reply code. Every connection ends with one
//! [`Record`] ([`Output::Audit`]): host, port, address, bytes each way,
//! duration, the rule that decided, how it ended.
//!
//! Memory: at most [`Config::max_connections`] connections plus
//! [`REFUSAL_SLACK`] being refused, each holding at most three heads'
//! worth of bytes; beyond that a connection is closed at once (and
//! audited).

use super::decide::{Rule, Rules};
use super::host::{canonical_ip, Host};
use super::http::{self, HeadError, Parsed, Request};
use super::socks::{self, Reply};
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Connections open at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Bytes a session may move through the proxies, both ways together.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;
/// The largest request head (and the most bytes kept behind it).
pub const DEFAULT_MAX_HEAD: usize = 16 << 10;
/// From accept to a whole request.
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// From the request to the connection: lookup and connect together.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A tunnel with no byte either way for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Credit granted ahead, per direction and tunnel.
pub const DEFAULT_WINDOW: u64 = 4 << 20;
/// Connections past the limit that are still read and answered (429 or a
/// SOCKS refusal) rather than closed unanswered.
pub const REFUSAL_SLACK: usize = 16;
/// Addresses of one lookup that are considered.
pub const MAX_ADDRS: usize = 16;
/// Distinct refused `host:port` pairs the statistics keep.
pub const MAX_REFUSED_HOSTS: usize = 256;
/// What one connection's state costs on the heap beside its buffers.
pub const HEAP_PER_CONN: u64 = 4 << 10;
/// What one entry of the statistics' maps or the config costs.
pub const HEAP_PER_ENTRY: u64 = 512;
/// The machine's own allocations past what its limits account for (its
/// output queue's capacity among them).
pub const HEAP_SLACK: u64 = 64 << 10;

/// A connection, numbered by the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "egress#{}", self.0)
    }
}

/// Which listener a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Listener {
    Http,
    Socks,
}

/// What a connection turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Proto {
    /// On the HTTP listener, before its request was read.
    Http,
    /// `CONNECT host:port`.
    Connect,
    /// A plain `http://` request.
    Forward,
    Socks5,
}

/// Why a connect failed, as the shell saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectError {
    Refused,
    TimedOut,
    Unreachable,
    Other(String),
}

/// A planted defect, for the simulator to find: never set by the
/// production shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressBug {
    /// The addresses of a first lookup are checked, then the name is
    /// looked up again and whatever that gives is connected to, unchecked,
    /// with no check on the peer either: DNS rebinding gets through.
    CheckFirstLookupOnly,
}

/// The machine's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub rules: Rules,
    /// `--resolve NAME=ADDR`: names the machine answers itself (normalized
    /// names), never looked up.
    #[serde(default)]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    pub max_connections: usize,
    pub max_bytes: u64,
    pub max_head: usize,
    pub head_timeout: Duration,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub window: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted_bug: Option<EgressBug>,
}

impl Config {
    pub fn new(rules: Rules) -> Self {
        Config {
            rules,
            hosts: BTreeMap::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_bytes: DEFAULT_MAX_BYTES,
            max_head: DEFAULT_MAX_HEAD,
            head_timeout: DEFAULT_HEAD_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            window: DEFAULT_WINDOW,
            planted_bug: None,
        }
    }
}

/// What the shell reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    Accepted {
        conn: ConnId,
        listener: Listener,
    },
    /// The answer to one [`Output::ReadClient`].
    ClientBytes {
        conn: ConnId,
        #[serde(with = "crate::b64")]
        data: Vec<u8>,
    },
    /// The client closed or failed before its tunnel was up.
    ClientGone {
        conn: ConnId,
    },
    Resolved {
        conn: ConnId,
        result: Result<Vec<IpAddr>, String>,
    },
    /// The peer actually connected to, or why none was.
    Connected {
        conn: ConnId,
        result: Result<SocketAddr, ConnectError>,
    },
    /// Bytes the shell moved client→destination (`up`) and back (`down`).
    Moved {
        conn: ConnId,
        up: u64,
        down: u64,
    },
    /// Both directions of a tunnel are done (or one failed).
    RelayEnded {
        conn: ConnId,
        error: Option<String>,
    },
    /// A deadline from [`Egress::poll_timeout`] may have passed.
    Tick,
    /// The session ends: every connection closes.
    Shutdown,
}

/// What the shell does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// Read at most `max` bytes from the client, once.
    ReadClient {
        conn: ConnId,
        max: usize,
    },
    /// Write to the client.
    Send {
        conn: ConnId,
        #[serde(with = "crate::b64")]
        data: Vec<u8>,
    },
    /// Look `name` up (for `port`).
    Resolve {
        conn: ConnId,
        name: String,
        port: u16,
    },
    /// Connect to the first of `addrs` that answers, in order.
    Connect {
        conn: ConnId,
        addrs: Vec<SocketAddr>,
    },
    /// Write to the destination.
    SendUpstream {
        conn: ConnId,
        #[serde(with = "crate::b64")]
        data: Vec<u8>,
    },
    /// More credit: the shell may move `up` more bytes to the
    /// destination and `down` more back.
    Relay {
        conn: ConnId,
        up: u64,
        down: u64,
    },
    /// Close both sides once what was sent is written; the connection is
    /// forgotten (later inputs for it are ignored).
    Close {
        conn: ConnId,
    },
    Audit {
        record: Record,
    },
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Refused before anything reached a destination.
    Refused,
    /// The tunnel ended: both sides done.
    Closed,
    /// A relay error ended it.
    Failed,
    /// No byte either way for the idle timeout.
    Idle,
    /// The session's byte budget ran out.
    Limit,
    /// The client left before its tunnel was up.
    ClientGone,
    SessionEnded,
}

/// One connection, audited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub conn: ConnId,
    pub proto: Proto,
    pub host: Option<String>,
    pub port: Option<u16>,
    /// The address connected to.
    pub addr: Option<SocketAddr>,
    /// Whether a tunnel (or a forwarded request) reached the destination.
    pub allowed: bool,
    /// The rule that decided.
    pub rule: String,
    /// What the client was answered: an HTTP status, or a SOCKS reply code.
    pub answer: Option<u16>,
    pub up: u64,
    pub down: u64,
    pub duration_ms: u64,
    pub end: End,
}

/// The session's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub connections: u64,
    /// Connections whose destination was reached.
    pub tunnels: u64,
    pub refused: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub peak_open: u64,
    /// Connections by the kind of rule that decided.
    pub by_rule: BTreeMap<String, u64>,
    /// Refused `host:port`, with counts (the first [`MAX_REFUSED_HOSTS`]).
    pub refused_hosts: BTreeMap<String, u64>,
    /// Refusals of hosts past that.
    pub refused_hosts_dropped: u64,
}

enum Phase {
    /// Reading the HTTP head or the SOCKS greeting; `reading` is the
    /// read granted and not yet answered (0: none).
    Head {
        buf: Vec<u8>,
        reading: usize,
    },
    /// SOCKS: the greeting is answered, the request is being read.
    SocksRequest {
        buf: Vec<u8>,
        reading: usize,
    },
    /// A lookup is out; `again` under the planted bug's second lookup.
    Resolving {
        again: bool,
    },
    Connecting {
        unchecked: bool,
    },
    Tunnel,
}

struct Conn {
    listener: Listener,
    proto: Proto,
    started: Instant,
    deadline: Option<Instant>,
    phase: Phase,
    over_limit: bool,
    target: Option<(Host, u16)>,
    method: Option<String>,
    allow: Option<Rule>,
    offered: Vec<SocketAddr>,
    addr: Option<SocketAddr>,
    /// Client bytes after the head, for the destination.
    early: Vec<u8>,
    /// A plain request's head for its origin.
    forward_head: Vec<u8>,
    /// Bytes to the destination: the first ones the machine sent, and
    /// those relayed.
    up: u64,
    relayed_up: u64,
    down: u64,
    granted_up: u64,
    granted_down: u64,
    last_active: Instant,
}

impl Conn {
    fn target_text(&self) -> Option<String> {
        self.target.as_ref().map(|(h, p)| format!("{h}:{p}"))
    }
}

/// The machine.
pub struct Egress {
    config: Config,
    conns: BTreeMap<ConnId, Conn>,
    out: VecDeque<Output>,
    now: Instant,
    stats: Stats,
    /// Credit granted and not yet used, across tunnels.
    outstanding: u64,
    shutting_down: bool,
}

/// `(status, SOCKS reply)` for each way of refusing.
fn answer_for(rule: &Rule) -> (u16, Reply) {
    match rule {
        Rule::Allow(_) => (200, Reply::Succeeded),
        Rule::Deny(_) | Rule::NoAllow | Rule::Special { .. } => (403, Reply::NotAllowed),
        Rule::Limit { flag } if flag == "--max-connections" => (429, Reply::NotAllowed),
        Rule::Limit { .. } => (403, Reply::NotAllowed),
        Rule::BadRequest { .. } => (400, Reply::GeneralFailure),
        Rule::Unreachable { .. } => (502, Reply::HostUnreachable),
        Rule::SessionEnded => (503, Reply::GeneralFailure),
    }
}

/// The kind of a rule, as the statistics count it (bounded: patterns
/// and fixed names only).
fn rule_kind(rule: &Rule) -> String {
    match rule {
        Rule::Allow(_) | Rule::Deny(_) => rule.to_string(),
        Rule::NoAllow => "no --allow-host pattern matches".into(),
        Rule::Special { class, .. } => format!("{class} address not named"),
        Rule::Limit { flag } => format!("limit {flag}"),
        Rule::BadRequest { .. } => "bad request".into(),
        Rule::Unreachable { .. } => "unreachable".into(),
        Rule::SessionEnded => "the session ended".into(),
    }
}

impl Egress {
    pub fn new(config: Config) -> Self {
        Egress {
            config,
            conns: BTreeMap::new(),
            out: VecDeque::new(),
            now: Instant::ZERO,
            stats: Stats::default(),
            outstanding: 0,
            shutting_down: false,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.conns.len()
    }

    /// Whether `conn` is open (the harnesses' view).
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// What the machine may hold on the heap now, for the harnesses that
    /// count what it really holds (the simulator's `bounded_memory`): each
    /// open connection its state and up to three heads' worth of bytes
    /// (the head, what came behind it, the head for the origin; each
    /// buffer at most twice its length), the statistics' bounded maps, the
    /// config, and [`HEAP_SLACK`]. `Err` names what was exceeded.
    pub fn heap_check(&self, held: u64) -> Result<(), String> {
        let conns = self.conns.len() as u64;
        let per_conn = HEAP_PER_CONN + 6 * self.config.max_head as u64;
        let patterns = (self.config.rules.allow.len() + self.config.rules.deny.len()) as u64;
        let hosts = self.config.hosts.values().map(|a| a.len() as u64 + 4).sum::<u64>();
        let fixed = (patterns + hosts + 32) * HEAP_PER_ENTRY + MAX_REFUSED_HOSTS as u64 * HEAP_PER_ENTRY;
        let allowed = HEAP_SLACK + conns * per_conn + fixed;
        if held <= allowed {
            return Ok(());
        }
        Err(format!(
            "holds {held} bytes, over {allowed}: {conns} connections at {per_conn} (max_head {}), \
             statistics and config {fixed}, slack {HEAP_SLACK}",
            self.config.max_head
        ))
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The next deadline of any connection.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| match c.phase {
                Phase::Tunnel => Some(c.last_active.saturating_add(self.config.idle_timeout)),
                _ => c.deadline,
            })
            .min()
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        self.now = self.now.max(now);
        match input {
            Input::Accepted { conn, listener } => self.accepted(conn, listener),
            Input::ClientBytes { conn, data } => self.client_bytes(conn, data),
            Input::ClientGone { conn } => {
                if self.conns.get(&conn).is_some_and(|c| !matches!(c.phase, Phase::Tunnel)) {
                    self.client_ended(conn);
                }
            }
            Input::Resolved { conn, result } => self.resolved(conn, result),
            Input::Connected { conn, result } => self.connected(conn, result),
            Input::Moved { conn, up, down } => self.moved(conn, up, down),
            Input::RelayEnded { conn, error } => {
                if self.conns.get(&conn).is_some_and(|c| matches!(c.phase, Phase::Tunnel)) {
                    let end = if error.is_some() { End::Failed } else { End::Closed };
                    let rule = self.conns[&conn].allow.clone().unwrap_or(Rule::NoAllow);
                    self.finish(conn, rule, None, end);
                }
            }
            Input::Tick => self.tick(),
            Input::Shutdown => self.shutdown(),
        }
    }

    fn accepted(&mut self, conn: ConnId, listener: Listener) {
        if self.conns.contains_key(&conn) {
            return;
        }
        self.stats.connections += 1;
        let counted = self.conns.values().filter(|c| !c.over_limit).count();
        let mut c = Conn {
            listener,
            proto: match listener {
                Listener::Http => Proto::Http,
                Listener::Socks => Proto::Socks5,
            },
            started: self.now,
            deadline: Some(self.now.saturating_add(self.config.head_timeout)),
            phase: Phase::Head { buf: Vec::new(), reading: 0 },
            over_limit: counted >= self.config.max_connections,
            target: None,
            method: None,
            allow: None,
            offered: Vec::new(),
            addr: None,
            early: Vec::new(),
            forward_head: Vec::new(),
            up: 0,
            relayed_up: 0,
            down: 0,
            granted_up: 0,
            granted_down: 0,
            last_active: self.now,
        };
        if self.shutting_down || self.conns.len() >= self.config.max_connections + REFUSAL_SLACK {
            // Past what may be held even to refuse: closed unanswered, and
            // audited.
            c.deadline = None;
            self.conns.insert(conn, c);
            let rule = if self.shutting_down {
                Rule::SessionEnded
            } else {
                Rule::Limit { flag: "--max-connections".into() }
            };
            self.finish(conn, rule, None, End::Refused);
            return;
        }
        self.conns.insert(conn, c);
        self.stats.peak_open = self.stats.peak_open.max(self.conns.len() as u64);
        self.grant_read(conn);
    }

    /// Ask for the next bytes of a head.
    fn grant_read(&mut self, id: ConnId) {
        let max_head = self.config.max_head;
        let Some(c) = self.conns.get_mut(&id) else { return };
        if let Phase::Head { buf, reading } | Phase::SocksRequest { buf, reading } = &mut c.phase {
            let max = max_head.saturating_sub(buf.len());
            if *reading == 0 && max > 0 {
                *reading = max;
                self.out.push_back(Output::ReadClient { conn: id, max });
            }
        }
    }

    fn client_bytes(&mut self, id: ConnId, data: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let (Phase::Head { buf, reading } | Phase::SocksRequest { buf, reading }) = &mut c.phase else {
            return;
        };
        if *reading == 0 {
            return;
        }
        // Never more than was granted: what a shell reads past that is
        // not the machine's to hold.
        let take = data.len().min(*reading);
        *reading = 0;
        if take == 0 {
            // A read of nothing is the end of the client's bytes.
            self.client_ended(id);
            return;
        }
        let before = buf.len();
        buf.extend_from_slice(&data[..take]);
        match c.listener {
            Listener::Http => self.http_head(id, before),
            Listener::Socks => self.socks_head(id),
        }
    }

    /// The client's bytes ended before its request was served. A head is
    /// read whole once more first: the cheap end-of-head check skips a
    /// head that turns bad before its end, and the answer must not depend
    /// on how the bytes were split.
    fn client_ended(&mut self, id: ConnId) {
        let max_head = self.config.max_head;
        let bad = match self.conns.get(&id).map(|c| (&c.listener, &c.phase)) {
            Some((Listener::Http, Phase::Head { buf, .. })) => match http::parse_request(buf, max_head) {
                Parsed::Error(e) => Some(e),
                _ => None,
            },
            _ => None,
        };
        match bad {
            Some(e) => self.refuse_head(id, e),
            None => {
                self.finish(id, Rule::Unreachable { reason: "the client left".into() }, None, End::ClientGone)
            }
        }
    }

    /// A request head that cannot be served: `431` when too large, `400`
    /// otherwise.
    fn refuse_head(&mut self, id: ConnId, e: HeadError) {
        let status = match e {
            HeadError::TooLarge { .. } | HeadError::TooManyHeaders => 431,
            _ => 400,
        };
        self.refuse(id, Rule::BadRequest { reason: e.to_string() }, Some(status));
    }

    fn http_head(&mut self, id: ConnId, before: usize) {
        let max_head = self.config.max_head;
        let Some(c) = self.conns.get_mut(&id) else { return };
        let Phase::Head { buf, .. } = &mut c.phase else { return };
        // Only a chunk that may end the head is worth parsing.
        let from = before.saturating_sub(3);
        let parsed = if http::may_be_complete(&buf[from..]) || buf.len() >= max_head {
            http::parse_request(buf, max_head)
        } else {
            Parsed::Partial
        };
        match parsed {
            Parsed::Partial => self.grant_read(id),
            Parsed::Error(e) => self.refuse_head(id, e),
            Parsed::Done { value, consumed } => {
                let early = buf.split_off(consumed);
                c.early = early;
                c.phase = Phase::Resolving { again: false };
                match value {
                    Request::Connect { host, port } => {
                        c.proto = Proto::Connect;
                        c.target = Some((host, port));
                    }
                    Request::Forward { method, host, port, head } => {
                        c.proto = Proto::Forward;
                        c.method = Some(method);
                        c.target = Some((host, port));
                        c.forward_head = head;
                    }
                }
                self.decide(id);
            }
        }
    }

    fn socks_head(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        match &mut c.phase {
            Phase::Head { buf, .. } => match socks::parse_greeting(buf) {
                Parsed::Partial => self.grant_read(id),
                Parsed::Error(e) => self.socks_error(id, e),
                Parsed::Done { value, consumed } => {
                    if !value.no_auth {
                        self.out.push_back(Output::Send {
                            conn: id,
                            data: vec![socks::VERSION, socks::NO_ACCEPTABLE],
                        });
                        let rule = Rule::BadRequest { reason: "no acceptable SOCKS5 method offered".into() };
                        self.finish(id, rule, Some(socks::NO_ACCEPTABLE as u16), End::Refused);
                        return;
                    }
                    self.out.push_back(Output::Send { conn: id, data: vec![socks::VERSION, socks::NO_AUTH] });
                    let rest = buf.split_off(consumed);
                    c.phase = Phase::SocksRequest { buf: rest, reading: 0 };
                    self.socks_head(id);
                }
            },
            Phase::SocksRequest { buf, .. } => match socks::parse_request(buf) {
                Parsed::Partial => self.grant_read(id),
                Parsed::Error(e) => self.socks_error(id, e),
                Parsed::Done { value: (host, port), consumed } => {
                    c.early = buf.split_off(consumed);
                    c.target = Some((host, port));
                    c.phase = Phase::Resolving { again: false };
                    self.decide(id);
                }
            },
            _ => {}
        }
    }

    fn socks_error(&mut self, id: ConnId, e: socks::SocksError) {
        let rule = Rule::BadRequest { reason: e.to_string() };
        match (e.reply(), &e) {
            (Some(reply), _) => self.refuse(id, rule, Some(reply as u16)),
            (None, socks::SocksError::Version(4)) => {
                self.out.push_back(Output::Send { conn: id, data: socks::SOCKS4_REJECTED.to_vec() });
                self.finish(id, rule, Some(0x5b), End::Refused);
            }
            (None, _) => self.finish(id, rule, None, End::Refused),
        }
    }

    /// Bytes the session may still grant or send.
    fn budget_free(&self) -> u64 {
        self.config
            .max_bytes
            .saturating_sub(self.stats.bytes_up.saturating_add(self.stats.bytes_down))
            .saturating_sub(self.outstanding)
    }

    /// The request is read: decide, then resolve.
    fn decide(&mut self, id: ConnId) {
        let free = self.budget_free();
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.deadline = Some(self.now.saturating_add(self.config.connect_timeout));
        let Some((host, port)) = c.target.clone() else { return };
        if c.over_limit {
            return self.refuse(id, Rule::Limit { flag: "--max-connections".into() }, None);
        }
        let allow = match self.config.rules.check_request(&host, port) {
            Ok(rule) => rule,
            Err(rule) => return self.refuse(id, rule, None),
        };
        let first_bytes = (c.forward_head.len() + c.early.len()) as u64;
        if free < first_bytes.max(1) {
            return self.refuse(id, Rule::Limit { flag: "--max-egress-bytes".into() }, None);
        }
        c.allow = Some(allow);
        match host {
            Host::Ip(ip) => self.resolved(id, Ok(vec![ip])),
            Host::Name(name) => match self.config.hosts.get(&name) {
                Some(addrs) => {
                    let addrs = addrs.clone();
                    self.resolved(id, Ok(addrs));
                }
                None => self.out.push_back(Output::Resolve { conn: id, name, port }),
            },
        }
    }

    fn resolved(&mut self, id: ConnId, result: Result<Vec<IpAddr>, String>) {
        let bug = self.config.planted_bug;
        let Some(c) = self.conns.get_mut(&id) else { return };
        let Phase::Resolving { again } = c.phase else { return };
        let Some((host, port)) = c.target.clone() else { return };
        let addrs = match result {
            Ok(a) if !a.is_empty() => a,
            Ok(_) => {
                return self.refuse(id, Rule::Unreachable { reason: format!("{host} has no address") }, None)
            }
            Err(e) => {
                let reason = format!("looking up {host}: {}", e.chars().take(200).collect::<String>());
                return self.refuse(id, Rule::Unreachable { reason }, None);
            }
        };
        if again {
            // The planted bug's second lookup: connected to unchecked.
            c.offered = addrs.iter().take(MAX_ADDRS).map(|ip| SocketAddr::new(*ip, port)).collect();
            c.phase = Phase::Connecting { unchecked: true };
            let addrs = c.offered.clone();
            self.out.push_back(Output::Connect { conn: id, addrs });
            return;
        }
        let mut passing = Vec::new();
        let mut first_refusal = None;
        for ip in addrs.iter().take(MAX_ADDRS) {
            let ip = canonical_ip(*ip);
            match self.config.rules.check_address(ip, port) {
                Ok(()) => {
                    let sa = SocketAddr::new(ip, port);
                    if !passing.contains(&sa) {
                        passing.push(sa);
                    }
                }
                Err(rule) => {
                    first_refusal.get_or_insert(rule);
                }
            }
        }
        if passing.is_empty() {
            let rule =
                first_refusal.unwrap_or(Rule::Unreachable { reason: format!("{host} has no address") });
            return self.refuse(id, rule, None);
        }
        if bug == Some(EgressBug::CheckFirstLookupOnly) && matches!(host, Host::Name(_)) {
            if let Host::Name(name) = host {
                c.phase = Phase::Resolving { again: true };
                self.out.push_back(Output::Resolve { conn: id, name, port });
                return;
            }
        }
        c.offered = passing.clone();
        c.phase = Phase::Connecting { unchecked: false };
        self.out.push_back(Output::Connect { conn: id, addrs: passing });
    }

    fn connected(&mut self, id: ConnId, result: Result<SocketAddr, ConnectError>) {
        let free = self.budget_free();
        let Some(c) = self.conns.get_mut(&id) else { return };
        let Phase::Connecting { unchecked } = c.phase else { return };
        let peer = match result {
            Ok(p) => SocketAddr::new(canonical_ip(p.ip()), p.port()),
            Err(e) => {
                let (reason, status, reply) = match e {
                    ConnectError::Refused => ("connection refused".to_owned(), 502, Reply::ConnectionRefused),
                    ConnectError::TimedOut => ("connect timed out".to_owned(), 504, Reply::TtlExpired),
                    ConnectError::Unreachable => {
                        ("network unreachable".to_owned(), 502, Reply::NetworkUnreachable)
                    }
                    ConnectError::Other(m) => (m.chars().take(200).collect(), 502, Reply::HostUnreachable),
                };
                let code = match c.listener {
                    Listener::Http => status,
                    Listener::Socks => reply as u16,
                };
                return self.refuse(id, Rule::Unreachable { reason }, Some(code));
            }
        };
        c.addr = Some(peer);
        if !unchecked {
            // The address actually reached, checked again: one never
            // offered, or one the rules refuse, gets nothing.
            let check = self.config.rules.check_address(peer.ip(), peer.port()).and_then(|()| {
                if c.offered.contains(&peer) {
                    Ok(())
                } else {
                    Err(Rule::Unreachable { reason: format!("connected to {peer}, which was never offered") })
                }
            });
            if let Err(rule) = check {
                return self.refuse(id, rule, None);
            }
        }
        // Other tunnels may have spent the budget since the decision: the
        // client is told now, not after a success reply.
        let first_bytes = (c.forward_head.len() + c.early.len()) as u64;
        if free < first_bytes + 1 {
            return self.refuse(id, Rule::Limit { flag: "--max-egress-bytes".into() }, None);
        }
        c.phase = Phase::Tunnel;
        c.deadline = None;
        c.last_active = self.now;
        self.stats.tunnels += 1;
        let rule = c.allow.clone().unwrap_or(Rule::NoAllow);
        *self.stats.by_rule.entry(rule_kind(&rule)).or_default() += 1;
        match c.proto {
            Proto::Connect => self.out.push_back(Output::Send { conn: id, data: http::ESTABLISHED.to_vec() }),
            Proto::Socks5 => {
                self.out.push_back(Output::Send { conn: id, data: Reply::Succeeded.bytes().to_vec() })
            }
            Proto::Forward | Proto::Http => {}
        }
        let mut first = std::mem::take(&mut c.forward_head);
        first.append(&mut c.early);
        if !first.is_empty() {
            c.up += first.len() as u64;
            self.stats.bytes_up += first.len() as u64;
            self.out.push_back(Output::SendUpstream { conn: id, data: first });
        }
        self.top_up(id);
    }

    fn moved(&mut self, id: ConnId, up: u64, down: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if !matches!(c.phase, Phase::Tunnel) {
            return;
        }
        // Counted as reported, clamped to what was granted: a shell that
        // moved more broke its contract, and the budget stays exact.
        let up = up.min(c.granted_up - c.relayed_up);
        let down = down.min(c.granted_down - c.down);
        c.relayed_up += up;
        c.up += up;
        c.down += down;
        self.outstanding = self.outstanding.saturating_sub(up + down);
        self.stats.bytes_up += up;
        self.stats.bytes_down += down;
        if up + down > 0 {
            c.last_active = self.now;
        }
        self.top_up(id);
    }

    /// Grant each direction credit back up to the window, within the
    /// session's budget; a direction out of credit with nothing left to
    /// grant ends the tunnel.
    fn top_up(&mut self, id: ConnId) {
        let window = self.config.window.max(1);
        let mut free = self.budget_free();
        let Some(c) = self.conns.get_mut(&id) else { return };
        let mut give = [0u64; 2];
        let left = [c.granted_up - c.relayed_up, c.granted_down - c.down];
        for (i, l) in left.iter().enumerate() {
            if *l < window / 2 + 1 {
                let g = (window - l).min(free);
                free -= g;
                give[i] = g;
            }
        }
        c.granted_up += give[0];
        c.granted_down += give[1];
        self.outstanding += give[0] + give[1];
        if give != [0, 0] {
            self.out.push_back(Output::Relay { conn: id, up: give[0], down: give[1] });
        }
        let starved = left.iter().zip(give).any(|(l, g)| l + g == 0);
        if starved {
            // The rule that let it through stays its rule; how it ended
            // says which limit ended it.
            let rule = c.allow.clone().unwrap_or(Rule::NoAllow);
            self.finish(id, rule, None, End::Limit);
        }
    }

    fn tick(&mut self) {
        let now = self.now;
        let idle = self.config.idle_timeout;
        let due: Vec<(ConnId, bool)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| match c.phase {
                Phase::Tunnel => (c.last_active.saturating_add(idle) <= now).then_some((*id, true)),
                _ => c.deadline.filter(|d| *d <= now).map(|_| (*id, false)),
            })
            .collect();
        for (id, tunnel) in due {
            if tunnel {
                let rule = self.conns[&id].allow.clone().unwrap_or(Rule::NoAllow);
                self.finish(id, rule, None, End::Idle);
                continue;
            }
            let reading = matches!(self.conns[&id].phase, Phase::Head { .. } | Phase::SocksRequest { .. });
            if reading {
                let secs = self.config.head_timeout.as_secs();
                let rule = Rule::BadRequest { reason: format!("no complete request within {secs} s") };
                let code = match self.conns[&id].listener {
                    Listener::Http => 408,
                    Listener::Socks => Reply::TtlExpired as u16,
                };
                self.refuse(id, rule, Some(code));
            } else {
                let secs = self.config.connect_timeout.as_secs();
                let rule = Rule::Unreachable { reason: format!("not connected within {secs} s") };
                let code = match self.conns[&id].listener {
                    Listener::Http => 504,
                    Listener::Socks => Reply::TtlExpired as u16,
                };
                self.refuse(id, rule, Some(code));
            }
        }
    }

    fn shutdown(&mut self) {
        self.shutting_down = true;
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            if matches!(self.conns[&id].phase, Phase::Tunnel) {
                let rule = self.conns[&id].allow.clone().unwrap_or(Rule::NoAllow);
                self.finish(id, rule, None, End::SessionEnded);
            } else {
                self.refuse_with_end(id, Rule::SessionEnded, None, End::SessionEnded);
            }
        }
    }

    fn refuse(&mut self, id: ConnId, rule: Rule, code: Option<u16>) {
        self.refuse_with_end(id, rule, code, End::Refused);
    }

    /// Answer the client with the refusal its listener speaks, then end.
    fn refuse_with_end(&mut self, id: ConnId, rule: Rule, code: Option<u16>, end: End) {
        let Some(c) = self.conns.get(&id) else { return };
        let (status, reply) = answer_for(&rule);
        let target = c.target_text();
        let answer = match c.listener {
            Listener::Http => {
                let status = code.unwrap_or(status);
                let what = match (&c.proto, &c.method) {
                    (Proto::Connect, _) => "CONNECT".to_owned(),
                    (_, Some(m)) => m.clone(),
                    _ => "the request".to_owned(),
                };
                let body = refusal_line(&what, target.as_deref(), &rule, c.target.as_ref());
                self.out.push_back(Output::Send {
                    conn: id,
                    data: http::refusal(status, target.as_deref(), &rule.to_string(), &body),
                });
                status
            }
            Listener::Socks => {
                let in_request = matches!(
                    c.phase,
                    Phase::SocksRequest { .. } | Phase::Resolving { .. } | Phase::Connecting { .. }
                );
                // Before the greeting is answered there is no reply to give.
                if !in_request {
                    self.finish(id, rule, None, end);
                    return;
                }
                let code = code.unwrap_or(reply as u16);
                let r = [socks::VERSION, code as u8, 0, 1, 0, 0, 0, 0, 0, 0];
                self.out.push_back(Output::Send { conn: id, data: r.to_vec() });
                code
            }
        };
        self.finish(id, rule, Some(answer), end);
    }

    /// Close `id` and audit it.
    fn finish(&mut self, id: ConnId, rule: Rule, answer: Option<u16>, end: End) {
        let Some(c) = self.conns.remove(&id) else { return };
        self.outstanding = self
            .outstanding
            .saturating_sub(c.granted_up - c.relayed_up)
            .saturating_sub(c.granted_down - c.down);
        let allowed = matches!(c.phase, Phase::Tunnel);
        if !allowed {
            self.stats.refused += 1;
            *self.stats.by_rule.entry(rule_kind(&rule)).or_default() += 1;
            if let Some(t) = c.target_text() {
                if let Some(n) = self.stats.refused_hosts.get_mut(&t) {
                    *n += 1;
                } else if self.stats.refused_hosts.len() < MAX_REFUSED_HOSTS {
                    self.stats.refused_hosts.insert(t, 1);
                } else {
                    self.stats.refused_hosts_dropped += 1;
                }
            }
        }
        let duration = self.now.saturating_duration_since(c.started);
        let record = Record {
            conn: id,
            proto: c.proto,
            host: c.target.as_ref().map(|(h, _)| h.to_string()),
            port: c.target.as_ref().map(|(_, p)| *p),
            addr: c.addr,
            allowed,
            rule: rule.to_string(),
            answer,
            up: c.up,
            down: c.down,
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            end,
        };
        self.out.push_back(Output::Close { conn: id });
        self.out.push_back(Output::Audit { record });
    }
}

/// The refusal's body: what was refused, why, and what would allow it.
fn refusal_line(what: &str, target: Option<&str>, rule: &Rule, host: Option<&(Host, u16)>) -> String {
    let subject = match target {
        Some(t) => format!("{what} {t}"),
        None => what.to_owned(),
    };
    let hint = match (rule, host) {
        (Rule::NoAllow, Some((h, p))) => {
            let shown = match h {
                Host::Ip(IpAddr::V6(a)) => format!("[{a}]:{p}"),
                _ => format!("{h}:{p}"),
            };
            format!(" To allow it, the user can pass --allow-host {shown}.")
        }
        (Rule::Special { addr, .. }, _) => {
            format!(" To allow it, the user can also pass --allow-host {addr} (the address itself).")
        }
        (Rule::Deny(_), _) => " The user's policy denies it.".to_owned(),
        (Rule::Limit { flag }, _) => format!(" The session's limit {flag} is reached."),
        _ => String::new(),
    };
    format!("airlock refused {subject}: {rule}.{hint}\n")
}
