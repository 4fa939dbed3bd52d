use super::*;
use crate::time::Instant;
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &[u8] = b"s3cret";

fn config() -> Config {
    let mut c = Config::new(validate_token(TOKEN).unwrap(), b"/work".to_vec());
    c.add_tool_spec("echo").unwrap();
    c.add_tool_spec("py=/usr/bin/python3").unwrap();
    c.timeout = Duration::from_secs(10);
    c.kill_grace = Duration::from_secs(2);
    c
}

fn at(secs: u64) -> Instant {
    Instant::from_micros(secs * 1_000_000)
}

fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> RequestHead {
    RequestHead {
        method: method.into(),
        path: path.into(),
        headers: headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.as_bytes().to_vec())).collect(),
        http11: true,
    }
}

fn good_head(proto: &str, te: bool) -> RequestHead {
    let mut h = vec![("Authorization", "Bearer s3cret"), ("X-Aifo-Proto", proto)];
    if te {
        h.push(("TE", "trailers"));
    }
    head("POST", "/exec", &h)
}

fn drain(x: &mut Exchange) -> Vec<Output> {
    std::iter::from_fn(|| x.poll_output()).collect()
}

fn status_of(outs: &[Output]) -> Option<u16> {
    outs.iter().find_map(|o| match o {
        Output::Respond(r) => Some(r.status),
        Output::SendHead(r) => Some(r.status),
        _ => None,
    })
}

/// Feed a head and a body; returns every output so far.
fn request(c: Config, h: RequestHead, body: &[u8]) -> (Exchange, Vec<Output>) {
    let mut x = Exchange::new(Arc::new(c), at(0));
    x.handle(at(0), Input::Head(h));
    let mut outs = drain(&mut x);
    if outs.contains(&Output::ReadBody) {
        x.handle(at(0), Input::Body(body.to_vec()));
        x.handle(at(0), Input::BodyEnd);
        outs.extend(drain(&mut x));
    }
    (x, outs)
}

#[test]
fn checks_in_order() {
    let cases: Vec<(RequestHead, &[u8], u16)> = vec![
        (head("GET", "/nope", &[]), b"", 404),
        (head("GET", "/exec", &[]), b"", 405),
        (head("POST", "/exec", &[("X-Aifo-Proto", "2")]), b"tool=nope", 401),
        (head("POST", "/exec", &[("Authorization", "Bearer wrong"), ("X-Aifo-Proto", "9")]), b"", 401),
        (
            head("POST", "/exec", &[("Authorization", "Bearer s3cret"), ("Authorization", "Bearer s3cret")]),
            b"",
            401,
        ),
        (head("POST", "/exec", &[("Authorization", "Bearer s3cret")]), b"", 426),
        (head("POST", "/exec", &[("Authorization", "Bearer s3cret"), ("X-Aifo-Proto", "3")]), b"", 426),
        (
            head(
                "POST",
                "/exec",
                &[("Authorization", "x=s3cret"), ("X-Aifo-Proto", "1"), ("Content-Length", "1048577")],
            ),
            b"",
            413,
        ),
        (good_head("1", false), b"tool=echo&tool=echo", 400),
        (good_head("1", false), b"cwd=/etc&tool=nope", 400),
        (good_head("1", false), b"arg=x", 400),
        (good_head("1", false), b"tool=%zz", 400),
        (good_head("1", false), b"tool=ec%00ho", 400),
        (good_head("1", false), b"tool=rm", 403),
    ];
    for (h, body, want) in cases {
        let (x, outs) = request(config(), h.clone(), body);
        assert_eq!(status_of(&outs), Some(want), "{h:?} {body:?}: {outs:?}");
        assert!(!outs.iter().any(|o| matches!(o, Output::Spawn(_))), "spawned on rejection: {outs:?}");
        assert_eq!(outs.last(), Some(&Output::Done));
        assert!(x.is_done());
        let Some(Output::Respond(r)) = outs.iter().find(|o| matches!(o, Output::Respond(_))) else {
            unreachable!()
        };
        assert!(r.headers.contains(&("X-Exit-Code", "86".to_owned())));
        if want == 426 {
            assert_eq!(r.body, UNSUPPORTED_PROTO_BODY.as_bytes());
        } else {
            assert!(r.body.starts_with(b"toolexec: ") && r.body.ends_with(b"\n"));
            assert_eq!(r.body.iter().filter(|&&b| b == b'\n').count(), 1);
        }
    }
}

#[test]
fn spawn_request_carries_the_form() {
    let (_, outs) =
        request(config(), good_head("2", true), b"tool=py&arg=-c&arg=print(1)+%2B+1&cwd=sub/../sub2&x=y");
    assert!(outs.contains(&Output::Spawn(SpawnRequest {
        tool: "py".into(),
        program: ToolProgram::Fixed(b"/usr/bin/python3".to_vec()),
        args: vec![b"-c".to_vec(), b"print(1) + 1".to_vec()],
        cwd: b"/work/sub2".to_vec(),
    })));
}

fn run_to_spawn(proto: &str, te: bool) -> Exchange {
    let (mut x, _) = request(config(), good_head(proto, te), b"tool=echo&arg=hi");
    x.handle(at(0), Input::Spawned(Ok(())));
    x
}

#[test]
fn v1_buffers_until_exit_and_eof() {
    let mut x = run_to_spawn("1", true);
    assert_eq!(x.mode(), Mode::Buffered);
    assert_eq!(drain(&mut x), vec![Output::ReadOutput { max: READ_CHUNK }]);
    x.handle(at(1), Input::ToolOutput(b"hi\n".to_vec()));
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(3)));
    x.handle(at(1), Input::ToolEof);
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.iter().find(|o| matches!(o, Output::Respond(_))) else {
        panic!("{outs:?}")
    };
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hi\n"[..]));
    assert!(r.headers.contains(&("X-Exit-Code", "3".to_owned())));
    assert!(outs.contains(&Output::Signal(Signal::Kill)));
    assert_eq!(outs.last(), Some(&Output::Done));
}

#[test]
fn v2_without_te_is_v1() {
    assert_eq!(run_to_spawn("2", false).mode(), Mode::Buffered);
    assert_eq!(run_to_spawn("2", true).mode(), Mode::Streaming);
}

#[test]
fn te_is_read_as_the_http_layer_reads_it() {
    use super::machine::te_has_trailers;
    for yes in ["trailers", "Trailers", " trailers\t", "gzip, trailers", "trailers,deflate", "a,,trailers"] {
        assert!(te_has_trailers(yes.as_bytes()), "{yes:?}");
    }
    // A `;` parameter, a byte that is not visible ASCII anywhere in the
    // value: hyper would then drop the trailer, and the exit code with it.
    for no in [
        "",
        "gzip",
        "trailer",
        "xtrailers",
        "trailers;q=1",
        "trailers,\u{1f5}",
        "trailers\u{7f}",
        "gzip\u{0}, trailers",
    ] {
        assert!(!te_has_trailers(no.as_bytes()), "{no:?}");
    }
    assert!(!te_has_trailers(b"trailers, \x80"));
}

#[test]
fn v2_with_a_te_the_http_layer_ignores_is_v1() {
    for te in ["trailers;q=1", "trailers,\u{1f5}"] {
        let h =
            head("POST", "/exec", &[("Authorization", "Bearer s3cret"), ("X-Aifo-Proto", "2"), ("TE", te)]);
        let (mut x, _) = request(config(), h, b"tool=echo&arg=hi");
        x.handle(at(0), Input::Spawned(Ok(())));
        assert_eq!(x.mode(), Mode::Buffered, "{te:?}");
    }
}

#[test]
fn v2_over_http10_is_v1() {
    // HTTP/1.0 has no chunked body and no trailer: a stream would lose the
    // exit code.
    let head = RequestHead { http11: false, ..good_head("2", true) };
    let (mut x, _) = request(config(), head, b"tool=echo&arg=hi");
    x.handle(at(0), Input::Spawned(Ok(())));
    assert_eq!(x.mode(), Mode::Buffered);
}

#[test]
fn v2_streams_within_the_window() {
    let mut x = run_to_spawn("2", true);
    drain(&mut x);
    let big = vec![b'x'; READ_CHUNK];
    for _ in 0..4 {
        x.handle(at(1), Input::ToolOutput(big.clone()));
    }
    assert_eq!(x.waiting_bytes(), STREAM_WINDOW);
    let outs = drain(&mut x);
    assert!(matches!(outs[0], Output::SendHead(_)));
    assert!(!outs.iter().skip(1).any(|o| matches!(o, Output::SendHead(_))));
    assert!(!matches!(outs.last(), Some(Output::ReadOutput { .. })), "no credit at a full window: {outs:?}");
    x.handle(at(1), Input::ClientTook(1000));
    assert_eq!(drain(&mut x), vec![Output::ReadOutput { max: 1000 }]);
}

#[test]
fn timeout_terms_then_kills_and_answers_504_before_any_byte() {
    let mut x = run_to_spawn("1", false);
    drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"partial".to_vec()));
    drain(&mut x);
    assert_eq!(x.poll_timeout(), Some(at(10)));
    x.handle_timeout(at(10));
    assert_eq!(drain(&mut x), vec![Output::Signal(Signal::Term)]);
    assert_eq!(x.poll_timeout(), Some(at(12)));
    x.handle_timeout(at(12));
    assert_eq!(drain(&mut x), vec![Output::Signal(Signal::Kill)]);
    x.handle(at(12), Input::ToolExited(ExitStatus::Signal(9)));
    x.handle(at(12), Input::ToolEof);
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.iter().find(|o| matches!(o, Output::Respond(_))) else {
        panic!("{outs:?}")
    };
    assert_eq!((r.status, r.body.as_slice()), (504, &b"partial"[..]));
    assert!(r.headers.contains(&("X-Exit-Code", "124".to_owned())));
}

#[test]
fn timeout_while_streaming_appends_the_line_and_124() {
    let mut x = run_to_spawn("2", true);
    drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"a".to_vec()));
    x.handle_timeout(at(10));
    x.handle(at(10), Input::ToolExited(ExitStatus::Signal(15)));
    x.handle(at(10), Input::ToolEof);
    let outs = drain(&mut x);
    let tail: Vec<_> = outs.iter().rev().take(3).rev().cloned().collect();
    assert_eq!(
        tail,
        vec![
            Output::SendChunk(b"toolexec: timed out after 10 s\n".to_vec()),
            Output::Finish { exit_code: 124 },
            Output::Done
        ]
    );
}

#[test]
fn client_gone_kills_at_once_and_answers_nothing() {
    let mut x = run_to_spawn("1", false);
    drain(&mut x);
    x.handle(at(1), Input::ClientGone);
    assert_eq!(drain(&mut x), vec![Output::Signal(Signal::Term)]);
    x.handle_timeout(at(3));
    assert_eq!(drain(&mut x), vec![Output::Signal(Signal::Kill)]);
    x.handle(at(3), Input::ToolOutput(b"late".to_vec()));
    x.handle(at(3), Input::ToolExited(ExitStatus::Signal(9)));
    x.handle(at(3), Input::ToolEof);
    let outs = drain(&mut x);
    assert!(!outs.iter().any(|o| matches!(o, Output::Respond(_) | Output::SendChunk(_))), "{outs:?}");
    assert_eq!(outs.last(), Some(&Output::Done));
}

#[test]
fn v1_over_max_buffered_is_507() {
    let outs = buffered_output(11);
    assert_eq!(status_of(&outs), Some(507));
    assert!(outs.contains(&Output::Signal(Signal::Term)));
}

/// A v1 exchange under `max_buffered = 10` whose tool writes `n` bytes:
/// what follows the output.
fn buffered_output(n: usize) -> Vec<Output> {
    let mut c = config();
    c.max_buffered = 10;
    let (mut x, _) = request(c, good_head("1", false), b"tool=echo");
    x.handle(at(0), Input::Spawned(Ok(())));
    drain(&mut x);
    x.handle(at(0), Input::ToolOutput(vec![b'x'; n]));
    drain(&mut x)
}

#[test]
fn escaped_grandchild_does_not_hang_the_answer() {
    let mut x = run_to_spawn("1", false);
    drain(&mut x);
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    assert_eq!(drain(&mut x), vec![Output::Signal(Signal::Kill)]);
    assert_eq!(x.poll_timeout(), Some(at(3)));
    x.handle_timeout(at(3));
    // The waiting read is given up for one that does not wait.
    assert_eq!(drain(&mut x), vec![Output::ReadNow { max: READ_CHUNK }]);
    assert_eq!(x.poll_timeout(), None);
    x.handle(at(3), Input::ToolEof);
    assert_eq!(status_of(&drain(&mut x)), Some(200));
}

/// The drain grace ran out (slow reads used it up, or this process was
/// not running when its timer fired) while the tool's last bytes were in
/// the pipe: they are read without waiting, and the answer holds them.
#[test]
fn a_drain_grace_that_runs_out_reads_what_the_pipe_holds() {
    let mut x = run_to_spawn("1", false);
    drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"first ".to_vec()));
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(3)));
    drain(&mut x);
    x.handle_timeout(at(9));
    assert_eq!(drain(&mut x), vec![Output::ReadNow { max: READ_CHUNK }]);
    x.handle(at(9), Input::ToolOutput(b"last".to_vec()));
    assert_eq!(drain(&mut x), vec![Output::ReadNow { max: READ_CHUNK }]);
    x.handle(at(9), Input::ToolEof);
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.first() else { panic!("{outs:?}") };
    assert_eq!((r.status, r.body.as_slice()), (200, &b"first last"[..]));
    assert!(r.headers.contains(&("X-Exit-Code", "3".to_owned())));
}

/// The read that was waiting completes after the grace ran out, in the
/// same wake-up: its bytes count, and only then is the read that does not
/// wait asked for, so two reads are never outstanding.
#[test]
fn a_read_completing_after_the_grace_is_kept() {
    let mut x = run_to_spawn("1", false);
    drain(&mut x);
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    drain(&mut x);
    x.handle(at(9), Input::ToolOutput(b"late".to_vec()));
    assert_eq!(
        drain(&mut x),
        vec![Output::ReadOutput { max: READ_CHUNK }, Output::ReadNow { max: READ_CHUNK }]
    );
    x.handle(at(9), Input::ToolEof);
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.first() else { panic!("{outs:?}") };
    assert_eq!(r.body, b"late");
}

/// An escaped grandchild that keeps the pipe full cannot keep the answer
/// open: the final drain reads at most `final_drain` bytes.
#[test]
fn the_final_drain_is_bounded() {
    let mut c = config();
    c.final_drain = 10;
    c.read_chunk = 4;
    let (mut x, _) = request(c, good_head("1", false), b"tool=echo");
    x.handle(at(0), Input::Spawned(Ok(())));
    drain(&mut x);
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    drain(&mut x);
    x.handle_timeout(at(3));
    let mut maxes = Vec::new();
    let mut outs = drain(&mut x);
    while let [Output::ReadNow { max }] = outs.as_slice() {
        maxes.push(*max);
        x.handle(at(3), Input::ToolOutput(vec![b'g'; *max]));
        outs = drain(&mut x);
    }
    assert_eq!(maxes, vec![4, 4, 2]);
    assert_eq!(status_of(&outs), Some(200));
}

/// Streaming: the final drain still keeps to the client's window.
#[test]
fn the_final_drain_keeps_to_the_window() {
    let mut x = run_to_spawn("2", true);
    drain(&mut x);
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    drain(&mut x);
    x.handle_timeout(at(3));
    assert_eq!(drain(&mut x), vec![Output::ReadNow { max: READ_CHUNK }]);
    let mut outs = Vec::new();
    for _ in 0..4 {
        x.handle(at(3), Input::ToolOutput(vec![b'x'; READ_CHUNK]));
        outs = drain(&mut x);
    }
    assert_eq!(x.waiting_bytes(), STREAM_WINDOW);
    assert!(!outs.iter().any(|o| matches!(o, Output::ReadNow { .. } | Output::Finish { .. })), "{outs:?}");
    x.handle(at(50), Input::ClientTook(10));
    assert_eq!(drain(&mut x), vec![Output::ReadNow { max: 10 }]);
    x.handle(at(50), Input::ToolEof);
    assert!(drain(&mut x).contains(&Output::Finish { exit_code: 0 }));
}

#[test]
fn a_tool_exiting_behind_a_full_window_loses_no_byte() {
    // The client stops reading with the window full; the tool writes its
    // last bytes into the pipe and exits. However long the client waits,
    // the server keeps its pipe and finishes only after reading them out.
    let mut x = run_to_spawn("2", true);
    drain(&mut x);
    let big = vec![b'x'; READ_CHUNK];
    for _ in 0..4 {
        x.handle(at(1), Input::ToolOutput(big.clone()));
    }
    assert_eq!(x.waiting_bytes(), STREAM_WINDOW);
    drain(&mut x);
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    assert_eq!(x.poll_timeout(), None, "no drain clock while the client holds the window");
    x.handle_timeout(at(100));
    assert!(!drain(&mut x).iter().any(|o| matches!(o, Output::Finish { .. })));
    x.handle(at(100), Input::ClientTook(STREAM_WINDOW));
    assert!(matches!(drain(&mut x).as_slice(), [Output::ReadOutput { .. }]));
    // The clock runs again while the pipe is read: the full grace is left.
    assert_eq!(x.poll_timeout(), Some(at(102)));
    x.handle(at(100), Input::ToolOutput(b"last".to_vec()));
    let outs = drain(&mut x);
    assert!(outs.contains(&Output::SendChunk(b"last".to_vec())), "{outs:?}");
    x.handle(at(100), Input::ToolEof);
    assert!(drain(&mut x).contains(&Output::Finish { exit_code: 0 }));
}

#[test]
fn spawn_errors_map_to_statuses() {
    for (e, want) in [
        (SpawnError::NotInstalled, 409),
        (SpawnError::BadCwd("symlink".into()), 400),
        (SpawnError::Other("EMFILE".into()), 500),
    ] {
        let (mut x, _) = request(config(), good_head("1", false), b"tool=echo");
        x.handle(at(0), Input::Spawned(Err(e)));
        assert_eq!(status_of(&drain(&mut x)), Some(want));
    }
}

#[test]
fn token_parsing() {
    let t = validate_token(TOKEN).unwrap();
    for good in ["Bearer s3cret", "s3cret", "Token=s3cret", "Bearer  s3cret  "] {
        assert!(token_from_authorization(good.as_bytes()).is_some_and(|c| token_matches(&t, c)), "{good}");
    }
    for bad in ["Bearer s3cre", "Bearer s3cretx", "", "Bearer", "s3cret x"] {
        assert!(!token_from_authorization(bad.as_bytes()).is_some_and(|c| token_matches(&t, c)), "{bad}");
    }
    assert_eq!(validate_token(b""), Err(TokenError::Empty));
    assert_eq!(validate_token(b"a b"), Err(TokenError::Separator));
    assert_eq!(validate_token(b"a=b"), Err(TokenError::Separator));
}

#[test]
fn gate_caps_connections() {
    let mut g = Gate::new(2);
    assert!(g.try_take() && g.try_take());
    assert!(!g.try_take() && !g.may_accept());
    g.release();
    assert!(g.may_accept());
}

/// One line per output, for snapshots of whole exchanges.
fn transcript(outs: &[Output]) -> String {
    let mut s = String::new();
    for o in outs {
        let line = match o {
            Output::Respond(r) | Output::SendHead(r) => {
                let kind = if matches!(o, Output::Respond(_)) { "respond" } else { "head" };
                let headers: Vec<String> = r.headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
                format!("{kind} {} [{}] {:?}", r.status, headers.join(", "), String::from_utf8_lossy(&r.body))
            }
            Output::SendChunk(b) => format!("chunk {:?}", String::from_utf8_lossy(b)),
            other => format!("{other:?}"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

#[test]
fn snapshot_rejections() {
    let mut all = String::new();
    for (h, body) in [
        (head("GET", "/", &[]), &b""[..]),
        (head("PUT", "/exec", &[]), b""),
        (head("POST", "/exec", &[("Authorization", "Bearer no")]), b""),
        (head("POST", "/exec", &[("Authorization", "Bearer s3cret"), ("X-Aifo-Proto", "0")]), b""),
        (good_head("1", false), b"tool=a\nb"),
        (good_head("1", false), b"tool=echo&cwd=/"),
    ] {
        let (_, outs) = request(config(), h, body);
        all.push_str(&transcript(&outs));
    }
    insta::assert_snapshot!(all);
}

#[test]
fn snapshot_v2_stream_with_timeout() {
    let mut x = run_to_spawn("2", true);
    let mut outs = drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"compiling\n".to_vec()));
    outs.extend(drain(&mut x));
    x.handle(at(1), Input::ClientTook(10));
    outs.extend(drain(&mut x));
    x.handle_timeout(at(10));
    outs.extend(drain(&mut x));
    x.handle_timeout(at(12));
    outs.extend(drain(&mut x));
    x.handle(at(12), Input::ToolExited(ExitStatus::Signal(9)));
    x.handle(at(12), Input::ToolEof);
    outs.extend(drain(&mut x));
    insta::assert_snapshot!(transcript(&outs));
}

#[test]
fn snapshot_v1_answer() {
    let mut x = run_to_spawn("1", false);
    let mut outs = drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"out\nerr\n".to_vec()));
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(2)));
    x.handle(at(1), Input::ToolEof);
    outs.extend(drain(&mut x));
    insta::assert_snapshot!(transcript(&outs));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Step {
        /// The tool writes this many bytes (as far as the pipe has room),
        /// and a credited read returns what the pipe holds.
        Read(usize),
        /// The tool writes, and no read returns yet.
        Write(usize),
        Take(u64),
        Advance(u64),
        Exit(i32),
        Signal(i32),
        Eof,
        Gone,
        Shutdown,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (1usize..100_000).prop_map(Step::Read),
            2 => (1usize..100_000).prop_map(Step::Write),
            4 => (1u64..200_000).prop_map(Step::Take),
            2 => (0u64..4_000_000).prop_map(Step::Advance),
            1 => (0i32..3).prop_map(Step::Exit),
            1 => (1i32..16).prop_map(Step::Signal),
            1 => Just(Step::Eof),
            1 => Just(Step::Gone),
            1 => Just(Step::Shutdown),
        ]
    }

    /// Drives one spawned exchange like a shell would (honouring read
    /// credit) and checks the invariants after every step.
    struct Driver {
        x: Exchange,
        now: u64,
        credit: Option<usize>,
        /// A `ReadNow` to answer at once.
        read_now: Option<usize>,
        /// Every byte the tool wrote; `read` of them left the pipe.
        produced: Vec<u8>,
        read: usize,
        sent: Vec<u8>,
        in_flight: u64,
        responses: usize,
        status: Option<u16>,
        exit_code: Option<i32>,
        done: bool,
        gone: bool,
        exited: bool,
        eof: bool,
        terms: usize,
        window: u64,
    }

    /// A pipe holds this much; a writer blocks on a full one.
    const PIPE: usize = 65_536;

    impl Driver {
        fn write(&mut self, n: usize) {
            if self.exited || self.eof {
                return;
            }
            let n = n.min(PIPE - (self.produced.len() - self.read));
            let start = self.produced.len();
            self.produced.extend((start..start + n).map(|i| (i % 251) as u8));
        }

        /// What a read of at most `max` gets now: `None` at EOF.
        fn take_pipe(&mut self, max: usize) -> Option<Vec<u8>> {
            let n = max.min(self.produced.len() - self.read);
            if n == 0 {
                return None;
            }
            self.read += n;
            Some(self.produced[self.read - n..self.read].to_vec())
        }

        fn pump(&mut self) {
            loop {
                self.pump_once();
                let Some(max) = self.read_now.take() else { return };
                let now = at(0).saturating_add(Duration::from_micros(self.now));
                match self.take_pipe(max) {
                    Some(bytes) => self.x.handle(now, Input::ToolOutput(bytes)),
                    None => self.x.handle(now, Input::ToolEof),
                }
            }
        }

        fn pump_once(&mut self) {
            while let Some(o) = self.x.poll_output() {
                assert!(!self.done, "output after Done: {o:?}");
                match o {
                    Output::ReadOutput { max } => {
                        assert!(
                            self.credit.is_none() && self.read_now.is_none(),
                            "two reads credited at once"
                        );
                        assert!(max > 0);
                        self.credit = Some(max);
                    }
                    Output::ReadNow { max } => {
                        assert!(self.read_now.is_none(), "two reads credited at once");
                        assert!(max > 0);
                        // Replaces the waiting read.
                        self.credit = None;
                        self.read_now = Some(max);
                    }
                    Output::SendHead(r) => {
                        self.responses += 1;
                        self.status = Some(r.status);
                    }
                    Output::Respond(r) => {
                        self.responses += 1;
                        self.status = Some(r.status);
                        self.exit_code = r
                            .headers
                            .iter()
                            .find(|(n, _)| *n == "X-Exit-Code")
                            .and_then(|(_, v)| v.parse().ok());
                        self.sent.extend_from_slice(&r.body);
                    }
                    Output::SendChunk(b) => {
                        self.in_flight += b.len() as u64;
                        self.sent.extend_from_slice(&b);
                    }
                    Output::Finish { exit_code } => self.exit_code = Some(exit_code),
                    Output::Signal(Signal::Term) => self.terms += 1,
                    Output::Signal(Signal::Kill) => {}
                    Output::Done => self.done = true,
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert!(self.x.waiting_bytes() <= self.window, "window exceeded: {}", self.x.waiting_bytes());
            assert!(self.responses <= 1, "more than one response");
            assert!(self.terms <= 1, "TERM twice");
        }

        fn step(&mut self, s: &Step) {
            if self.done {
                return;
            }
            let now = at(0).saturating_add(Duration::from_micros(self.now));
            match *s {
                Step::Read(n) => {
                    self.write(n);
                    if let Some(max) = self.credit {
                        if let Some(bytes) = self.take_pipe(max) {
                            self.credit = None;
                            self.x.handle(now, Input::ToolOutput(bytes));
                        }
                    }
                }
                Step::Write(n) => self.write(n),
                Step::Take(n) => {
                    let n = n.min(self.in_flight);
                    if n > 0 && !self.gone {
                        self.in_flight -= n;
                        self.x.handle(now, Input::ClientTook(n));
                    }
                }
                Step::Advance(us) => {
                    self.now += us;
                    let now = at(0).saturating_add(Duration::from_micros(self.now));
                    if self.x.poll_timeout().is_some_and(|t| t <= now) {
                        self.x.handle_timeout(now);
                    }
                }
                Step::Exit(c) if !self.exited => {
                    self.exited = true;
                    self.x.handle(now, Input::ToolExited(ExitStatus::Code(c)));
                }
                Step::Signal(n) if !self.exited => {
                    self.exited = true;
                    self.x.handle(now, Input::ToolExited(ExitStatus::Signal(n)));
                }
                // The write end closes; a read gets what the pipe holds first.
                Step::Eof if self.credit.is_some() => {
                    self.eof = true;
                    let max = self.credit.take().unwrap_or(1);
                    match self.take_pipe(max) {
                        Some(bytes) => self.x.handle(now, Input::ToolOutput(bytes)),
                        None => self.x.handle(now, Input::ToolEof),
                    }
                }
                Step::Gone if !self.gone => {
                    self.gone = true;
                    self.x.handle(now, Input::ClientGone);
                }
                Step::Shutdown => self.x.handle(now, Input::Shutdown),
                _ => {}
            }
            self.pump();
        }
    }

    proptest! {
        #[test]
        fn exchanges_conserve_bytes_and_end(streaming in any::<bool>(), steps in prop::collection::vec(step(), 0..200)) {
            let mut c = config();
            c.max_buffered = 300_000;
            let window = c.stream_window;
            let (mut x, _) = request(c, good_head(if streaming { "2" } else { "1" }, true), b"tool=echo");
            x.handle(at(0), Input::Spawned(Ok(())));
            let mut d = Driver {
                x, now: 0, credit: None, read_now: None, produced: Vec::new(), read: 0, sent: Vec::new(), in_flight: 0, responses: 0,
                status: None, exit_code: None, done: false, gone: false, exited: false, eof: false, terms: 0, window,
            };
            d.pump();
            for s in &steps {
                d.step(s);
            }
            // Wind down: the tool exits, the client drains, the pipe closes.
            d.step(&Step::Exit(0));
            for _ in 0..10_000 {
                if d.done { break; }
                d.step(&Step::Take(u64::MAX));
                d.step(&Step::Eof);
                d.step(&Step::Advance(1_000_000));
            }
            prop_assert!(d.done, "never done");
            if d.gone {
                prop_assert!(d.status.is_none() || d.responses == 1);
            } else {
                prop_assert_eq!(d.responses, 1);
                match d.status {
                    Some(507) => prop_assert!(!streaming && d.produced.len() > 300_000),
                    Some(504) => {
                        prop_assert_eq!(d.exit_code, Some(124));
                        prop_assert_eq!(&d.sent, &d.produced);
                    }
                    Some(200) => {
                        let line = b"toolexec: timed out after 10 s\n";
                        if d.exit_code == Some(124) && d.sent.len() > d.produced.len() {
                            prop_assert!(d.sent.ends_with(line));
                            prop_assert_eq!(&d.sent[..d.sent.len() - line.len()], &d.produced[..]);
                        } else {
                            prop_assert_eq!(&d.sent, &d.produced);
                        }
                    }
                    other => prop_assert!(false, "status {:?}", other),
                }
            }
        }

        #[test]
        fn status_follows_the_check_order(
            path_ok in any::<bool>(), post in any::<bool>(), token in 0u8..3, proto in 0u8..4,
            tool in 0u8..3, form_ok in any::<bool>(),
        ) {
            let mut headers = Vec::new();
            match token {
                0 => {}
                1 => headers.push(("Authorization", "Bearer wrong")),
                _ => headers.push(("Authorization", "Bearer s3cret")),
            }
            let protos = ["", "1", "2", "3"];
            if proto > 0 {
                headers.push(("X-Aifo-Proto", protos[proto as usize]));
            }
            let h = head(if post { "POST" } else { "GET" }, if path_ok { "/exec" } else { "/x" }, &headers);
            let name = ["echo", "rm", "py"][tool as usize];
            let body = if form_ok { format!("tool={name}") } else { format!("tool={name}&tool=x") };
            let (_, outs) = request(config(), h, body.as_bytes());
            let want = if !path_ok { 404 } else if !post { 405 } else if token < 2 { 401 }
                else if proto == 0 || proto == 3 { 426 } else if !form_ok { 400 } else if tool == 1 { 403 } else { 0 };
            let spawned = outs.iter().any(|o| matches!(o, Output::Spawn(_)));
            if want == 0 {
                prop_assert!(spawned && status_of(&outs).is_none());
            } else {
                prop_assert_eq!(status_of(&outs), Some(want));
                prop_assert!(!spawned);
            }
        }
    }
}

#[test]
fn a_body_slower_than_the_header_timeout_is_408() {
    let mut x = Exchange::new(Arc::new(config()), at(0));
    x.handle(at(0), Input::Head(good_head("1", false)));
    assert_eq!(drain(&mut x), vec![Output::ReadBody]);
    x.handle(at(5), Input::Body(b"tool=".to_vec()));
    assert_eq!(x.poll_timeout(), Some(at(10)));
    x.handle_timeout(at(10));
    let outs = drain(&mut x);
    assert_eq!(status_of(&outs), Some(408));
    assert!(!outs.iter().any(|o| matches!(o, Output::Spawn(_))));
    assert_eq!(outs.last(), Some(&Output::Done));
}

#[test]
fn tool_names_with_a_slash_whitespace_or_nul_are_refused() {
    let mut c = Config::new(validate_token(TOKEN).unwrap(), b"/work".to_vec());
    for bad in ["", "a/b", "/x", "a b", "a\tb", "a\nb", "a\0b", "=/usr/bin/x", "a/b=/usr/bin/x"] {
        assert!(c.add_tool_spec(bad).is_err(), "{bad:?} accepted");
    }
    c.add_tool_spec("ok-name.1").unwrap();
}

/// One read of the tool's output at a time, none after its EOF.
#[test]
fn no_read_while_one_is_outstanding_or_after_eof() {
    let reads = |outs: &[Output]| {
        outs.iter().filter(|o| matches!(o, Output::ReadOutput { .. } | Output::ReadNow { .. })).count()
    };
    let mut x = run_to_spawn("2", true);
    assert_eq!(reads(&drain(&mut x)), 1);
    x.handle_timeout(at(0));
    x.handle(at(0), Input::BodyEnd);
    assert_eq!(reads(&drain(&mut x)), 0, "a read is outstanding");
    x.handle(at(1), Input::ToolOutput(b"a".to_vec()));
    assert_eq!(reads(&drain(&mut x)), 1, "the read was answered: the next one");
    x.handle(at(1), Input::ToolEof);
    x.handle_timeout(at(2));
    assert_eq!(reads(&drain(&mut x)), 0, "after EOF");
}

fn spawned_with_window_4_and_chunk_64(h: RequestHead) -> Exchange {
    let mut c = config();
    c.stream_window = 4;
    c.read_chunk = 64;
    let (mut x, _) = request(c, h, b"tool=echo");
    x.handle(at(0), Input::Spawned(Ok(())));
    x
}

/// Once nobody reads the answer, the pipe is drained a whole chunk at a
/// time, not a streaming window at a time: the window paces a client,
/// and there is none left to pace.
#[test]
fn without_a_client_the_pipe_drains_a_chunk_at_a_time_whatever_the_window() {
    let mut x = spawned_with_window_4_and_chunk_64(good_head("2", true));
    assert_eq!(x.mode(), Mode::Streaming);
    assert_eq!(drain(&mut x), vec![Output::ReadOutput { max: 4 }], "the window paces a client");
    x.handle(at(1), Input::ClientGone);
    drain(&mut x);
    x.handle(at(1), Input::ToolOutput(b"abcd".to_vec()));
    let outs = drain(&mut x);
    assert_eq!(outs, vec![Output::ReadOutput { max: 64 }], "{outs:?}");
}

/// A malformed escape is refused naming its byte in the body (the 400's
/// message), and every error says what is wrong in words.
#[test]
fn form_errors_name_the_byte_and_say_what_is_wrong() {
    assert_eq!(decode_form(b"tool=echo&arg=ab%zz"), Err(FormError::BadEscape(16)));
    assert_eq!(decode_form(b"tool=echo&a%g=1"), Err(FormError::BadEscape(11)));
    assert_eq!(decode_form(b"tool=echo&cwd=a&cwd=b"), Err(FormError::RepeatedCwd));
    assert_eq!(decode_form(b"tool=echo&tool=sh"), Err(FormError::RepeatedTool));
    assert_eq!(decode_form(b"arg=x"), Err(FormError::MissingTool));
    let said = [
        (FormError::BadEscape(16), "bad percent escape at byte 16"),
        (FormError::Nul, "NUL byte in a field"),
        (FormError::MissingTool, "field 'tool' missing"),
        (FormError::RepeatedTool, "field 'tool' repeated"),
        (FormError::RepeatedCwd, "field 'cwd' repeated"),
    ];
    for (e, text) in said {
        assert_eq!(e.to_string(), text);
    }
    assert_eq!(TokenError::Empty.to_string(), "token is empty");
    assert_eq!(TokenError::Separator.to_string(), "token contains whitespace or '='");
}

/// The token never reaches a log through `Debug`: its length does.
#[test]
fn a_tokens_debug_shows_its_length_and_never_its_bytes() {
    let t = validate_token(TOKEN).unwrap();
    let shown = format!("{t:?}");
    assert_eq!(shown, "Token(<6 bytes>)");
    assert!(!shown.contains("s3cret"));
}

#[test]
fn a_tool_program_that_is_empty_or_holds_nul_is_refused() {
    let mut c = config();
    assert!(c.add_tool_spec("cc=").unwrap_err().contains("bad program"));
    assert!(c.add_tool_spec("cc=/usr/bin/c\0c").unwrap_err().contains("bad program"));
    assert!(c.add_tool_spec("cc=/usr/bin/cc").is_ok());
}

/// A candidate shorter than the token, even one that is its prefix, or
/// longer, never matches.
#[test]
fn only_the_whole_token_matches() {
    let t = validate_token(TOKEN).unwrap();
    assert!(token_matches(&t, b"s3cret"));
    // "p3crft" differs twice by the same bits: a mismatch must not cancel.
    for bad in [&b""[..], b"s3cre", b"s3cret!", b"s3creT", b"p3crft", b"\xff"] {
        assert!(!token_matches(&t, bad), "{bad:?}");
    }
}

/// The working directory itself, named relatively or absolutely, is
/// inside it.
#[test]
fn the_working_directory_itself_is_a_cwd() {
    for cwd in [&b"."[..], b"/work", b"sub/..", b"/work/"] {
        assert_eq!(form::resolve_cwd(b"/work", Some(cwd)), Ok(b"/work".to_vec()), "{cwd:?}");
    }
    assert!(form::resolve_cwd(b"/work", Some(b"/")).is_err());
}

/// A server holds its slack (64 KiB) whatever its clients do, and each
/// exchange 2 KiB beyond what it counts.
#[test]
fn the_heap_check_allows_the_slack_and_a_share_per_exchange() {
    let gate = Gate::new(4);
    assert!(gate.heap_check([], 64 << 10).is_ok());
    assert!(gate.heap_check([], (64 << 10) + 1).is_err());
    let x = run_to_spawn("2", true);
    let fixed: u64 = x.heap_allowance().iter().filter(|s| !s.per_byte).map(|s| s.bytes).sum();
    assert_eq!(fixed, 2 << 10);
    assert!(gate.heap_check([&x], (64 << 10) + 1).is_ok());
    // Two exchanges' shares are summed limit by limit, and the report
    // lists each limit once.
    let y = run_to_spawn("2", true);
    let e = gate.heap_check([&x, &y], 1 << 30).unwrap_err();
    assert!(e.contains("max_connections 4096"), "{e}");
    assert!(!e.contains("max_connections 2048"), "{e}");
}

/// The gate counts what it lets in and says its cap (at least one).
#[test]
fn the_gate_reports_what_is_open_and_its_cap() {
    let mut gate = Gate::new(3);
    assert_eq!((gate.open(), gate.max()), (0, 3));
    assert!(gate.try_take() && gate.try_take());
    assert_eq!(gate.open(), 2);
    gate.release();
    assert_eq!(gate.open(), 1);
    assert_eq!(Gate::new(0).max(), 1);
}

/// A buffered answer takes exactly `max_buffered` bytes: one more is 507.
#[test]
fn v1_output_of_exactly_max_buffered_is_kept() {
    let outs = buffered_output(10);
    assert_eq!(outs, vec![Output::ReadOutput { max: READ_CHUNK }], "read on, nothing answered yet");
}

/// A buffered answer reads a whole chunk at a time: the streaming window
/// paces a streaming client only.
#[test]
fn v1_reads_a_chunk_at_a_time_whatever_the_window() {
    let mut x = spawned_with_window_4_and_chunk_64(good_head("1", false));
    assert_eq!(x.mode(), Mode::Buffered);
    assert_eq!(drain(&mut x), vec![Output::ReadOutput { max: 64 }]);
}

/// Output handed out but not yet sent counts against the window's share
/// of the heap, chunk by chunk.
#[test]
fn undrained_chunks_count_in_the_heap_allowance() {
    use crate::fsproxy::bounds::HEAP_GROWTH;
    let mut x = run_to_spawn("2", true);
    drain(&mut x);
    x.handle(at(0), Input::ToolOutput(vec![b'x'; 1000]));
    let window =
        |x: &Exchange| x.heap_allowance().iter().find(|s| s.limit == "stream_window").map(|s| s.bytes);
    // The head is answered with the first output, then the chunk itself.
    let with_chunk = window(&x).unwrap();
    let outs = drain(&mut x);
    assert!(outs.contains(&Output::SendChunk(vec![b'x'; 1000])), "{outs:?}");
    assert_eq!(window(&x), Some(0));
    assert!(with_chunk >= HEAP_GROWTH * 1000, "{with_chunk}");
}
