//! Handle 0: reads of airlock's own stdin on the child's behalf.
//!
//! Each read waits on a thread of its own making (a blocking read of a
//! terminal or pipe cannot be cancelled), but that thread never outlives
//! its session in any way that matters: it reads only once `poll` says
//! bytes are there *and* the session still wants them, and it is woken and
//! ends as soon as the session drops its [`StdinReader`]. So airlock's
//! exit never waits on it (it is a plain thread, not part of the runtime),
//! signals are handled meanwhile, and bytes that arrive after the session
//! ends stay in stdin for whoever reads it next.

use crate::session::Event;
use airlock_core::fsproxy::{EffectId, EffectResult, FsErrorKind};
use rustix::event::{PollFd, PollFlags};
use std::os::fd::OwnedFd;
use std::sync::mpsc;
use tokio::sync::mpsc::Sender;

pub struct StdinReader {
    requests: mpsc::Sender<(EffectId, u32)>,
    /// The write end of the wake-up pipe: dropping it ends the thread.
    _cancel: OwnedFd,
}

impl StdinReader {
    /// A reader that reports each read as an [`Event::EffectDone`] on `events`.
    pub fn start(events: Sender<Event>) -> std::io::Result<Self> {
        let (cancel_rd, cancel_wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (requests, rx) = mpsc::channel::<(EffectId, u32)>();
        std::thread::Builder::new().name("airlock-stdin".into()).spawn(move || {
            while let Ok((id, max)) = rx.recv() {
                let Some(result) = read_when_ready(&cancel_rd, max) else { return };
                if events.blocking_send(Event::EffectDone(id, result)).is_err() {
                    return;
                }
            }
        })?;
        Ok(StdinReader { requests, _cancel: cancel_wr })
    }

    /// Read at most `max` bytes for effect `id`.
    pub fn read(&self, id: EffectId, max: u32) {
        let _ = self.requests.send((id, max));
    }
}

/// Wait until stdin has bytes (or EOF) and read them, or return `None` when
/// `cancel` wakes first: the session is over and must read nothing.
fn read_when_ready(cancel: &OwnedFd, max: u32) -> Option<EffectResult> {
    let stdin = rustix::stdio::stdin();
    loop {
        let mut fds = [PollFd::new(&stdin, PollFlags::IN), PollFd::new(cancel, PollFlags::IN)];
        match rustix::event::poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Some(failed(e.into())),
            Ok(_) => {}
        }
        if !fds[1].revents().is_empty() {
            return None;
        }
        if !fds[0].revents().is_empty() {
            break;
        }
    }
    let mut buf = vec![0; max as usize];
    Some(match rustix::io::read(stdin, &mut buf) {
        Ok(n) => {
            buf.truncate(n);
            EffectResult::Data { eof: n == 0, data: buf }
        }
        Err(e) => failed(e.into()),
    })
}

fn failed(e: std::io::Error) -> EffectResult {
    EffectResult::Failed { kind: FsErrorKind::Other, message: e.to_string() }
}
