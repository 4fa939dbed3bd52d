//! `toolexec_events`: arbitrary event sequences into one ToolExec
//! [`Exchange`], within the shell's contract (reads no larger than granted,
//! output only while a read is outstanding), with the protocol's invariants
//! checked after every event.

use crate::heapcount::{self, Tag};
use crate::time::Instant;
use crate::toolexec::{
    validate_token, Config, Exchange, ExitStatus, Gate, Input, Mode, Output, RequestHead, SpawnError,
    EXIT_CODE_TIMEOUT,
};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &[u8] = b"fuzz-token";

/// The exchange's heap tag (0 is the harness's).
const EXCHANGE: Tag = Tag::new(1);

struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let end = self.at.saturating_add(n).min(self.data.len());
        let s = &self.data[self.at..end];
        self.at = end;
        s
    }
}

fn head(sel: u8, arg: u8, body_len: usize) -> RequestHead {
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    let good_auth = sel & 0x03 != 0;
    if good_auth {
        let v = match sel & 0x03 {
            1 => [&b"Bearer "[..], TOKEN].concat(),
            2 => [&b"x="[..], TOKEN].concat(),
            _ => TOKEN.to_vec(),
        };
        headers.push(("authorization".into(), v));
    } else if arg & 1 == 1 {
        headers.push(("authorization".into(), b"Bearer nope".to_vec()));
    }
    match (sel >> 2) & 0x03 {
        0 => {}
        1 => headers.push(("x-aifo-proto".into(), b"1".to_vec())),
        2 => headers.push(("x-aifo-proto".into(), b"2".to_vec())),
        _ => headers.push(("x-aifo-proto".into(), vec![arg])),
    }
    if sel & 0x10 != 0 {
        headers.push(("te".into(), b"trailers".to_vec()));
    }
    if sel & 0x20 != 0 {
        let len = if arg & 2 == 2 { body_len.saturating_add(usize::from(arg)) } else { body_len };
        headers.push(("content-length".into(), len.to_string().into_bytes()));
    }
    RequestHead {
        method: if sel & 0x40 != 0 { "POST".into() } else { "PUT".into() },
        path: if sel & 0x80 != 0 || arg & 4 == 0 { "/exec".into() } else { "/x".into() },
        headers,
        http11: arg & 8 == 0,
    }
}

/// What a well-behaved exchange may emit, checked as it comes.
#[derive(Default)]
struct Seen {
    answers: u32,
    done: bool,
    read_max: Option<usize>,
    /// Bytes fed since the first `ReadNow`: the final drain is bounded.
    final_fed: Option<u64>,
    streamed: Vec<u8>,
    fed: Vec<u8>,
    authorized: bool,
    spawned: bool,
    client_gone: bool,
    timed_out_code: bool,
}

pub fn toolexec_events(data: &[u8]) {
    let mut b = Bytes { data, at: 0 };
    let cfg_byte = b.byte().unwrap_or(0);
    let mut config = Config::new(validate_token(TOKEN).expect("a valid token"), b"/w".to_vec());
    for t in ["make", "cargo"] {
        config.add_tool_spec(t).expect("a valid tool name");
    }
    config.timeout = Duration::from_millis(100 + u64::from(cfg_byte & 0x0f) * 100);
    config.kill_grace = Duration::from_millis(50 + u64::from(cfg_byte >> 4) * 50);
    config.max_body = 64;
    config.max_buffered = 512;
    config.stream_window = 256;
    config.read_chunk = 64;
    config.final_drain = 300;
    let config = Arc::new(config);
    let mut now = 0u64;
    let heap_base = heapcount::live(EXCHANGE).unwrap_or(0);
    let mut ex = EXCHANGE.scope(|| Exchange::new(config.clone(), Instant::from_micros(now)));
    let mut seen = Seen::default();
    let mut fed_head = false;
    while let Some(op) = b.byte() {
        let arg = b.byte().unwrap_or(0);
        let input = match op % 11 {
            0 if !fed_head => {
                fed_head = true;
                let arg2 = b.byte().unwrap_or(0);
                let h = head(arg, arg2, usize::from(arg2 % 80));
                seen.authorized = h.headers.iter().filter(|(n, _)| n == "authorization").count() == 1
                    && h.headers.iter().any(|(n, v)| n == "authorization" && v.ends_with(TOKEN));
                Some(Input::Head(h))
            }
            1 => {
                let chunk = b.take(usize::from(arg % 48)).to_vec();
                Some(Input::Body(chunk))
            }
            2 => Some(Input::Body(b"tool=make&arg=a%20b&cwd=sub".to_vec())),
            3 => Some(Input::BodyEnd),
            4 => Some(Input::Spawned(match arg % 4 {
                0 => Err(SpawnError::NotInstalled),
                1 => Err(SpawnError::Other("x".into())),
                _ => Ok(()),
            })),
            5 => seen.read_max.take().map(|max| {
                let n = usize::from(arg).min(max).max(1);
                let bytes = b.take(n).to_vec();
                seen.fed.extend_from_slice(&bytes);
                if let Some(f) = seen.final_fed.as_mut() {
                    *f += bytes.len() as u64;
                }
                Input::ToolOutput(bytes)
            }),
            6 => seen.read_max.take().map(|_| Input::ToolEof),
            7 => Some(Input::ToolExited(if arg & 0x80 != 0 {
                ExitStatus::Signal(i32::from(arg & 0x1f))
            } else {
                ExitStatus::Code(i32::from(arg))
            })),
            8 => Some(Input::ClientTook(u64::from(arg))),
            9 => Some(Input::ClientGone),
            _ => {
                now += u64::from(arg) * if op & 0x80 != 0 { 50_000 } else { 1_000 };
                EXCHANGE.scope(|| ex.handle_timeout(Instant::from_micros(now)));
                None
            }
        };
        if let Some(input) = input {
            if matches!(input, Input::ClientGone) {
                seen.client_gone = true;
            }
            EXCHANGE.scope(|| ex.handle(Instant::from_micros(now), input));
        }
        drain(&mut ex, &config, &mut seen);
        // What the exchange holds on the heap stays within what its limits
        // allow (`Gate::heap_check`), when the counting allocator is the
        // global one (the fuzz target and the corpus replay install it).
        if let Some(live) = heapcount::live(EXCHANGE) {
            if let Err(m) = Gate::new(1).heap_check([&ex], live.wrapping_sub(heap_base)) {
                panic!("bounded_memory: the exchange {m}");
            }
        }
    }
}

fn drain(ex: &mut Exchange, config: &Config, seen: &mut Seen) {
    while let Some(out) = EXCHANGE.scope(|| ex.poll_output()) {
        assert!(!seen.done, "{out:?} after Done");
        match out {
            Output::Respond(_) | Output::SendHead(_) => {
                seen.answers += 1;
                assert!(seen.answers <= 1, "a second answer");
                assert!(!seen.client_gone, "an answer to a client that left");
            }
            Output::Spawn(req) => {
                assert!(seen.authorized, "spawn without a valid token");
                assert!(config.tools.contains_key(&req.tool), "spawn of a tool not allowed: {:?}", req.tool);
                assert!(!seen.spawned, "a second spawn");
                seen.spawned = true;
            }
            Output::ReadOutput { max } => {
                assert!(seen.read_max.is_none(), "a second read while one is outstanding");
                assert!(max > 0 && max <= config.read_chunk, "read of {max}");
                seen.read_max = Some(max);
            }
            Output::ReadNow { max } => {
                // Replaces a waiting read, if one is outstanding.
                assert!(max > 0 && max <= config.read_chunk, "read of {max}");
                let fed = *seen.final_fed.get_or_insert(0);
                assert!(fed + max as u64 <= config.final_drain, "final drain past {}", config.final_drain);
                seen.read_max = Some(max);
            }
            Output::SendChunk(bytes) => {
                assert!(!seen.client_gone, "bytes to a client that left");
                seen.streamed.extend_from_slice(&bytes);
            }
            Output::Finish { exit_code } => seen.timed_out_code = exit_code == EXIT_CODE_TIMEOUT,
            Output::Done => seen.done = true,
            Output::ReadBody | Output::Signal(_) => {}
        }
        if ex.mode() == Mode::Streaming {
            assert!(ex.waiting_bytes() <= config.stream_window, "{} bytes wait", ex.waiting_bytes());
        }
        assert!(ex.buffered_bytes() <= config.max_buffered, "{} bytes buffered", ex.buffered_bytes());
        // What streamed is what the tool wrote, in order; a timeout may add
        // its one line at the end.
        let line = format!("toolexec: timed out after {} s\n", config.timeout.as_secs());
        let without_line = seen.streamed.strip_suffix(line.as_bytes());
        assert!(
            seen.fed.starts_with(&seen.streamed) || without_line.is_some_and(|s| seen.fed.starts_with(s)),
            "streamed bytes differ from the tool's"
        );
        if seen.done && !seen.client_gone && !seen.timed_out_code && seen.answers == 1 && seen.spawned {
            // A stream that ended normally carried every byte read.
            assert!(seen.streamed.len() == seen.fed.len() || ex.mode() == Mode::Buffered, "bytes lost");
        }
    }
}
