//! Traces of ToolExec servers (the simulator's `toolexec` scenario): the
//! FS proxy's JSONL shape, one level holding every connection's
//! [`Exchange`], each input and output naming its connection.
//!
//! ```text
//! {"format":1,"machine":"toolexec","config":{..},"seed":7,"meta":{..}}
//! {"now":80922,"input":{"accept":{"conn":0}}}
//! {"now":80922,"input":{"input":{"conn":0,"input":{"head":{..}}}}}
//! {"output":{"conn":0,"output":"read_body"}}
//! {"now":3000000,"input":{"timeout":{"conn":0}}}
//! {"note":"12 3000000 out 0 Signal(Term)"}
//! ```
//!
//! An output is recorded as the machine yielded it, before anything the
//! world did with it, and compared as JSON (a response's header names are
//! the machine's own constants). The header carries the server's token: only
//! the simulator records these traces, and its token is its own.

use super::{
    first_line, numbered, parse_header, replay_records, Machine, Numbered, Readable, ReplayError, FORMAT,
};
use crate::time::Instant;
use crate::toolexec::{validate_token, Config, Exchange, Input, Output, ToolProgram};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

/// The machine name of a ToolExec trace.
pub const MACHINE_TOOLEXEC: &str = "toolexec";

/// Everything a [`Config`] holds, as a trace carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigRecord {
    #[serde(with = "crate::b64")]
    pub token: Vec<u8>,
    pub tools: BTreeMap<String, ToolProgram>,
    #[serde(with = "crate::b64")]
    pub workdir: Vec<u8>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub max_body: u64,
    pub max_buffered: u64,
    pub header_timeout: Duration,
    pub stream_window: u64,
    pub read_chunk: usize,
    pub final_drain: u64,
}

impl From<&Config> for ConfigRecord {
    fn from(c: &Config) -> Self {
        ConfigRecord {
            token: c.token.as_bytes().to_vec(),
            tools: c.tools.clone(),
            workdir: c.workdir.clone(),
            timeout: c.timeout,
            kill_grace: c.kill_grace,
            max_body: c.max_body,
            max_buffered: c.max_buffered,
            header_timeout: c.header_timeout,
            stream_window: c.stream_window,
            read_chunk: c.read_chunk,
            final_drain: c.final_drain,
        }
    }
}

impl ConfigRecord {
    /// The config it records, or why it cannot be one.
    pub fn config(&self) -> Result<Config, String> {
        let token = validate_token(&self.token).map_err(|e| e.to_string())?;
        let mut config = Config::new(token, self.workdir.clone());
        config.tools = self.tools.clone();
        config.timeout = self.timeout;
        config.kill_grace = self.kill_grace;
        config.max_body = self.max_body;
        config.max_buffered = self.max_buffered;
        config.header_timeout = self.header_timeout;
        config.stream_window = self.stream_window;
        config.read_chunk = self.read_chunk;
        config.final_drain = self.final_drain;
        Ok(config)
    }
}

/// The first line of a ToolExec trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub machine: String,
    pub config: ConfigRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Free-form notes (the simulator's world); replay ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

impl Header {
    pub fn new(config: &Config) -> Self {
        Header {
            format: FORMAT,
            machine: MACHINE_TOOLEXEC.to_owned(),
            config: config.into(),
            seed: None,
            meta: None,
        }
    }
}

/// What the server's shell did to its exchanges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerInput {
    /// A connection was accepted: its exchange is built at `now`.
    Accept { conn: usize },
    /// The exchange's deadline came: `handle_timeout(now)`.
    Timeout { conn: usize },
    /// `handle(now, input)`.
    Input { conn: usize, input: Input },
}

#[derive(Serialize)]
struct InputLine<'a> {
    now: Instant,
    input: &'a ServerInput,
}

#[derive(Serialize)]
struct OutputRecord<'a> {
    conn: usize,
    output: &'a Output,
}

#[derive(Serialize)]
struct OutputLine<'a> {
    output: OutputRecord<'a>,
}

#[derive(Serialize)]
struct NoteLine<'a> {
    note: &'a str,
}

/// One JSON line (with its newline) for each kind of record.
pub fn header_line(header: &Header) -> String {
    line(header)
}

pub fn input_line(now: Instant, input: &ServerInput) -> String {
    line(&InputLine { now, input })
}

pub fn output_line(conn: usize, output: &Output) -> String {
    line(&OutputLine { output: OutputRecord { conn, output } })
}

pub fn note_line(note: &str) -> String {
    line(&NoteLine { note })
}

fn line<T: Serialize>(value: &T) -> String {
    // Plain data with string keys: serializing cannot fail.
    let mut text = serde_json::to_string(value).unwrap_or_default();
    text.push('\n');
    text
}

/// A recorded output as the replay compares it.
fn output_value(conn: usize, output: &Output) -> Value {
    serde_json::to_value(OutputRecord { conn, output }).unwrap_or(Value::Null)
}

/// Every exchange of one server, driven as its shell drove them.
pub struct Server {
    config: Arc<Config>,
    exchanges: BTreeMap<usize, Exchange>,
    out: VecDeque<Value>,
}

impl Server {
    pub fn new(config: Config) -> Self {
        Server { config: Arc::new(config), exchanges: BTreeMap::new(), out: VecDeque::new() }
    }

    /// Connections accepted so far.
    pub fn exchanges(&self) -> usize {
        self.exchanges.len()
    }
}

impl Machine for Server {
    type Input = ServerInput;
    type Output = Value;
    fn handle(&mut self, now: Instant, input: ServerInput) {
        let conn = match input {
            ServerInput::Accept { conn } => {
                self.exchanges.insert(conn, Exchange::new(self.config.clone(), now));
                // Whatever a new exchange queues goes out after its first
                // input, as the shell drains it.
                return;
            }
            ServerInput::Timeout { conn } => {
                if let Some(ex) = self.exchanges.get_mut(&conn) {
                    ex.handle_timeout(now);
                }
                conn
            }
            ServerInput::Input { conn, input } => {
                if let Some(ex) = self.exchanges.get_mut(&conn) {
                    ex.handle(now, input);
                }
                conn
            }
        };
        if let Some(ex) = self.exchanges.get_mut(&conn) {
            while let Some(o) = ex.poll_output() {
                self.out.push_back(output_value(conn, &o));
            }
        }
    }
    fn poll_output(&mut self) -> Option<Value> {
        self.out.pop_front()
    }
}

impl Readable for Value {
    fn readable(&self) -> String {
        self.to_string()
    }
}

/// What a successful replay went through.
#[derive(Debug)]
pub struct ReplayReport {
    pub header: Header,
    pub inputs: u64,
    pub outputs: u64,
    pub exchanges: usize,
}

/// Replay a ToolExec trace: rebuild the server's config from the header,
/// feed the inputs in order and check each recorded output against what
/// the exchanges yield. Fails at the first difference, naming its line.
pub fn replay<R: BufRead>(reader: R) -> Result<ReplayReport, ReplayError<Value>> {
    let mut lines = numbered(reader);
    let (line, text) = first_line(&mut lines)?;
    let header: Header = parse_header(line, &text, MACHINE_TOOLEXEC)?;
    replay_from(header, lines)
}

pub(super) fn replay_from(header: Header, lines: Numbered<'_>) -> Result<ReplayReport, ReplayError<Value>> {
    let config = header
        .config
        .config()
        .map_err(|e| ReplayError::Malformed { line: 1, message: format!("header's config: {e}") })?;
    let mut servers = [Server::new(config)];
    let (inputs, outputs) = replay_records(&mut servers, lines)?;
    let [server] = servers;
    Ok(ReplayReport { header, inputs, outputs, exchanges: server.exchanges() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toolexec::RequestHead;

    fn config() -> Config {
        let mut c = Config::new(validate_token(b"secret-token").unwrap(), b"/work".to_vec());
        c.add_tool_spec("echo").unwrap();
        c
    }

    /// One exchange recorded as a shell drives it (as the simulator's
    /// world does): a good head, a body, a spawn, output, exit.
    fn record() -> String {
        let config = Arc::new(config());
        let mut text = header_line(&Header::new(&config));
        let head = RequestHead {
            method: "POST".into(),
            path: "/exec".into(),
            headers: vec![
                ("authorization".into(), b"Bearer secret-token".to_vec()),
                ("x-aifo-proto".into(), b"1".to_vec()),
            ],
            http11: true,
        };
        text.push_str(&input_line(Instant::from_micros(0), &ServerInput::Accept { conn: 0 }));
        let mut ex = Exchange::new(config.clone(), Instant::from_micros(0));
        let inputs = [
            Input::Head(head),
            Input::Body(b"tool=echo&arg=hi".to_vec()),
            Input::BodyEnd,
            Input::Spawned(Ok(())),
            Input::ToolOutput(b"hi\n".to_vec()),
            Input::ToolEof,
            Input::ToolExited(crate::toolexec::ExitStatus::Code(0)),
        ];
        for (i, input) in inputs.into_iter().enumerate() {
            let now = Instant::from_micros(1000 * (i as u64 + 1));
            text.push_str(&input_line(now, &ServerInput::Input { conn: 0, input: input.clone() }));
            ex.handle(now, input);
            while let Some(o) = ex.poll_output() {
                text.push_str(&output_line(0, &o));
            }
            text.push_str(&note_line("a note for a reader"));
        }
        text
    }

    #[test]
    fn round_trips_and_answers_what_it_recorded() {
        let text = record();
        assert!(text.contains("\"respond\""), "{text}");
        let r = replay(text.as_bytes()).unwrap();
        assert_eq!((r.inputs, r.exchanges), (8, 1));
        assert!(r.outputs >= 4, "{}", r.outputs);
    }

    #[test]
    fn a_changed_output_is_named_by_its_line() {
        let text = record();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let idx = lines.iter().position(|l| l.contains("\"respond\"")).unwrap();
        lines[idx] = lines[idx].replace("\"status\":200", "\"status\":201");
        let err = replay(lines.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Differs { line, .. } if line == idx + 1), "{err}");
    }

    #[test]
    fn a_bad_token_in_the_header_is_malformed() {
        let text = record().replacen(&crate::b64::encode(b"secret-token"), "", 1);
        let err = replay(text.as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Malformed { line: 1, .. }), "{err}");
    }
}
