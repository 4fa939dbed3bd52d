//! Every input in every phase of an exchange: what does not belong to the
//! phase is ignored, and the server's shutdown and the client's departure
//! end each phase as they should. Many are here because a mutant of a
//! phase guard went unnoticed otherwise (docs/verification.md).

use super::*;
use crate::fsproxy::bounds::HEAP_GROWTH;
use crate::time::Instant;
use std::sync::Arc;
use std::time::Duration;

fn config() -> Config {
    let mut c = Config::new(validate_token(b"s3cret").unwrap(), b"/work".to_vec());
    c.add_tool_spec("echo").unwrap();
    c.timeout = Duration::from_secs(10);
    c.kill_grace = Duration::from_secs(2);
    c.max_body = 16;
    c
}

fn at(secs: u64) -> Instant {
    Instant::from_micros(secs * 1_000_000)
}

fn head(extra: &[(&str, &str)]) -> RequestHead {
    let mut headers = vec![("authorization", "Bearer s3cret"), ("x-aifo-proto", "1")];
    headers.extend_from_slice(extra);
    RequestHead {
        method: "POST".into(),
        path: "/exec".into(),
        headers: headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect(),
        http11: true,
    }
}

fn drain(x: &mut Exchange) -> Vec<Output> {
    std::iter::from_fn(|| x.poll_output()).collect()
}

/// An exchange in the phase `upto` names: "head" (new), "body" (its head
/// read), "spawning" (its body read), "running" (its tool spawned).
fn exchange(upto: &str) -> Exchange {
    let mut x = Exchange::new(Arc::new(config()), at(0));
    let steps: &[Input] =
        &[Input::Head(head(&[])), Input::Body(b"tool=echo".to_vec()), Input::BodyEnd, Input::Spawned(Ok(()))];
    let n = match upto {
        "head" => 0,
        "body" => 1,
        "spawning" => 3,
        "running" => 4,
        other => panic!("no phase {other}"),
    };
    for input in &steps[..n] {
        x.handle(at(0), input.clone());
    }
    drain(&mut x);
    x
}

/// The one whole answer among `outs`: status and body text.
fn answer(outs: &[Output]) -> (u16, String) {
    let rs: Vec<&Response> =
        outs.iter().filter_map(|o| if let Output::Respond(r) = o { Some(r) } else { None }).collect();
    assert_eq!(rs.len(), 1, "{outs:?}");
    (rs[0].status, String::from_utf8_lossy(&rs[0].body).into_owned())
}

#[test]
fn inputs_of_another_phase_change_nothing() {
    let stray = || {
        vec![
            Input::Body(b"x".to_vec()),
            Input::Spawned(Ok(())),
            Input::ToolOutput(b"out".to_vec()),
            Input::ToolExited(ExitStatus::Code(1)),
        ]
    };
    // Before the head: then the head is read as usual.
    let mut x = exchange("head");
    for i in stray() {
        x.handle(at(0), i);
    }
    assert_eq!(drain(&mut x), []);
    x.handle(at(0), Input::Head(head(&[])));
    assert_eq!(drain(&mut x), [Output::ReadBody]);
    // A second head while the body is read.
    x.handle(at(0), Input::Head(head(&[("content-length", "x")])));
    assert_eq!(drain(&mut x), []);
    // While spawning: no body, output or exit is taken.
    let mut x = exchange("spawning");
    for i in [Input::Body(b"x".to_vec()), Input::BodyEnd, Input::ToolOutput(b"o".to_vec())] {
        x.handle(at(0), i);
    }
    x.handle(at(0), Input::ToolExited(ExitStatus::Code(1)));
    assert_eq!(drain(&mut x), []);
    // Once running, a second spawn result and a second exit are ignored:
    // the answer carries the first exit's code.
    x.handle(at(0), Input::Spawned(Ok(())));
    assert_eq!(drain(&mut x), [Output::ReadOutput { max: READ_CHUNK }]);
    x.handle(at(0), Input::Spawned(Err(SpawnError::NotInstalled)));
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(3)));
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(4)));
    x.handle(at(1), Input::ToolOutput(b"hi".to_vec()));
    x.handle(at(1), Input::ToolEof);
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.iter().find(|o| matches!(o, Output::Respond(_))) else {
        panic!("{outs:?}")
    };
    assert_eq!(r.body, b"hi");
    assert!(r.headers.contains(&("X-Exit-Code", "3".to_owned())), "{r:?}");
    assert_eq!(outs.iter().filter(|o| **o == Output::Signal(Signal::Kill)).count(), 1, "{outs:?}");
}

#[test]
fn a_content_length_is_a_number_within_max_body() {
    let mut x = exchange("head");
    x.handle(at(0), Input::Head(head(&[("content-length", "twelve")])));
    assert_eq!(answer(&drain(&mut x)), (400, "toolexec: bad request: bad Content-Length\n".into()));
    let mut x = exchange("head");
    x.handle(at(0), Input::Head(head(&[("content-length", " 16 ")])));
    assert_eq!(drain(&mut x), [Output::ReadBody]);
    let mut x = exchange("head");
    x.handle(at(0), Input::Head(head(&[("content-length", "17")])));
    let too_large = (413, "toolexec: request body too large: limit 16 bytes (--max-body)\n".to_string());
    assert_eq!(answer(&drain(&mut x)), too_large);
    // Without one, the body is counted as it comes, piece by piece.
    let mut x = exchange("body");
    x.handle(at(0), Input::Body(b"tool=echo&arg=ab".to_vec()));
    assert_eq!(drain(&mut x), []);
    x.handle(at(0), Input::Body(b"c".to_vec()));
    assert_eq!(answer(&drain(&mut x)), too_large);
}

#[test]
fn shutdown_in_each_phase() {
    let shutting = (503, "toolexec: server shutting down\n".to_string());
    for phase in ["head", "body"] {
        let mut x = exchange(phase);
        x.handle(at(0), Input::Shutdown);
        assert_eq!(answer(&drain(&mut x)), shutting, "{phase}");
    }
    // While spawning: the tool is stopped as soon as it runs.
    let mut x = exchange("spawning");
    x.handle(at(0), Input::Shutdown);
    assert_eq!(drain(&mut x), []);
    x.handle(at(0), Input::Spawned(Ok(())));
    assert_eq!(drain(&mut x)[0], Output::Signal(Signal::Term));
    // Over: nothing more.
    let mut x = exchange("head");
    x.handle(at(0), Input::Shutdown);
    drain(&mut x);
    x.handle(at(0), Input::Shutdown);
    assert_eq!(drain(&mut x), []);
    assert!(x.is_done());
}

#[test]
fn a_client_gone_in_each_phase() {
    for phase in ["head", "body"] {
        let mut x = exchange(phase);
        x.handle(at(0), Input::ClientGone);
        assert_eq!(drain(&mut x), [Output::Done], "{phase}");
        x.handle(at(0), Input::ClientGone);
        assert_eq!(drain(&mut x), [], "{phase}: a second departure");
        assert!(x.is_done());
    }
    // While spawning: a failed spawn answers nobody; a spawned tool is
    // stopped at once.
    let mut x = exchange("spawning");
    x.handle(at(0), Input::ClientGone);
    assert_eq!(drain(&mut x), []);
    x.handle(at(0), Input::Spawned(Err(SpawnError::Other("EMFILE".into()))));
    assert_eq!(drain(&mut x), [Output::Done]);
    let mut x = exchange("spawning");
    x.handle(at(0), Input::ClientGone);
    x.handle(at(0), Input::Spawned(Ok(())));
    assert_eq!(drain(&mut x)[0], Output::Signal(Signal::Term));
}

#[test]
fn an_empty_read_is_the_pipe_s_end() {
    let mut x = exchange("running");
    x.handle(at(1), Input::ToolExited(ExitStatus::Code(0)));
    x.handle(at(1), Input::ToolOutput(b"done".to_vec()));
    drain(&mut x);
    x.handle(at(1), Input::ToolOutput(Vec::new()));
    let outs = drain(&mut x);
    let Some(Output::Respond(r)) = outs.iter().find(|o| matches!(o, Output::Respond(_))) else {
        panic!("{outs:?}")
    };
    assert_eq!(r.body, b"done");
    assert_eq!(outs.last(), Some(&Output::Done));
}

#[test]
fn what_an_exchange_reports_of_itself() {
    let mut x = exchange("running");
    assert_eq!(x.timeout(), Duration::from_secs(10));
    x.handle(at(1), Input::ToolOutput(b"12345".to_vec()));
    assert_eq!(x.buffered_bytes(), 5);
    let share =
        |x: &Exchange, limit: &str| x.heap_allowance().into_iter().find(|s| s.limit == limit).unwrap().bytes;
    assert_eq!(share(&x, "max_buffered"), HEAP_GROWTH * 5);
    // Outputs not yet taken by the shell are counted as handed out.
    let mut x = exchange("head");
    x.handle(at(0), Input::Head(head(&[("content-length", "x")])));
    let body_len = "toolexec: bad request: bad Content-Length\n".len() as u64;
    assert_eq!(share(&x, "stream_window"), HEAP_GROWTH * (body_len + 256));
    let mut x = exchange("body");
    x.handle(at(0), Input::Body(b"tool=echo&arg=ab".to_vec()));
    assert_eq!(share(&x, "max_body"), HEAP_GROWTH * 16);
    x.handle(at(0), Input::BodyEnd);
    // The spawn request: each argument and a constant.
    assert_eq!(share(&x, "stream_window"), HEAP_GROWTH * ((2 + 24) + 256));
}

#[test]
fn done_only_when_over_and_drained() {
    for phase in ["head", "body", "spawning", "running"] {
        assert!(!exchange(phase).is_done(), "{phase}");
    }
    let mut x = exchange("head");
    x.handle(at(0), Input::Shutdown);
    // Over, with its answer not yet taken by the shell.
    assert!(!x.is_done());
    let outs = drain(&mut x);
    assert_eq!(outs.last(), Some(&Output::Done));
    assert!(x.is_done());
}
