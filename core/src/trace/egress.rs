//! Traces of the egress machine (`airlock run --record`'s second file, the
//! simulator's `egress` scenario): the FS proxy's JSONL shape with one
//! level, and a header holding the machine's config.
//!
//! ```text
//! {"format":1,"machine":"egress","config":{..},"seed":7,"meta":{..}}
//! {"now":1200,"input":{"accepted":{"conn":1,"listener":"http"}}}
//! {"output":{"read_client":{"conn":1,"max":16384}}}
//! {"note":"dns: rebind.test answers 10.0.0.5 from now on"}
//! ```
//!
//! Only request heads (and what came with them) pass through the machine:
//! a tunnel's bytes are moved by the shell and appear as counts
//! (`moved`), so a trace holds no payload.

use super::{
    first_line, numbered, parse_header, replay_records, Machine, Numbered, Readable, ReplayError, FORMAT,
};
use crate::egress::{Config, Egress, Input, Output};
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use std::io::BufRead;

/// The machine name of an egress trace.
pub const MACHINE_EGRESS: &str = "egress";

/// The first line of an egress trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub machine: String,
    pub config: Config,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Free-form notes (the simulator's world and failure); replay ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl Header {
    pub fn new(config: &Config) -> Self {
        Header {
            format: FORMAT,
            machine: MACHINE_EGRESS.to_owned(),
            config: config.clone(),
            seed: None,
            meta: None,
        }
    }
}

#[derive(Serialize)]
struct InputLine<'a> {
    now: Instant,
    input: &'a Input,
}

#[derive(Serialize)]
struct OutputLine<'a> {
    output: &'a Output,
}

#[derive(Serialize)]
struct NoteLine<'a> {
    note: &'a str,
}

fn line<T: Serialize>(value: &T) -> String {
    // Plain data with string keys: serializing cannot fail.
    let mut text = serde_json::to_string(value).unwrap_or_default();
    text.push('\n');
    text
}

/// One JSON line (with its newline) for each kind of record.
pub fn header_line(header: &Header) -> String {
    line(header)
}

pub fn input_line(now: Instant, input: &Input) -> String {
    line(&InputLine { now, input })
}

pub fn output_line(output: &Output) -> String {
    line(&OutputLine { output })
}

pub fn note_line(note: &str) -> String {
    line(&NoteLine { note })
}

impl Machine for Egress {
    type Input = Input;
    type Output = Output;
    fn handle(&mut self, now: Instant, input: Input) {
        Egress::handle(self, now, input)
    }
    fn poll_output(&mut self) -> Option<Output> {
        Egress::poll_output(self)
    }
}

impl Readable for Output {
    fn readable(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What a successful replay went through.
#[derive(Debug)]
pub struct ReplayReport {
    pub header: Header,
    pub inputs: u64,
    pub outputs: u64,
    /// Connections still open after the last input.
    pub open: usize,
}

/// Replay an egress trace: rebuild the machine from the header's config,
/// feed the inputs in order and check each recorded output against what
/// it yields. Fails at the first difference, naming its line.
pub fn replay<R: BufRead>(reader: R) -> Result<ReplayReport, ReplayError<Output>> {
    let mut lines = numbered(reader);
    let (line, text) = first_line(&mut lines)?;
    let header: Header = parse_header(line, &text, MACHINE_EGRESS)?;
    replay_from(header, lines)
}

pub(super) fn replay_from(header: Header, lines: Numbered<'_>) -> Result<ReplayReport, ReplayError<Output>> {
    let mut machines = [Egress::new(header.config.clone())];
    let (inputs, outputs) = replay_records(&mut machines, lines)?;
    let [m] = machines;
    Ok(ReplayReport { header, inputs, outputs, open: m.open() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::{ConnId, Listener, Rules};

    fn record() -> String {
        let rules = Rules { allow: vec!["a.example".parse().unwrap()], deny: vec![] };
        let config = Config::new(rules);
        let mut m = Egress::new(config.clone());
        let mut text = header_line(&Header::new(&config));
        let c = ConnId(1);
        let inputs = [
            Input::Accepted { conn: c, listener: Listener::Http },
            Input::ClientBytes { conn: c, data: b"CONNECT a.example:443 HTTP/1.1\r\n\r\n".to_vec() },
            Input::Resolved { conn: c, result: Ok(vec!["93.184.216.34".parse().unwrap()]) },
            Input::Connected { conn: c, result: Ok("93.184.216.34:443".parse().unwrap()) },
            Input::Moved { conn: c, up: 10, down: 20 },
            Input::RelayEnded { conn: c, error: None },
        ];
        for (i, input) in inputs.into_iter().enumerate() {
            let now = Instant::from_micros(1000 * i as u64);
            text.push_str(&input_line(now, &input));
            m.handle(now, input);
            while let Some(o) = m.poll_output() {
                text.push_str(&output_line(&o));
            }
            text.push_str(&note_line("a note for a reader"));
        }
        text
    }

    #[test]
    fn round_trips_and_answers_what_it_recorded() {
        let r = replay(record().as_bytes()).unwrap();
        assert_eq!((r.inputs, r.open), (6, 0));
        assert!(r.outputs >= 7, "{}", r.outputs);
        let any = super::super::replay_any(record().as_bytes()).unwrap();
        assert_eq!(any.machine, MACHINE_EGRESS);
    }

    #[test]
    fn a_changed_output_is_named_by_its_line() {
        let text = record();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let idx = lines.iter().position(|l| l.contains("\"audit\"")).unwrap();
        lines[idx] = lines[idx].replace("\"down\":20", "\"down\":21");
        let err = replay(lines.join("\n").as_bytes()).unwrap_err();
        assert!(matches!(err, ReplayError::Differs { line, .. } if line == idx + 1), "{err}");
    }
}
