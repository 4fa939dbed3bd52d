//! The host's bound on answers a tool has not taken from its stdin: past
//! `max_stdin_backlog` unsent bytes it neither reads nor serves, and the
//! silence clock runs, so a tool that never reads costs bounded memory
//! and ends as a timeout.

use airlock_core::time::Instant;
use airlock_core::vfs::{Config, Host, Input, Output, PolicyConfig, Signal, ToolPolicy};
use std::time::Duration;

fn host(backlog: usize) -> Host {
    let mut cfg = Config::new("t");
    cfg.max_stdin_backlog = backlog;
    cfg.timeout = Duration::from_secs(10);
    let policy = ToolPolicy::new(&PolicyConfig { project: "/p".into(), ..Default::default() }).unwrap();
    Host::new(Instant::ZERO, cfg, policy)
}

fn drain(h: &mut Host) -> Vec<Output> {
    std::iter::from_fn(|| h.poll_output()).collect()
}

fn unsent(outs: &[Output]) -> usize {
    outs.iter().map(|o| if let Output::ToolStdin(b) = o { b.len() } else { 0 }).sum()
}

const REQ: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"fs.exists\",\"params\":{\"path\":\"a\"}}\n";

#[test]
fn unsent_answers_over_the_bound_pause_reading_and_serving() {
    let mut h = host(10);
    let init = drain(&mut h);
    let init_len = unsent(&init);
    assert!(init_len > 10, "init alone is over the bound");
    assert_eq!(h.stdout_budget(), 0, "no reading while the tool has not taken init");
    h.handle(Instant::from_micros(1), Input::ToolStdout(REQ.to_vec()));
    assert!(
        !drain(&mut h).iter().any(|o| matches!(o, Output::Effect { .. })),
        "no request served while stalled"
    );
    h.handle(Instant::from_micros(2), Input::ToolStdinWritten(init_len));
    assert!(h.stdout_budget() > 0);
    assert!(drain(&mut h).iter().any(|o| matches!(o, Output::Effect { .. })), "served once the tool read");
}

#[test]
fn a_tool_that_never_reads_times_out() {
    let mut h = host(10);
    drain(&mut h);
    h.handle(Instant::from_micros(1), Input::ToolStdout(REQ.to_vec()));
    drain(&mut h);
    let due = h.poll_timeout().expect("the silence clock runs while stalled");
    assert!(due <= Instant::from_micros(1).saturating_add(Duration::from_secs(10)), "{due:?}");
    h.handle(due, Input::Tick);
    let outs = drain(&mut h);
    assert!(outs.contains(&Output::CloseStdin), "{outs:?}");
    assert!(outs.contains(&Output::Signal(Signal::Term)), "{outs:?}");
}
