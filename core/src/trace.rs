//! Traces: what a machine was given and what it gave back, one JSON object
//! per line (JSONL), so a run recorded by the production shell or the
//! simulator can be replayed against the core and checked output by output.
//!
//! ```text
//! {"format":1,"machine":"fsproxy","config":{..},"levels":[{..}],"seed":7,"meta":{..}}
//! {"now":12,"level":0,"input":{"input":"bytes","client":1,"data":"AAAA"}}
//! {"level":0,"output":{"output":"send","client":1,"data":"AAAA"}}
//! ```
//!
//! A trace may hold several machines ("levels") of one world, such as an
//! intermediate proxy and the proxy it forwards to: `config` builds level 0,
//! `levels[i]` builds level `i + 1`. Each input line names the level it was
//! handed to; the outputs that input produced follow it, in the order
//! `poll_output` yielded them, before that level's next input. Lines of
//! different levels may interleave freely. See `traces/README.md`.

use crate::fsproxy::{self, FsProxy, Input, Output};
use crate::time::Instant;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufRead, Write};

pub mod egress;
pub mod toolexec;
pub mod vfs;

/// The trace format this module writes and reads.
pub const FORMAT: u32 = 1;

/// The machine name of an FS proxy trace.
pub const MACHINE_FSPROXY: &str = "fsproxy";

/// The first line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub machine: String,
    /// Builds level 0.
    pub config: fsproxy::Config,
    /// Build levels 1, 2, … of a world with more than one machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub levels: Vec<fsproxy::Config>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Free-form notes (the simulator's swarm and failure); replay ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl Header {
    /// A header for one FS proxy built from `config`.
    pub fn fsproxy(config: fsproxy::Config) -> Self {
        Header {
            format: FORMAT,
            machine: MACHINE_FSPROXY.to_owned(),
            config,
            levels: Vec::new(),
            seed: None,
            meta: None,
        }
    }

    /// The config of every level, level 0 first.
    pub fn configs(&self) -> impl Iterator<Item = &fsproxy::Config> {
        std::iter::once(&self.config).chain(self.levels.iter())
    }
}

#[derive(Serialize)]
struct InputLineRef<'a> {
    now: Instant,
    level: usize,
    input: &'a Input,
}

#[derive(Serialize)]
struct OutputLineRef<'a> {
    level: usize,
    output: &'a Output,
}

/// Any line after the header: exactly one of `input` and `output`, or a
/// `note` alone (what the world around the machine did, such as a
/// simulated attacker swapping a link: context for a reader, skipped by
/// replay).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound = "I: DeserializeOwned, O: DeserializeOwned")]
struct Line<I, O> {
    #[serde(default)]
    now: Option<Instant>,
    #[serde(default)]
    level: usize,
    #[serde(default = "none")]
    input: Option<I>,
    #[serde(default = "none")]
    output: Option<O>,
    #[serde(default)]
    note: Option<serde_json::Value>,
}

fn none<T>() -> Option<T> {
    None
}

/// A machine a trace can be replayed against: fed inputs at times, polled
/// for outputs.
pub trait Machine {
    type Input: DeserializeOwned;
    type Output: DeserializeOwned + PartialEq;
    fn handle(&mut self, now: Instant, input: Self::Input);
    fn poll_output(&mut self) -> Option<Self::Output>;
}

/// An output as a person reads it in a difference.
pub trait Readable {
    fn readable(&self) -> String;
}

impl Machine for FsProxy {
    type Input = Input;
    type Output = Output;
    fn handle(&mut self, now: Instant, input: Input) {
        FsProxy::handle(self, now, input)
    }
    fn poll_output(&mut self) -> Option<Output> {
        FsProxy::poll_output(self)
    }
}

impl Readable for Output {
    fn readable(&self) -> String {
        readable(self)
    }
}

/// Writes a trace line by line to any `io::Write`.
pub struct TraceWriter<W: Write> {
    out: W,
    line: Vec<u8>,
}

impl<W: Write> TraceWriter<W> {
    /// Start a trace: writes the header line.
    pub fn new(out: W, header: &Header) -> io::Result<Self> {
        let mut w = TraceWriter { out, line: Vec::with_capacity(256) };
        w.emit(header)?;
        Ok(w)
    }

    /// Record `input`, as handed to `level` at `now`. Call before handing it
    /// over, then record that call's outputs.
    pub fn input(&mut self, level: usize, now: Instant, input: &Input) -> io::Result<()> {
        self.emit(&InputLineRef { now, level, input })
    }

    /// Record an output `level` yielded from `poll_output`.
    pub fn output(&mut self, level: usize, output: &Output) -> io::Result<()> {
        self.emit(&OutputLineRef { level, output })
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer, flushed.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn emit<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, value).map_err(io::Error::other)?;
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }
}

/// What a successful replay went through.
#[derive(Debug)]
pub struct ReplayReport {
    pub header: Header,
    pub inputs: u64,
    pub outputs: u64,
    /// The machines as the last input left them, level 0 first, for callers
    /// that want to inspect the final state (open handles, clients).
    pub machines: Vec<FsProxy>,
}

#[derive(Debug)]
pub enum ReplayError<O = Output> {
    Io {
        line: usize,
        error: io::Error,
    },
    /// The trace is empty.
    NoHeader,
    /// The trace has a header and no input or output line: nothing was
    /// checked, which must not pass for a successful replay.
    NoRecords,
    /// A line that is not a header, input or output line; or an unsupported
    /// format or machine; or a level with no config.
    Malformed {
        line: usize,
        message: String,
    },
    /// The machine yielded `actual` where the trace recorded `expected`.
    Differs {
        line: usize,
        level: usize,
        expected: Box<O>,
        actual: Box<O>,
    },
    /// The trace records an output the machine did not yield.
    Missing {
        line: usize,
        level: usize,
        expected: Box<O>,
    },
    /// The machine yielded an output the trace does not record before
    /// `line` (the level's next input, or the end of the trace).
    Extra {
        line: usize,
        level: usize,
        actual: Box<O>,
    },
}

impl<O: Readable> fmt::Display for ReplayError<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let json = |o: &O| o.readable();
        match self {
            ReplayError::Io { line, error } => write!(f, "line {line}: {error}"),
            ReplayError::NoHeader => f.write_str("line 1: trace is empty (no header)"),
            ReplayError::NoRecords => f.write_str("line 2: trace has a header and no records"),
            ReplayError::Malformed { line, message } => write!(f, "line {line}: {message}"),
            ReplayError::Differs { line, level, expected, actual } => write!(
                f,
                "line {line}: level {level} output differs\n  trace:   {}\n  machine: {}",
                json(expected),
                json(actual)
            ),
            ReplayError::Missing { line, level, expected } => {
                write!(f, "line {line}: level {level} yielded no output; trace has {}", json(expected))
            }
            ReplayError::Extra { line, level, actual } => {
                write!(f, "line {line}: level {level} yielded an output the trace lacks: {}", json(actual))
            }
        }
    }
}

impl<O: Readable + fmt::Debug> std::error::Error for ReplayError<O> {}

/// Replay a trace: rebuild every level from the header (a level's broker
/// too, from its config's `broker`), feed the inputs in
/// order, and check each recorded output against what the machine yields.
/// Fails at the first difference, naming its line (1-based).
pub fn replay<R: BufRead>(reader: R) -> Result<ReplayReport, ReplayError> {
    let mut lines = numbered(reader);
    let (line, text) = first_line(&mut lines)?;
    let header: Header = parse_header(line, &text, MACHINE_FSPROXY)?;
    replay_fsproxy(header, lines)
}

fn replay_fsproxy(header: Header, lines: Numbered<'_>) -> Result<ReplayReport, ReplayError> {
    let mut machines: Vec<FsProxy> = header.configs().cloned().map(FsProxy::new).collect();
    let (inputs, outputs) = replay_records(&mut machines, lines)?;
    Ok(ReplayReport { header, inputs, outputs, machines })
}

/// A trace's lines, numbered from 1.
type Numbered<'a> = Box<dyn Iterator<Item = (usize, io::Result<String>)> + 'a>;

fn numbered<'a, R: BufRead + 'a>(reader: R) -> Numbered<'a> {
    Box::new(reader.lines().enumerate().map(|(i, l)| (i + 1, l)))
}

/// The first line that is not blank: the header.
fn first_line<O>(lines: &mut Numbered<'_>) -> Result<(usize, String), ReplayError<O>> {
    loop {
        match lines.next() {
            None => return Err(ReplayError::NoHeader),
            Some((line, Err(error))) => return Err(ReplayError::Io { line, error }),
            Some((_, Ok(text))) if text.trim().is_empty() => continue,
            Some((line, Ok(text))) => return Ok((line, text)),
        }
    }
}

/// Just what every header has: the format and the machine it is for.
#[derive(Deserialize)]
struct Kind {
    format: u32,
    machine: String,
}

fn parse_header<H: DeserializeOwned, O>(line: usize, text: &str, machine: &str) -> Result<H, ReplayError<O>> {
    let malformed = |message: String| ReplayError::Malformed { line, message };
    let kind: Kind = serde_json::from_str(text).map_err(|e| malformed(format!("bad header: {e}")))?;
    if kind.format != FORMAT {
        return Err(malformed(format!("trace format {} (this build reads {FORMAT})", kind.format)));
    }
    if kind.machine != machine {
        return Err(malformed(format!("machine {:?} cannot be replayed here", kind.machine)));
    }
    serde_json::from_str(text).map_err(|e| malformed(format!("bad header: {e}")))
}

/// Feed every input line to its level and match every output line against
/// what that level yielded; returns the inputs and outputs gone through.
fn replay_records<M: Machine>(
    machines: &mut [M],
    lines: Numbered<'_>,
) -> Result<(u64, u64), ReplayError<M::Output>> {
    // Outputs each level yielded and the trace has not matched yet.
    // A machine may speak first (the VFS host's `init`): those outputs
    // come before any input.
    let mut unmatched: Vec<VecDeque<M::Output>> =
        machines.iter_mut().map(|m| std::iter::from_fn(|| m.poll_output()).collect()).collect();
    let (mut inputs, mut outputs) = (0u64, 0u64);
    let mut last_line = 1;
    for (line, text) in lines {
        last_line = line;
        let text = text.map_err(|error| ReplayError::Io { line, error })?;
        if text.trim().is_empty() {
            continue;
        }
        let parsed: Line<M::Input, M::Output> = serde_json::from_str(&text)
            .map_err(|e| ReplayError::Malformed { line, message: e.to_string() })?;
        let level = parsed.level;
        let (Some(machine), Some(queue)) = (machines.get_mut(level), unmatched.get_mut(level)) else {
            return Err(ReplayError::Malformed { line, message: format!("no config for level {level}") });
        };
        match (parsed.input, parsed.output, parsed.note) {
            (Some(input), None, None) => {
                if let Some(actual) = queue.pop_front() {
                    return Err(ReplayError::Extra { line, level, actual: Box::new(actual) });
                }
                let now = parsed
                    .now
                    .ok_or_else(|| ReplayError::Malformed { line, message: "input line lacks now".into() })?;
                machine.handle(now, input);
                queue.extend(std::iter::from_fn(|| machine.poll_output()));
                inputs += 1;
            }
            (None, Some(expected), None) => {
                match queue.pop_front() {
                    None => return Err(ReplayError::Missing { line, level, expected: Box::new(expected) }),
                    Some(actual) if actual != expected => {
                        return Err(ReplayError::Differs {
                            line,
                            level,
                            expected: Box::new(expected),
                            actual: Box::new(actual),
                        })
                    }
                    Some(_) => {}
                }
                outputs += 1;
            }
            (None, None, Some(_)) => {}
            _ => {
                let message = "a line needs exactly one of input, output and note".to_owned();
                return Err(ReplayError::Malformed { line, message });
            }
        }
    }
    for (level, queue) in unmatched.iter_mut().enumerate() {
        if let Some(actual) = queue.pop_front() {
            return Err(ReplayError::Extra { line: last_line + 1, level, actual: Box::new(actual) });
        }
    }
    if inputs == 0 && outputs == 0 {
        return Err(ReplayError::NoRecords);
    }
    Ok((inputs, outputs))
}

/// What [`replay_any`] went through.
#[derive(Debug)]
pub struct Replayed {
    pub machine: String,
    pub inputs: u64,
    pub outputs: u64,
}

/// Replay a trace of any machine this build knows (`fsproxy`, `vfs`,
/// `toolexec`, `egress`), chosen by its header; the error is a readable message.
pub fn replay_any<R: BufRead>(reader: R) -> Result<Replayed, String> {
    let mut lines = numbered(reader);
    let (line, text) = first_line::<Output>(&mut lines).map_err(|e| e.to_string())?;
    let kind: Kind = serde_json::from_str(&text).map_err(|e| format!("line {line}: bad header: {e}"))?;
    match kind.machine.as_str() {
        toolexec::MACHINE_TOOLEXEC => {
            let header =
                parse_header::<toolexec::Header, serde_json::Value>(line, &text, toolexec::MACHINE_TOOLEXEC)
                    .map_err(|e| e.to_string())?;
            let r = toolexec::replay_from(header, lines).map_err(|e| e.to_string())?;
            Ok(Replayed { machine: kind.machine, inputs: r.inputs, outputs: r.outputs })
        }
        egress::MACHINE_EGRESS => {
            let header =
                parse_header::<egress::Header, crate::egress::Output>(line, &text, egress::MACHINE_EGRESS)
                    .map_err(|e| e.to_string())?;
            let r = egress::replay_from(header, lines).map_err(|e| e.to_string())?;
            Ok(Replayed { machine: kind.machine, inputs: r.inputs, outputs: r.outputs })
        }
        vfs::MACHINE_VFS => {
            let header = parse_header::<vfs::Header, crate::vfs::Output>(line, &text, vfs::MACHINE_VFS)
                .map_err(|e| e.to_string())?;
            let r = vfs::replay_from(header, lines).map_err(|e| e.to_string())?;
            Ok(Replayed { machine: kind.machine, inputs: r.inputs, outputs: r.outputs })
        }
        _ => {
            let header =
                parse_header::<Header, Output>(line, &text, MACHINE_FSPROXY).map_err(|e| e.to_string())?;
            let r = replay_fsproxy(header, lines).map_err(|e| e.to_string())?;
            Ok(Replayed { machine: kind.machine, inputs: r.inputs, outputs: r.outputs })
        }
    }
}

/// An output as a person reads it in a difference: framed bytes sent to a
/// client or upstream become the JSON of each frame (`frames`), with the
/// bytes of an incomplete or non-JSON tail kept as base64 (`rest`).
pub fn readable(output: &Output) -> String {
    let mut value = match serde_json::to_value(output) {
        Ok(v) => v,
        Err(e) => return e.to_string(),
    };
    let data = match output {
        Output::Send { data, .. } | Output::SendUpstream { data } => data,
        _ => return value.to_string(),
    };
    let (frames, rest) = decode_frames(data);
    if let Some(obj) = value.as_object_mut() {
        obj.remove("data");
        obj.insert("frames".into(), serde_json::Value::Array(frames));
        if !rest.is_empty() {
            obj.insert("rest".into(), serde_json::Value::String(crate::b64::encode(rest)));
        }
    }
    value.to_string()
}

/// Whole frames whose payload is JSON, in order, and the bytes after the
/// last of them.
fn decode_frames(mut data: &[u8]) -> (Vec<serde_json::Value>, &[u8]) {
    let mut frames = Vec::new();
    while let Some((len, tail)) = data.split_first_chunk::<4>() {
        let len = u32::from_be_bytes(*len) as usize;
        let Some(payload) = tail.get(..len) else { break };
        let Ok(json) = serde_json::from_slice::<serde_json::Value>(payload) else { break };
        frames.push(json);
        data = &tail[len..];
    }
    (frames, data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::frame;
    use crate::fsproxy::{Config, StdioRole};
    use crate::handles::ClientId;
    use crate::policy::Policy;

    fn record(config: &Config, inputs: &[Input]) -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &Header::fsproxy(config.clone())).unwrap();
        let mut m = FsProxy::new(config.clone());
        for (i, input) in inputs.iter().enumerate() {
            let now = Instant::from_micros(i as u64 * 10);
            w.input(0, now, input).unwrap();
            m.handle(now, input.clone());
            while let Some(o) = m.poll_output() {
                w.output(0, &o).unwrap();
            }
        }
        w.into_inner().unwrap()
    }

    fn session() -> (Config, Vec<Input>) {
        let config = Config::new(Policy::new("/w".into(), []), StdioRole::Reject);
        let c = ClientId(1);
        let req = |id: &str, body: &str| frame::encode(format!(r#"{{"id":"{id}",{body}}}"#).as_bytes());
        let inputs = vec![
            Input::Connected { client: c },
            Input::Bytes { client: c, data: req("1", r#""op":"open","params":{"path":"v","mode":"w"}"#) },
            Input::Bytes { client: c, data: req("2", r#""op":"close","params":{"h":3}"#) },
            Input::Eof { client: c },
        ];
        (config, inputs)
    }

    #[test]
    fn round_trips() {
        let (config, inputs) = session();
        let trace = record(&config, &inputs);
        let report = replay(trace.as_slice()).unwrap();
        assert_eq!(report.inputs, 4);
        assert!(report.outputs >= 3);
        assert_eq!(report.machines[0].tracked_clients(), 0);
    }

    #[test]
    fn names_the_line_of_a_changed_output() {
        let (config, inputs) = session();
        let text = String::from_utf8(record(&config, &inputs)).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let idx = lines.iter().position(|l| l.contains("\"output\"")).unwrap();
        lines[idx] = r#"{"level":0,"output":{"output":"close","client":9}}"#.to_owned();
        let err = replay(lines.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Differs { line, .. } if line == idx + 1), "{err}");
    }

    #[test]
    fn missing_and_extra_outputs_are_named() {
        let (config, inputs) = session();
        let text = String::from_utf8(record(&config, &inputs)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let idx = lines.iter().position(|l| l.contains("\"output\"")).unwrap();
        let mut dropped = lines.clone();
        dropped.remove(idx);
        let err = replay(dropped.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Extra { line, .. } if line == idx + 1), "{err}");
        let mut doubled = lines.clone();
        doubled.insert(idx, lines[idx]);
        let err = replay(doubled.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Missing { .. } | ReplayError::Differs { .. }), "{err}");
    }

    #[test]
    fn rejects_unknown_levels_and_formats() {
        let (config, _) = session();
        let header = serde_json::to_string(&Header::fsproxy(config)).unwrap();
        let text = format!("{header}\n{{\"now\":0,\"level\":3,\"input\":{{\"input\":\"upstream_eof\"}}}}\n");
        let err = replay(text.as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Malformed { line: 2, .. }), "{err}");
        let bad = header.replace("\"format\":1", "\"format\":99");
        assert!(matches!(replay(bad.as_bytes()), Err(ReplayError::Malformed { line: 1, .. })));
        assert!(matches!(replay(&b""[..]), Err(ReplayError::NoHeader)));
    }

    #[test]
    fn notes_are_skipped_but_not_mixed_with_records() {
        let (config, inputs) = session();
        let text = String::from_utf8(record(&config, &inputs)).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.insert(2, r#"{"note":{"swap":"out/link","to":"/etc"}}"#.to_owned());
        let report = replay(lines.join("\n").as_bytes()).unwrap();
        assert_eq!(report.inputs, 4);
        lines[2] = r#"{"now":0,"input":{"input":"eof","client":1},"note":"x"}"#.to_owned();
        let err = replay(lines.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Malformed { line: 3, .. }), "{err}");
    }

    #[test]
    fn replay_any_picks_the_machine_from_the_header() {
        let (config, inputs) = session();
        let trace = record(&config, &inputs);
        let r = replay_any(trace.as_slice()).unwrap();
        assert_eq!((r.machine.as_str(), r.inputs), ("fsproxy", 4));
        let text = String::from_utf8(trace).unwrap().replacen("\"fsproxy\"", "\"kernel\"", 1);
        let err = replay_any(text.as_bytes()).unwrap_err();
        assert!(err.contains("machine \"kernel\" cannot be replayed"), "{err}");
    }

    #[test]
    fn a_header_alone_is_not_a_passing_replay() {
        let (config, _) = session();
        let header = serde_json::to_string(&Header::fsproxy(config)).unwrap();
        let err = replay(format!("{header}\n\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::NoRecords), "{err}");
    }

    #[test]
    fn differences_show_frames_as_json() {
        let (config, inputs) = session();
        let text = String::from_utf8(record(&config, &inputs)).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let idx = lines.iter().position(|l| l.contains("\"send\"")).unwrap();
        let mut data = frame::encode(br#"{"id":"1","ok":false}"#);
        data.extend_from_slice(&[0, 0]);
        let forged = Output::Send { client: ClientId(1), data };
        lines[idx] = serde_json::to_string(&OutputLineRef { level: 0, output: &forged }).unwrap();
        let err = replay(lines.join("\n").as_bytes()).unwrap_err().to_string();
        assert!(err.contains(r#""frames":[{"id":"1","ok":false}],"output":"send","rest":"AAA=""#), "{err}");
        assert!(err.contains(r#""frames":[{"id":"1","ok":true,"result":{"handle":3}}]"#), "{err}");
        assert!(!err.contains("\"data\""), "{err}");
    }
}
