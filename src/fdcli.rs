//! `airlock fd ...`: the pager's client, for scripts and agents running
//! under airlock; and the `run` flags that shape a child's fd table.

use crate::client::{Client, ClientError};
use airlock_core::fsproxy::wire::{Op, Success};
use airlock_core::fsproxy::Config;
use airlock_core::pager::wire::{parse_fd, FdOp};
use airlock_core::pager::PagerConfig;
use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{Map, Value};
use std::io::{Read, Write};

/// Raw bytes per `FD_WRAP` chunk: with base64 and the envelope, a frame
/// of about 64 KiB, well under the default `--max-frame`.
pub const WRAP_CHUNK: usize = 48 * 1024;
/// Chunks in flight while streaming.
pub const WRAP_WINDOW: usize = 8;
/// Largest answer the client accepts.
pub const MAX_ANSWER: usize = 64 << 20;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct FdArgs {
    /// Give the child a fresh fd table: it sees only the fds named with
    /// --preload-fd and those it wraps itself (needs a parent airlock).
    #[arg(long)]
    pub isolate_fds: bool,
    /// With --isolate-fds: an fd of the parent session the child may use.
    #[arg(long = "preload-fd", value_name = "fd:N", requires = "isolate_fds")]
    pub preload_fd: Vec<String>,
}

impl FdArgs {
    /// The view a forwarding level gives its children.
    pub fn isolation(&self, upstream: bool) -> anyhow::Result<Option<Vec<String>>> {
        if !self.isolate_fds {
            return Ok(None);
        }
        if !upstream {
            bail!("--isolate-fds needs a parent airlock session: at the top the session's fd table is already fresh");
        }
        for fd in &self.preload_fd {
            if parse_fd(fd).is_none() {
                bail!("--preload-fd {fd:?}: want fd:N");
            }
        }
        Ok(Some(self.preload_fd.clone()))
    }
}

/// The `[file_descriptor]` section checked against this level's limits.
pub fn pager_config(
    settings: &crate::config::Settings,
    config: &Config,
) -> anyhow::Result<Option<PagerConfig>> {
    let Some(p) = &settings.pager else { return Ok(None) };
    let warnings = p.validate(config.max_frame).map_err(anyhow::Error::msg)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    if config.upstream {
        tracing::warn!(
            "this airlock runs under another: its [file_descriptor] is ignored, the fds live at the top"
        );
    }
    Ok(Some(p.clone()))
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum FdCommand {
    /// Store stdin (or PATH, read through the session's file policy) as
    /// an fd; content at or under the threshold is printed unchanged.
    Wrap {
        /// Where the content comes from; `user_input` uses max_input_chars.
        #[arg(long)]
        source: Option<String>,
        /// A file, or `-` (the default) for stdin.
        path: Option<String>,
    },
    /// Print a page (page 1 by default), the whole content, lines A-B,
    /// or the fd's preview again.
    Read {
        fd: String,
        #[arg(long)]
        page: Option<u64>,
        #[arg(long)]
        all: bool,
        /// Lines A-B, 1-based, inclusive.
        #[arg(long, value_name = "A-B", value_parser = parse_range)]
        lines: Option<(u64, u64)>,
        /// The `<fd_result>` the wrap answered, with page 1 as its preview.
        #[arg(long)]
        preview: bool,
    },
    /// Write an fd (or a page, or lines A-B of it) to PATH through the
    /// session's file policy.
    ToFile {
        fd: String,
        path: String,
        #[arg(long, value_parser = ["write", "append", "insert"])]
        mode: Option<String>,
        /// With --mode insert: insert before this line of the file.
        #[arg(long, value_name = "N")]
        at_line: Option<u64>,
        #[arg(long)]
        page: Option<u64>,
        #[arg(long, value_name = "A-B", value_parser = parse_range)]
        lines: Option<(u64, u64)>,
    },
    /// Print the lines holding QUERY (a literal substring).
    Search {
        fd: String,
        query: String,
        #[arg(long)]
        ignore_case: bool,
    },
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once('-').ok_or("want A-B")?;
    let n = |x: &str| x.trim().parse::<u64>().map_err(|_| format!("{x:?} is not a line number"));
    Ok((n(a)?, n(b)?))
}

/// What went wrong, for the exit status: an `fd_error` goes to stdout.
enum Outcome {
    Done,
    FdError(String),
}

/// `airlock fd ...`: exit 0, or 1 with the `fd_error` on stdout (or the
/// failure on stderr).
pub fn fd(cmd: &FdCommand) -> anyhow::Result<i32> {
    // No proxy is this command's error (exit 1), as for `airlock fs`.
    let mut client = match Client::connect() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("airlock fd: connecting to the airlock proxy: {e}");
            return Ok(1);
        }
    };
    client.set_max_frame(MAX_ANSWER);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = run(&mut client, cmd, &mut out);
    let result = match result {
        Ok(Outcome::Done) => Ok(0),
        Ok(Outcome::FdError(x)) => writeln!(out, "{x}").map(|_| 1).map_err(anyhow::Error::from),
        Err(e) => {
            let _ = out.flush();
            eprintln!("airlock fd: {e:#}");
            Ok(1)
        }
    };
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => result,
    }
}

fn params(pairs: impl IntoIterator<Item = (&'static str, Option<Value>)>) -> Map<String, Value> {
    pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v))).collect()
}

/// A pager answer: its result, or the `fd_error` it carries.
fn answer(r: Result<Success, ClientError>) -> anyhow::Result<Result<Map<String, Value>, String>> {
    match r {
        Ok(Success::Value(m)) => Ok(Ok(m)),
        Ok(other) => bail!("unexpected answer {other:?}"),
        Err(ClientError::Proxy(f)) if f.message.starts_with("<fd_error") => Ok(Err(f.message)),
        Err(e) => Err(e.into()),
    }
}

fn call(
    client: &mut Client,
    op: FdOp,
    p: Map<String, Value>,
) -> anyhow::Result<Result<Map<String, Value>, String>> {
    client.send(Op::Fd { op, params: p })?;
    answer(client.recv())
}

/// Print a rendering and its continuations (`cont` builds the request
/// for the part at a cursor).
fn print_parts(
    client: &mut Client,
    first: Map<String, Value>,
    out: &mut impl Write,
    cont: impl Fn(u64) -> (FdOp, Map<String, Value>),
) -> anyhow::Result<Outcome> {
    let mut m = first;
    loop {
        out.write_all(m.get("xml").and_then(Value::as_str).unwrap_or_default().as_bytes())?;
        let Some(next) = m.get("next").and_then(Value::as_u64) else { break };
        let (op, p) = cont(next);
        m = match call(client, op, p)? {
            Ok(m) => m,
            Err(x) => return Ok(Outcome::FdError(x)),
        };
    }
    out.write_all(b"\n")?;
    Ok(Outcome::Done)
}

fn run(client: &mut Client, cmd: &FdCommand, out: &mut impl Write) -> anyhow::Result<Outcome> {
    let lines = |l: &Option<(u64, u64)>| {
        [("start_line", l.map(|(a, _)| Value::from(a))), ("end_line", l.map(|(_, b)| Value::from(b)))]
    };
    match cmd {
        FdCommand::Wrap { source, path } => wrap(client, source.as_deref(), path.as_deref(), out),
        FdCommand::Read { fd, page, all, lines: range, preview } => {
            let [s, e] = lines(range);
            let base = params([
                ("fd", Some(fd.clone().into())),
                ("page", page.map(Value::from)),
                ("all", all.then_some(true.into())),
                ("preview", preview.then_some(true.into())),
                s,
                e,
            ]);
            match call(client, FdOp::Read, base.clone())? {
                Err(x) => Ok(Outcome::FdError(x)),
                Ok(m) => print_parts(client, m, out, |c| {
                    let mut p = base.clone();
                    p.insert("cursor".into(), c.into());
                    (FdOp::Read, p)
                }),
            }
        }
        FdCommand::Search { fd, query, ignore_case } => {
            let base = params([
                ("fd", Some(fd.clone().into())),
                ("query", Some(query.clone().into())),
                ("ignore_case", ignore_case.then_some(true.into())),
            ]);
            match call(client, FdOp::Search, base.clone())? {
                Err(x) => Ok(Outcome::FdError(x)),
                Ok(m) => print_parts(client, m, out, |c| {
                    let mut p = base.clone();
                    p.insert("cursor".into(), c.into());
                    (FdOp::Search, p)
                }),
            }
        }
        FdCommand::ToFile { fd, path, mode, at_line, page, lines: range } => {
            let [s, e] = lines(range);
            let p = params([
                ("fd", Some(fd.clone().into())),
                ("path", Some(path.clone().into())),
                ("mode", mode.clone().map(Value::from)),
                ("insert_at_line", at_line.map(Value::from)),
                ("page", page.map(Value::from)),
                s,
                e,
            ]);
            match call(client, FdOp::ToFile, p)? {
                Err(x) => Ok(Outcome::FdError(x)),
                Ok(m) => print_parts(client, m, out, |_| unreachable_cont()),
            }
        }
    }
}

/// `fd_write` is never continued; a server that says otherwise gets a
/// request it will refuse.
fn unreachable_cont() -> (FdOp, Map<String, Value>) {
    (FdOp::Read, Map::new())
}

/// The answer to the last chunk of a wrap.
fn wrapped(client: &mut Client, m: Map<String, Value>, out: &mut impl Write) -> anyhow::Result<Outcome> {
    if m.get("direct").and_then(Value::as_bool) == Some(true) {
        let data = m.get("data").and_then(Value::as_str).unwrap_or_default();
        out.write_all(&STANDARD.decode(data).context("direct content is not base64")?)?;
        return Ok(Outcome::Done);
    }
    let fd = m.get("fd").and_then(Value::as_str).unwrap_or_default().to_owned();
    print_parts(client, m, out, |c| {
        let p = params([
            ("fd", Some(fd.clone().into())),
            ("preview", Some(true.into())),
            ("cursor", Some(c.into())),
        ]);
        (FdOp::Read, p)
    })
}

fn wrap(
    client: &mut Client,
    source: Option<&str>,
    path: Option<&str>,
    out: &mut impl Write,
) -> anyhow::Result<Outcome> {
    let source = source.map(|s| Value::from(s.to_owned()));
    if let Some(path) = path.filter(|p| *p != "-") {
        let p = params([("path", Some(path.to_owned().into())), ("source", source)]);
        return match call(client, FdOp::Wrap, p)? {
            Ok(m) => wrapped(client, m, out),
            Err(x) => Ok(Outcome::FdError(x)),
        };
    }
    // Stdin, streamed: chunks pipelined, the last one marked.
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; WRAP_CHUNK];
    let mut offset = 0u64;
    let mut inflight = 0usize;
    loop {
        let n = read_full(&mut stdin, &mut buf)?;
        let last = n < buf.len();
        let p = params([
            ("stream", Some("stdin".into())),
            ("data", Some(STANDARD.encode(&buf[..n]).into())),
            ("more", (!last).then_some(true.into())),
            ("offset", Some(offset.into())),
            ("source", if last { source.clone() } else { None }),
        ]);
        offset += n as u64;
        client.send(Op::Fd { op: FdOp::Wrap, params: p })?;
        inflight += 1;
        if last {
            // Everything before the last chunk answers `received`.
            while inflight > 1 {
                if let Err(x) = answer(client.recv())? {
                    return Ok(Outcome::FdError(x));
                }
                inflight -= 1;
            }
            return match answer(client.recv())? {
                Ok(m) => wrapped(client, m, out),
                Err(x) => Ok(Outcome::FdError(x)),
            };
        }
        if inflight >= WRAP_WINDOW {
            if let Err(x) = answer(client.recv())? {
                return Ok(Outcome::FdError(x));
            }
            inflight -= 1;
        }
    }
}

/// Fill `buf` unless the input ends first.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
