//! The event loop: real pipes, a real clock, real signals and effects in,
//! the core's outputs performed. It decides nothing about the protocol.

use super::capfs::CapFiles;
use super::http::HttpClient;
use super::process::{self, GroupGuard};
use super::record::Recorder;
use super::Prepared;
use airlock_core::time::Instant as CoreInstant;
use airlock_core::trace::vfs::Header as VfsHeader;
use airlock_core::vfs::{
    Effect, EffectId, EffectResult, Host, Input, OpError, Output, Signal, ToolExit, UserSignal,
    MAX_READ_CHUNK,
};
use anyhow::Context;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

/// Read into `buf`, or wait forever when the stream is gone.
async fn read_opt<R: AsyncRead + Unpin>(r: &mut Option<R>, buf: &mut [u8]) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

fn exit_of(s: std::io::Result<std::process::ExitStatus>) -> ToolExit {
    match s {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ToolExit::Code(c),
            (None, Some(sig)) => ToolExit::Signal(sig),
            (None, None) => ToolExit::Code(-1),
        },
        // Cannot happen for a child we spawned and have not reaped.
        Err(_) => ToolExit::Code(-1),
    }
}

pub async fn run(p: Prepared, argv: &[OsString]) -> anyhow::Result<i32> {
    // Installed before the tool starts, so no signal is lost in between.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let files = CapFiles::open(&p.project).with_context(|| format!("opening {}", p.project.display()))?;
    let audit = match &p.audit {
        Some(path) => Some(crate::audit::AuditWriter::new(
            path,
            crate::outfile::OutFile::create(path, None)
                .with_context(|| format!("--audit {}", path.display()))?,
        )),
        None => None,
    };
    let http = Arc::new(HttpClient::new(p.net.clone(), audit.clone())?);
    let mut recorder = match &p.record {
        Some(path) => Some(Recorder::create(path, &p.policy)?),
        None => None,
    };
    let program = argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default();
    let (mut child, (bounds, view)) = process::spawn_tool(argv, &p.grants, &p.policy, &p.env)
        .with_context(|| format!("starting {program}"))?;
    let group = GroupGuard::new(child.id());

    let base = tokio::time::Instant::now();
    let now = move || CoreInstant::from_micros(u64::try_from(base.elapsed().as_micros()).unwrap_or(u64::MAX));
    let started = now();
    if let Some(r) = recorder.as_mut() {
        r.start(VfsHeader::new(p.config.clone(), &p.policy_config, started).forget_env_values());
    }
    let grants = p.grants.clone();
    let mut host = Host::new(started, p.config, p.policy);

    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // The writer reports each line the tool took (Some(n)) or that its
    // stdin is gone (None); the core bounds what may wait unsent.
    let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let (taken_tx, mut taken_rx) = mpsc::unbounded_channel::<Option<usize>>();
    let writer = {
        let mut stdin = child.stdin.take();
        tokio::spawn(async move {
            while let Some(buf) = stdin_rx.recv().await {
                let Some(w) = stdin.as_mut() else { break };
                let ok = w.write_all(&buf).await.is_ok() && w.flush().await.is_ok();
                let _ = taken_tx.send(ok.then_some(buf.len()));
                if !ok {
                    break;
                }
            }
            // The channel closed (CloseStdin) or the tool closed its end.
            drop(stdin);
        })
    };
    let mut stdin_tx = Some(stdin_tx);

    let mut effects: JoinSet<(EffectId, EffectResult)> = JoinSet::new();
    let mut aborts: BTreeMap<EffectId, AbortHandle> = BTreeMap::new();
    let mut exited = false;
    let mut out_buf = vec![0u8; MAX_READ_CHUNK];
    let mut err_buf = vec![0u8; 64 * 1024];

    loop {
        while let Some(out) = host.poll_output() {
            if let Some(r) = recorder.as_mut() {
                r.output(&out);
            }
            match out {
                Output::ToolStdin(bytes) => {
                    if let Some(tx) = &stdin_tx {
                        if tx.send(bytes).is_err() {
                            stdin_tx = None;
                        }
                    }
                }
                // Dropping the sender lets the writer finish what is queued, then close.
                Output::CloseStdin => stdin_tx = None,
                Output::Effect { id, effect } => {
                    let handle = match effect {
                        Effect::Fs(op) => {
                            let gate = host.gate().clone();
                            // Out of descriptors, say: this request fails, the run goes on.
                            let cloned = files.try_clone();
                            effects.spawn(async move {
                                let r = match cloned {
                                    Ok(mut f) => tokio::task::spawn_blocking(move || op.run(&mut f, &gate))
                                        .await
                                        .unwrap_or_else(|e| {
                                            Err(OpError::io(format!("file operation failed: {e}")))
                                        }),
                                    Err(e) => Err(OpError::io(format!("opening the project directory: {e}"))),
                                };
                                (id, EffectResult::Fs(r))
                            })
                        }
                        Effect::Http(req) => {
                            let c = http.clone();
                            effects.spawn(async move { (id, EffectResult::Http(c.run(req).await)) })
                        }
                        Effect::Process(run) => {
                            let grants = grants.clone();
                            effects.spawn(async move {
                                (id, EffectResult::Process(process::run(run, &grants).await))
                            })
                        }
                    };
                    aborts.insert(id, handle);
                }
                Output::CancelEffect(id) => {
                    // Dropping a process effect kills its group (its guard).
                    if let Some(h) = aborts.remove(&id) {
                        h.abort();
                    }
                }
                Output::Signal(s) => group.signal(match s {
                    Signal::Term => rustix::process::Signal::TERM,
                    Signal::Kill => rustix::process::Signal::KILL,
                }),
                Output::Finished { line, exit_status } => {
                    if let Some(r) = recorder.as_mut() {
                        r.finish();
                    }
                    let mut so = std::io::stdout().lock();
                    let _ = so.write_all(&line);
                    let _ = so.flush();
                    drop(so);
                    effects.abort_all();
                    writer.abort();
                    if let Some(a) = audit {
                        a.finish();
                    }
                    // Nothing of the tool's outlives airlock.
                    drop(group);
                    if !exited {
                        let _ = child.wait().await;
                    }
                    drop(bounds);
                    view.end(&p.grants.guard);
                    return Ok(exit_status);
                }
            }
        }

        let budget = host.stdout_budget().min(out_buf.len());
        let deadline = host.poll_timeout().map(|t| base + Duration::from_micros(t.as_micros()));
        let input = tokio::select! {
            biased;
            _ = sigint.recv() => Input::UserSignal(UserSignal::Int),
            _ = sigterm.recv() => Input::UserSignal(UserSignal::Term),
            _ = sighup.recv() => Input::UserSignal(UserSignal::Hup),
            s = child.wait(), if !exited => {
                exited = true;
                Input::ToolExited(exit_of(s))
            }
            Some(taken) = taken_rx.recv() => match taken {
                Some(n) => Input::ToolStdinWritten(n),
                None => Input::ToolStdinClosed,
            },
            Some(done) = effects.join_next(), if !effects.is_empty() => match done {
                Ok((id, result)) => {
                    aborts.remove(&id);
                    Input::EffectDone { id, result }
                }
                // Aborted at the core's request: its result is not wanted.
                Err(_) => continue,
            },
            r = read_opt(&mut stdout, &mut out_buf[..budget]), if budget > 0 && stdout.is_some() => match r {
                Ok(n) if n > 0 => Input::ToolStdout(out_buf[..n].to_vec()),
                _ => {
                    stdout = None;
                    Input::ToolStdoutEof
                }
            },
            r = read_opt(&mut stderr, &mut err_buf), if stderr.is_some() => match r {
                Ok(n) if n > 0 => Input::ToolStderr(err_buf[..n].to_vec()),
                _ => {
                    stderr = None;
                    continue;
                }
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or(base)), if deadline.is_some() => Input::Tick,
        };
        feed(&mut host, &mut recorder, now(), input);
        let (refused, dropped) = host.take_net_refusals();
        if let Some(a) = &audit {
            for r in &refused {
                super::http::audit_refusal(a, r);
            }
            if dropped > 0 {
                eprintln!("airlock: tool: {dropped} refused http.* request(s) left out of --audit");
            }
        }
    }
}

fn feed(host: &mut Host, recorder: &mut Option<Recorder>, now: CoreInstant, input: Input) {
    if let Some(r) = recorder.as_mut() {
        r.input(now, &input);
    }
    host.handle(now, input);
}
