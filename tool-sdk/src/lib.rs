//! Write a VFS tool (seed 004) in Rust: [`VfsHost`] reads the host's `init`
//! from stdin, sends requests on stdout and blocks on each answer, and ends
//! with [`VfsHost::result`] or [`VfsHost::error`].
//!
//! ```no_run
//! use airlock_tool::{ContentBlock, VfsHost};
//!
//! fn main() -> Result<(), airlock_tool::Error> {
//!     let mut host = VfsHost::connect()?; // reads init from stdin
//!     let content = host.read_text("src/main.rs")?;
//!     host.write("src/main.rs", format!("// edited\n{content}").as_bytes())?;
//!     host.result(vec![ContentBlock::text("Modified src/main.rs")])
//! }
//! ```
//!
//! This crate depends on `serde_json` and `base64` only: a tool never
//! pulls in the host.

use base64::Engine as _;
use serde_json::{json, Value};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Stdin, Stdout, Write};

/// The protocol version this client speaks.
pub const PROTOCOL_VERSION: &str = "0.1.0";

/// Longest line read from the host (a 10 MiB file in base64, with room).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug)]
pub enum Error {
    /// The host answered with a JSON-RPC error (`-32001` access denied,
    /// `-32002` not found, `-32003` exists, `-32004` timeout, `-32005`
    /// cancelled, `-326xx` protocol and I/O).
    Rpc {
        code: i64,
        message: String,
    },
    /// The host sent `cancel`: stop and exit.
    Cancelled,
    /// The host broke the protocol or closed the connection.
    Protocol(String),
    Io(io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Rpc { code, message } => write!(f, "{message} ({code})"),
            Error::Cancelled => write!(f, "cancelled by the host"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

/// A typed content block of a result.
#[derive(Clone, Debug, PartialEq)]
pub struct ContentBlock(Value);

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock(json!({"type": "text", "text": text.into()}))
    }

    /// Any other block type, as JSON.
    pub fn raw(value: Value) -> Self {
        ContentBlock(value)
    }
}

/// The tool as `init` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInit {
    pub name: String,
    pub arguments: Value,
    pub answers: Value,
    pub options: Value,
    pub protocol_version: String,
}

/// One `fs.list_dir` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
}

/// The output of `process.run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i64>,
    pub signal: Option<i64>,
}

/// An HTTP response (`http.get`, `http.post`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The connection to the host over any reader and writer (stdin and
/// stdout for a real tool).
pub struct VfsHost<R = BufReader<Stdin>, W = Stdout> {
    input: R,
    output: W,
    init: ToolInit,
    next_id: u64,
    /// `apply` inputs that arrived while a call was waiting.
    applies: Vec<String>,
}

impl VfsHost {
    /// Read `init` from stdin.
    pub fn connect() -> Result<Self, Error> {
        VfsHost::with_io(BufReader::new(io::stdin()), io::stdout())
    }
}

impl<R: BufRead, W: Write> VfsHost<R, W> {
    pub fn with_io(mut input: R, output: W) -> Result<Self, Error> {
        let msg = read_message(&mut input)?.ok_or_else(|| Error::Protocol("no init from the host".into()))?;
        if msg.get("method").and_then(Value::as_str) != Some("init") {
            return Err(Error::Protocol(format!("expected init, got {msg}")));
        }
        let p = &msg["params"];
        let t = &p["tool"];
        let init = ToolInit {
            name: t["name"].as_str().unwrap_or_default().to_owned(),
            arguments: t.get("arguments").cloned().unwrap_or(Value::Null),
            answers: t.get("answers").cloned().unwrap_or(Value::Null),
            options: t.get("options").cloned().unwrap_or(Value::Null),
            protocol_version: p["protocol_version"].as_str().unwrap_or_default().to_owned(),
        };
        Ok(VfsHost { input, output, init, next_id: 0, applies: Vec::new() })
    }

    pub fn init(&self) -> &ToolInit {
        &self.init
    }

    /// One request and its result. A `cancel` from the host ends the call
    /// with [`Error::Cancelled`]; `apply` inputs are kept for
    /// [`VfsHost::next_apply`].
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, Error> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let msg = read_message(&mut self.input)?.ok_or_else(|| {
                Error::Protocol(format!("the host closed stdin while {method} was pending"))
            })?;
            match msg.get("method").and_then(Value::as_str) {
                Some("cancel") => return Err(Error::Cancelled),
                Some("apply") => {
                    self.applies.push(msg["params"]["input"].as_str().unwrap_or_default().to_owned());
                    continue;
                }
                Some(other) => return Err(Error::Protocol(format!("unexpected {other} from the host"))),
                None => {}
            }
            if msg.get("id").and_then(Value::as_u64) != Some(id) {
                return Err(Error::Protocol(format!("answer for another request: {msg}")));
            }
            if let Some(e) = msg.get("error") {
                return Err(Error::Rpc {
                    code: e["code"].as_i64().unwrap_or(0),
                    message: e["message"].as_str().unwrap_or_default().to_owned(),
                });
            }
            return msg.get("result").cloned().ok_or_else(|| Error::Protocol(format!("no result: {msg}")));
        }
    }

    /// A file's bytes (decoded from base64 when the host sent binary).
    pub fn read(&mut self, path: &str) -> Result<Vec<u8>, Error> {
        let r = self.call("fs.read", json!({"path": path}))?;
        decode(&r, "content")
    }

    /// A file's text; binary content is an error.
    pub fn read_text(&mut self, path: &str) -> Result<String, Error> {
        String::from_utf8(self.read(path)?).map_err(|_| Error::Protocol(format!("{path} is not UTF-8")))
    }

    /// Write a file (parents created).
    pub fn write(&mut self, path: &str, content: &[u8]) -> Result<(), Error> {
        let params = match std::str::from_utf8(content) {
            Ok(text) => json!({"path": path, "content": text}),
            Err(_) => json!({"path": path, "content": b64(content), "encoding": "base64"}),
        };
        self.call("fs.write", params).map(drop)
    }

    pub fn exists(&mut self, path: &str) -> Result<bool, Error> {
        Ok(self.call("fs.exists", json!({"path": path}))?["exists"].as_bool().unwrap_or(false))
    }

    /// `(kind, size)` of what `path` leads to.
    pub fn metadata(&mut self, path: &str) -> Result<(String, u64), Error> {
        let r = self.call("fs.metadata", json!({"path": path}))?;
        Ok((r["kind"].as_str().unwrap_or_default().to_owned(), r["size"].as_u64().unwrap_or(0)))
    }

    pub fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, Error> {
        let r = self.call("fs.list_dir", json!({"path": path}))?;
        Ok(r["entries"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| DirEntry {
                        path: e["path"].as_str().unwrap_or_default().to_owned(),
                        kind: e["kind"].as_str().unwrap_or_default().to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    pub fn delete(&mut self, path: &str) -> Result<(), Error> {
        self.call("fs.delete", json!({"path": path})).map(drop)
    }

    pub fn rename(&mut self, from: &str, to: &str) -> Result<(), Error> {
        self.call("fs.rename", json!({"from": from, "to": to})).map(drop)
    }

    /// `fs.grep`: the raw result (`matches`, `truncated`).
    pub fn grep(&mut self, pattern: &str, paths: &[&str]) -> Result<Value, Error> {
        self.call("fs.grep", json!({"pattern": pattern, "paths": paths}))
    }

    pub fn http_get(&mut self, url: &str, headers: &[(&str, &str)]) -> Result<HttpResponse, Error> {
        let r = self.call("http.get", json!({"url": url, "headers": header_list(headers)}))?;
        http_response(&r)
    }

    pub fn http_post(
        &mut self,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, Error> {
        let mut params = json!({"url": url, "headers": header_list(headers)});
        match std::str::from_utf8(body) {
            Ok(text) => params["body"] = json!(text),
            Err(_) => {
                params["body"] = json!(b64(body));
                params["encoding"] = json!("base64");
            }
        }
        let r = self.call("http.post", params)?;
        http_response(&r)
    }

    /// `process.run`: `envs` names `--env-allow`ed variables to pass.
    pub fn run(&mut self, program: &str, args: &[&str], envs: &[&str]) -> Result<ProcessOutput, Error> {
        let r = self.call("process.run", json!({"program": program, "args": args, "envs": envs}))?;
        Ok(ProcessOutput {
            stdout: r["stdout"].as_str().unwrap_or_default().to_owned(),
            stderr: r["stderr"].as_str().unwrap_or_default().to_owned(),
            exit_code: r["exit_code"].as_i64(),
            signal: r["signal"].as_i64(),
        })
    }

    /// Report a state (`running`, `waiting`) and wait for the next
    /// `apply` input; `None` when the host cancels instead.
    pub fn state(&mut self, kind: &str, content: &str) -> Result<Option<String>, Error> {
        self.send(
            &json!({"jsonrpc": "2.0", "method": "state", "params": {"type": kind, "content": content}}),
        )?;
        self.next_apply()
    }

    /// The next `apply` input, or `None` at `cancel` or EOF.
    pub fn next_apply(&mut self) -> Result<Option<String>, Error> {
        if !self.applies.is_empty() {
            return Ok(Some(self.applies.remove(0)));
        }
        let Some(msg) = read_message(&mut self.input)? else { return Ok(None) };
        match msg.get("method").and_then(Value::as_str) {
            Some("apply") => Ok(Some(msg["params"]["input"].as_str().unwrap_or_default().to_owned())),
            Some("cancel") => Ok(None),
            _ => Err(Error::Protocol(format!("unexpected message: {msg}"))),
        }
    }

    /// The final result; the tool should exit right after.
    pub fn result(mut self, content: Vec<ContentBlock>) -> Result<(), Error> {
        let blocks: Vec<Value> = content.into_iter().map(|b| b.0).collect();
        self.send(&json!({"jsonrpc": "2.0", "method": "result", "params": {"content": blocks}}))
    }

    /// The final error; the tool should exit right after.
    pub fn error(mut self, message: &str, transient: bool) -> Result<(), Error> {
        self.send(&json!({"jsonrpc": "2.0", "method": "error", "params": {"message": message, "transient": transient}}))
    }

    fn send(&mut self, msg: &Value) -> Result<(), Error> {
        let mut line = msg.to_string();
        line.push('\n');
        self.output.write_all(line.as_bytes())?;
        self.output.flush()?;
        Ok(())
    }
}

/// One message, blank lines skipped; `None` at EOF. Lines over
/// [`MAX_LINE`] are an error rather than an allocation without end.
fn read_message<R: BufRead>(input: &mut R) -> Result<Option<Value>, Error> {
    loop {
        let mut line = Vec::new();
        let n = input.by_ref().take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(None);
        }
        if line.len() > MAX_LINE {
            return Err(Error::Protocol(format!("a line from the host exceeds {MAX_LINE} bytes")));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        return serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| Error::Protocol(format!("the host sent invalid JSON: {e}")));
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn decode(r: &Value, field: &str) -> Result<Vec<u8>, Error> {
    let text = r[field].as_str().ok_or_else(|| Error::Protocol(format!("no {field} in {r}")))?;
    if r.get("encoding").and_then(Value::as_str) == Some("base64") {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| Error::Protocol(format!("{field} is not base64: {e}")))
    } else {
        Ok(text.as_bytes().to_vec())
    }
}

fn header_list(headers: &[(&str, &str)]) -> Vec<Value> {
    headers.iter().map(|(n, v)| json!({"name": n, "value": v})).collect()
}

fn http_response(r: &Value) -> Result<HttpResponse, Error> {
    Ok(HttpResponse {
        status: r["status"].as_u64().and_then(|s| u16::try_from(s).ok()).unwrap_or(0),
        headers: r["headers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| {
                        (
                            h["name"].as_str().unwrap_or_default().to_owned(),
                            h["value"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        body: decode(r, "body")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(input: &str) -> VfsHost<&[u8], Vec<u8>> {
        VfsHost::with_io(input.as_bytes(), Vec::new()).unwrap()
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","method":"init","params":{"tool":{"name":"t","arguments":{"a":1},"answers":{},"options":{}},"protocol_version":"0.1.0"}}
"#;

    #[test]
    fn init_then_a_read_round_trip() {
        let input = format!(
            "{INIT}\n{}\n",
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":"/wA=","encoding":"base64","size":2}}"#
        );
        let mut h = host(&input);
        assert_eq!(h.init().name, "t");
        assert_eq!(h.init().arguments, json!({"a": 1}));
        assert_eq!(h.read("x").unwrap(), vec![0xff, 0x00]);
        let sent: Value = serde_json::from_slice(&h.output).unwrap();
        assert_eq!(sent, json!({"jsonrpc": "2.0", "id": 1, "method": "fs.read", "params": {"path": "x"}}));
    }

    #[test]
    fn errors_and_cancel() {
        let input = format!(
            "{INIT}{}\n{}\n",
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"denied"}}"#,
            r#"{"jsonrpc":"2.0","method":"cancel"}"#
        );
        let mut h = host(&input);
        assert!(matches!(h.read("x"), Err(Error::Rpc { code: -32001, .. })));
        assert!(matches!(h.read("y"), Err(Error::Cancelled)));
        assert!(matches!(h.read("z"), Err(Error::Protocol(_))), "EOF while pending");
    }

    #[test]
    fn init_must_come_first() {
        assert!(VfsHost::with_io(&b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"[..], Vec::new()).is_err());
        assert!(VfsHost::with_io(&b""[..], Vec::new()).is_err());
    }
}
