//! The confinement stage: `airlock __confine PLAN -- ARGV…`, a fresh
//! single-threaded airlock process between the spawner and the payload.
//! Being fresh, it may allocate and fork freely (nothing here runs between
//! a multi-threaded fork and exec).
//!
//! With namespaces: the stage clones PID 1 into new user, mount, PID, IPC,
//! UTS (and network unless allowed) namespaces, staying in the caller's
//! own; PID 1, airlock's reaper, maps the caller's uid/gid. PID 1 asks for SIGKILL
//! when the stage dies (the payload cannot undo that: it is PID 1's, and
//! when PID 1 dies the kernel kills every process of the namespace,
//! `setsid` daemons included), builds the mount view and pivots into it,
//! brings up loopback, sets the hostname, and forks the payload. The
//! payload drops every capability, sets `no_new_privs`, enforces Landlock
//! and seccomp, closes what it must not keep, reports to airlock and
//! execs. PID 1 reaps everything and, when the payload ends, hands its
//! status to the stage and exits; the stage exits the same way.
//!
//! Without namespaces (refused by the kernel, not set up by PID 1 because
//! a mount or loopback was refused inside them, or `AIRLOCK_NO_NAMESPACES`):
//! the stage is a child subreaper, forks the payload with the same layers
//! 2-4, and kills every remaining descendant when the payload ends.

use super::filter;
use airlock_core::sandbox::bounds::{Bound, Rlimit};
use airlock_core::sandbox::{
    Applied, Confinement, Cover, CoverRefusal, Mount, Namespace, NsMode, StageStatus, View,
};
use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// The hidden subcommand's name.
pub const STAGE_ARG: &str = "__confine";

/// The exit status when confinement cannot be set up as asked.
pub const REFUSED_EXIT: i32 = 125;

/// The pid forwarded signals go to.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe and takes no memory.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Forward TERM and HUP to `pid`; ignore the terminal's INT and QUIT,
/// which reach the payload directly (same process group), so the stage
/// stays to pass on the payload's status.
fn forward_signals_to(pid: libc::pid_t) {
    FORWARD_TO.store(pid, Ordering::Relaxed);
    // SAFETY: installing a handler that only calls kill; SIG_IGN takes none.
    unsafe {
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

/// Back to the defaults for the payload: ignored signals would stay
/// ignored across exec.
fn default_signals() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE] {
        // SAFETY: SIG_DFL takes no handler.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// The stage's entry point; `args` are the arguments after `__confine`.
pub fn main(args: Vec<OsString>) -> i32 {
    let Some((plan, rest)) = args.split_first() else { return usage() };
    let Some((sep, argv)) = rest.split_first() else { return usage() };
    if sep != "--" || argv.is_empty() {
        return usage();
    }
    let plan: Confinement = match serde_json::from_slice(plan.as_bytes()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: confinement plan: {e}");
            return REFUSED_EXIT;
        }
    };
    // SAFETY: the spawner placed the status pipe's write end here for us
    // alone; it is owned from now on.
    let status = unsafe { OwnedFd::from_raw_fd(plan.status_fd) };
    let _ = rustix::io::fcntl_setfd(&status, rustix::io::FdFlags::CLOEXEC);
    let mut status = Some(std::fs::File::from(status));
    // Before anything is forked: all of the session is in its groups.
    let joined = join_groups(&plan);
    // Dropped unused in the fallback: airlock then sees no mount.
    let mut fuse_socket = super::fuse::take_socket(plan.fuse.as_ref());
    let code = match plan.namespaces {
        NsMode::Off if plan.egress.is_some() => egress_refused(&plan, &mut status, "they are switched off"),
        NsMode::Off => fallback(&plan, argv, &mut status, &joined),
        mode => match with_namespaces(&plan, argv, &mut status, &joined, &mut fuse_socket) {
            Ok(code) => code,
            Err(e) if plan.egress.is_some() => egress_refused(&plan, &mut status, &format!("{e:#}")),
            Err(e) if mode == NsMode::Require => refuse(
                &mut status,
                format!(
                    "namespaces are not available ({e:#}); --require-namespaces refuses to start without them"
                ),
            ),
            Err(_) => fallback(&plan, argv, &mut status, &joined),
        },
    };
    code
}

/// Enter the session's cgroups (see `airlock_core::sandbox::bounds`):
/// the bounds of those entered; the others fall back to rlimits.
fn join_groups(plan: &Confinement) -> Vec<Bound> {
    let mut joined = Vec::new();
    for g in plan.bounds.iter().flat_map(|b| &b.groups) {
        if std::fs::write(g.dir.join("cgroup.procs"), "0").is_ok() {
            joined.extend(&g.bounds);
        }
    }
    joined
}

/// Set each rlimit, never raising one above what is already in force.
fn set_rlimits(rlimits: &[Rlimit]) -> std::io::Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    for r in rlimits {
        let (res, value) = match *r {
            Rlimit::Nproc(n) => (Resource::Nproc, n),
            Rlimit::As(n) => (Resource::As, n),
        };
        let now = getrlimit(res);
        let cap = |x: Option<u64>| Some(x.map_or(value, |x| x.min(value)));
        setrlimit(res, rustix::process::Rlimit { current: cap(now.current), maximum: cap(now.maximum) })?;
    }
    Ok(())
}

/// `--allow-host` without a network namespace: refused, never the
/// fallback (see docs/decisions.md, "Network egress").
fn egress_refused(plan: &Confinement, status: &mut Option<std::fs::File>, why: &str) -> i32 {
    super::egress::close_inherited(plan);
    refuse(
        status,
        format!(
            "--allow-host needs a network namespace of the child's own, and namespaces are not \
             available ({why}); without one, the proxy's port would be open to the child on every \
             host, so airlock refuses to start"
        ),
    )
}

fn usage() -> i32 {
    eprintln!("airlock {STAGE_ARG}: internal: PLAN -- ARGV...");
    REFUSED_EXIT
}

fn send(status: &mut Option<std::fs::File>, s: &StageStatus) {
    if let (Ok(mut line), Some(file)) = (serde_json::to_vec(s), status.as_mut()) {
        line.push(b'\n');
        let _ = file.write_all(&line);
    }
}

fn refuse(status: &mut Option<std::fs::File>, message: String) -> i32 {
    send(status, &StageStatus::Refused { message });
    REFUSED_EXIT
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn check(r: libc::c_int, what: &str) -> anyhow::Result<()> {
    if r < 0 {
        anyhow::bail!("{what}: {}", errno());
    }
    Ok(())
}

/// The `clone` flags for every namespace the plan wants, and their list.
fn namespace_flags(plan: &Confinement) -> (libc::c_int, Vec<Namespace>) {
    let wanted = plan.wanted();
    let mut flags = 0;
    for ns in &wanted {
        flags |= match ns {
            Namespace::User => libc::CLONE_NEWUSER,
            Namespace::Pid => libc::CLONE_NEWPID,
            Namespace::Ipc => libc::CLONE_NEWIPC,
            Namespace::Net => libc::CLONE_NEWNET,
            Namespace::Uts => libc::CLONE_NEWUTS,
            Namespace::Mount => libc::CLONE_NEWNS,
        };
    }
    (flags, wanted)
}

/// In the new user namespace: map our own ids (as they were outside).
fn map_ids(uid: libc::uid_t, gid: libc::gid_t) -> anyhow::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny").map_err(|e| anyhow::anyhow!("setgroups: {e}"))?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))
        .map_err(|e| anyhow::anyhow!("uid_map: {e}"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
        .map_err(|e| anyhow::anyhow!("gid_map: {e}"))?;
    Ok(())
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(Into::into)
}

/// `fork` into new namespaces (`flags`): the child is in them, PID 1 of
/// the new PID namespace, while the stage stays in the caller's, free to
/// fall back when the child cannot set them up.
fn clone_into(flags: libc::c_int) -> std::io::Result<libc::pid_t> {
    let flags = (flags | libc::SIGCHLD) as libc::c_ulong;
    // s390x takes the stack before the flags; every other architecture
    // takes the flags first. Every other argument is zero.
    #[cfg(target_arch = "s390x")]
    let args = [0, flags];
    #[cfg(not(target_arch = "s390x"))]
    let args = [flags, 0];
    // SAFETY: as fork(): the stage is single-threaded and, without
    // CLONE_VM, the child runs on a copy of it; no stack, tid or TLS
    // pointer is passed.
    let pid = unsafe { libc::syscall(libc::SYS_clone, args[0], args[1], 0usize, 0usize, 0usize) };
    if pid < 0 {
        return Err(errno());
    }
    Ok(pid as libc::pid_t)
}

fn fork() -> std::io::Result<libc::pid_t> {
    // SAFETY: the stage is single-threaded: the child may do anything.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(errno());
    }
    Ok(pid)
}

fn wait_pid(pid: libc::pid_t) -> Option<libc::c_int> {
    let mut st = 0;
    loop {
        // SAFETY: st is ours.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return Some(st);
        }
        if r < 0 && errno().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Exit as a process that ended with wait status `st` did: the same code,
/// or the same signal.
fn exit_like(st: libc::c_int) -> i32 {
    if libc::WIFEXITED(st) {
        return libc::WEXITSTATUS(st);
    }
    if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: plain system calls on our own process; the struct is ours.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
        return 128 + sig;
    }
    1
}

fn set_death_signal() -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

/// PID 1's first byte on the result pipe: the namespaces are set up.
const SET_UP: u8 = b'R';
/// ... or they are not, followed by why.
const NOT_SET_UP: u8 = b'F';
/// The longest reason PID 1 passes on (one atomic pipe write).
const MAX_REASON: usize = 1024;

/// The outer stage with namespaces: clone PID 1 into them, wait for it,
/// exit as the payload did. `Err` when the kernel refuses the namespaces
/// or PID 1 could not set them up (a mount, loopback: what AppArmor may
/// refuse inside a namespace it let be created); nothing has run then,
/// and the stage, still in the caller's namespaces, may fall back.
fn with_namespaces(
    plan: &Confinement,
    argv: &[OsString],
    status: &mut Option<std::fs::File>,
    joined: &[Bound],
    fuse_socket: &mut Option<OwnedFd>,
) -> anyhow::Result<i32> {
    let (flags, namespaces) = namespace_flags(plan);
    // SAFETY: no arguments.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (result_rd, result_wr) = match pipe() {
        Ok(p) => p,
        Err(e) => return Ok(refuse(status, format!("pipe: {e}"))),
    };
    let (alive_rd, alive_wr) = match pipe() {
        Ok(p) => p,
        Err(e) => return Ok(refuse(status, format!("pipe: {e}"))),
    };
    let pid1 = clone_into(flags).map_err(|e| anyhow::anyhow!("clone: {e}"))?;
    if pid1 == 0 {
        drop(result_rd);
        drop(alive_wr);
        let code = match map_ids(uid, gid) {
            Ok(()) => init(
                plan,
                argv,
                Applied { namespaces, cgroups: joined.to_vec(), ..Applied::default() },
                status,
                fuse_socket.take(),
                result_wr,
                alive_rd,
            ),
            Err(e) => not_set_up(&result_wr, &format!("{e:#}")),
        };
        // SAFETY: leave without running the stage's destructors twice.
        unsafe { libc::_exit(code) };
    }
    drop(result_wr);
    drop(alive_rd);
    // PID 1 has its copy; the end of its copy is the end of the mounts.
    drop(fuse_socket.take());
    super::egress::close_inherited(plan);
    let mut tag = [0u8; 1];
    if !matches!(rustix::io::read(&result_rd, &mut tag), Ok(1)) || tag[0] != SET_UP {
        let mut reason = Vec::new();
        let _ = std::fs::File::from(result_rd).read_to_end(&mut reason);
        let st = wait_pid(pid1);
        if tag[0] == NOT_SET_UP {
            anyhow::bail!("{}", String::from_utf8_lossy(&reason));
        }
        return Ok(st.map_or(REFUSED_EXIT, exit_like));
    }
    // Ours goes: the payload's exec (or PID 1's exit) ends the status stream.
    drop(status.take());
    release_stdio();
    forward_signals_to(pid1);
    let st = wait_pid(pid1);
    drop(alive_wr);
    let mut raw = [0u8; 4];
    let got = rustix::io::read(&result_rd, &mut raw).unwrap_or(0);
    Ok(match (got, st) {
        (4, _) => exit_like(i32::from_ne_bytes(raw)),
        (_, Some(st)) => exit_like(st),
        _ => REFUSED_EXIT,
    })
}

/// In PID 1: the namespaces could not be set up; the stage decides.
fn not_set_up(result: &OwnedFd, reason: &str) -> i32 {
    let mut msg = vec![NOT_SET_UP];
    msg.extend(reason.bytes().take(MAX_REASON));
    let _ = rustix::io::write(result, &msg);
    REFUSED_EXIT
}

/// PID 1 of the new PID namespace.
fn init(
    plan: &Confinement,
    argv: &[OsString],
    mut applied: Applied,
    status: &mut Option<std::fs::File>,
    fuse_socket: Option<OwnedFd>,
    result: OwnedFd,
    alive: OwnedFd,
) -> i32 {
    if set_death_signal().is_err() {
        return REFUSED_EXIT;
    }
    // The stage may have died before the request: its pipe says so.
    let mut byte = [0u8; 1];
    let _ = rustix::io::ioctl_fionbio(&alive, true);
    if matches!(rustix::io::read(&alive, &mut byte), Ok(0)) {
        return REFUSED_EXIT;
    }
    if applied.has(Namespace::Mount) {
        let mut served = plan.fuse.as_ref().map(|p| super::fuse::Setup::open(p, fuse_socket));
        match build_view(&plan.view, served.as_mut()) {
            Ok(proc) => applied.proc = proc,
            Err(e) => return not_set_up(&result, &format!("building the mount view: {e:#}")),
        }
        if let Some(s) = served {
            applied.fuse = s.mounted;
            applied.fuse_error = s.error;
        }
    }
    if applied.has(Namespace::Net) {
        if let Err(e) = loopback_up() {
            return not_set_up(&result, &format!("bringing up loopback: {e}"));
        }
        if let Some(listen) = &plan.egress {
            if let Err(e) = super::egress::hand_over(listen) {
                return not_set_up(&result, &format!("the egress proxy's listeners: {e:#}"));
            }
        }
    }
    if applied.has(Namespace::Uts) {
        let name = plan.view.hostname.as_bytes();
        // SAFETY: the buffer and its length are ours.
        let _ = unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) };
    }
    let _ = rustix::io::write(&result, &[SET_UP]);
    let payload = match fork() {
        Ok(p) => p,
        Err(e) => return refuse(status, format!("fork: {e}")),
    };
    if payload == 0 {
        drop(result);
        drop(alive);
        let code = payload_exec(plan, argv, applied, status, true);
        // SAFETY: the exec failed; leave at once.
        unsafe { libc::_exit(code) };
    }
    forward_signals_to(payload);
    // PID 1's copy of the status pipe must go, so its reader sees EOF once
    // the payload has exec'd.
    drop(status.take());
    release_stdio();
    // Reap everything until the payload ends.
    loop {
        let mut st = 0;
        // SAFETY: st is ours.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == payload {
            let _ = rustix::io::write(&result, &st.to_ne_bytes());
            return 0;
        }
        if r < 0 && errno().raw_os_error() == Some(libc::ECHILD) {
            return 1;
        }
    }
}

/// Point the stage's own stdin, stdout and stderr at `/dev/null` (or close
/// them), once the payload has its copies: a payload that closes its
/// output is then seen to close it, not kept open by the stages above it.
fn release_stdio() {
    // SAFETY: open/dup2/close on our own descriptors; nothing else holds
    // them in this single-threaded stage.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        for fd in 0..3 {
            if null >= 0 {
                libc::dup2(null, fd);
            } else {
                libc::close(fd);
            }
        }
        if null > 2 {
            libc::close(null);
        }
    }
}

/// The fallback: a subreaper stage, the payload its child.
fn fallback(
    plan: &Confinement,
    argv: &[OsString],
    status: &mut Option<std::fs::File>,
    joined: &[Bound],
) -> i32 {
    // Without a mount view nothing can be masked or kept read-only. Holds
    // are not refused: nothing of the host is hidden or changed by their
    // absence, and the report lists them as not enforced.
    let needed: Vec<&Cover> = plan.view.covers.iter().filter(|c| !matches!(c, Cover::Hold { .. })).collect();
    if let Some(first) = needed.first() {
        let refusal = CoverRefusal::NoMountNamespace { first: (*first).clone(), count: needed.len() };
        return refuse(status, refusal.to_string());
    }
    // SAFETY: a flag on our own process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let me = std::process::id() as libc::pid_t;
    let payload = match fork() {
        Ok(p) => p,
        Err(e) => return refuse(status, format!("fork: {e}")),
    };
    if payload == 0 {
        if set_death_signal().is_err() || std::os::unix::process::parent_id() as libc::pid_t != me {
            // SAFETY: leave at once.
            unsafe { libc::_exit(REFUSED_EXIT) };
        }
        let applied = Applied { cgroups: joined.to_vec(), ..Applied::default() };
        let code = payload_exec(plan, argv, applied, status, false);
        // SAFETY: leave at once.
        unsafe { libc::_exit(code) };
    }
    drop(status.take());
    release_stdio();
    forward_signals_to(payload);
    let mut result = None;
    loop {
        let mut st = 0;
        // SAFETY: st is ours.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == payload {
            result = Some(st);
            kill_descendants();
        } else if r < 0 {
            match errno().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => break,
            }
        } else if result.is_some() {
            kill_descendants();
        }
    }
    result.map_or(REFUSED_EXIT, exit_like)
}

/// SIGKILL every child still ours (orphans are reparented to us, the
/// subreaper, so every descendant becomes one in turn).
fn kill_descendants() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else { continue };
        for pid in text.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()) {
            // SAFETY: a signal to our own child, which we have not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// In the payload: every layer, the report, the exec. Returns only on
/// failure, with the exit status to leave with.
fn payload_exec(
    plan: &Confinement,
    argv: &[OsString],
    mut applied: Applied,
    status: &mut Option<std::fs::File>,
    in_namespaces: bool,
) -> i32 {
    default_signals();
    if in_namespaces && set_death_signal().is_err() {
        return REFUSED_EXIT;
    }
    // A fresh session keyring, before seccomp refuses keyctl: the payload
    // reaches no key of the user's session.
    // SAFETY: KEYCTL_JOIN_SESSION_KEYRING with a null name takes no memory.
    unsafe { libc::syscall(libc::SYS_keyctl, libc::KEYCTL_JOIN_SESSION_KEYRING, 0usize) };
    if let Err(e) = drop_capabilities() {
        return refuse(status, format!("dropping capabilities: {e}"));
    }
    if let Err(e) = set_rlimits(&plan.rlimits_for(&applied)) {
        return refuse(status, format!("setting the session's rlimits: {e}"));
    }
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        return refuse(status, format!("no_new_privs: {e}"));
    }
    let ruleset = plan.ruleset_for(&applied);
    let fd = match super::landlock::ruleset(&ruleset) {
        Ok(fd) => fd,
        Err(e) => return refuse(status, format!("{e:#}")),
    };
    // SAFETY: landlock_restrict_self takes a descriptor and flags only.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
    if r != 0 {
        return refuse(status, format!("landlock_restrict_self: {}", errno()));
    }
    drop(fd);
    let programs = match filter::compile(&plan.seccomp_for(&applied)) {
        Ok(p) => p,
        Err(e) => return refuse(status, format!("{e:#}")),
    };
    for p in &programs {
        if let Err(e) = seccompiler::apply_filter(p) {
            return refuse(status, format!("installing the seccomp filter: {e}"));
        }
    }
    applied.seccomp = true;
    close_from(plan.keep_fds as RawFd + 1);
    let session_env = plan.session_env(&applied).map(|(var, path)| (var.to_owned(), path.to_path_buf()));
    send(status, &StageStatus::Applied(applied));
    let Some((program, args)) = argv.split_first() else { return REFUSED_EXIT };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    if let Some((var, path)) = session_env {
        cmd.env(var, path);
    }
    let err = cmd.exec();
    // airlock says why, naming the program, as it would for an
    // unconfined start.
    send(status, &StageStatus::ExecFailed { errno: err.raw_os_error().unwrap_or(0) });
    match err.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Mark every descriptor from `first` on close-on-exec (the status pipe is
/// already): nothing the stage inherited reaches the payload.
fn close_from(first: RawFd) {
    // SAFETY: close_range only changes descriptor flags.
    let r =
        unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if r != 0 {
        let max = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(65_536);
        for fd in first..(max.min(1 << 20) as RawFd) {
            // SAFETY: a borrow for one fcntl; EBADF for a closed number is harmless.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let _ = rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC);
        }
    }
}

/// Empty the bounding, ambient, inheritable, permitted and effective
/// sets, and lock root out of regaining them on exec. Without
/// CAP_SETPCAP (an unprivileged fallback) the bounding set cannot be
/// changed, and there is nothing in it to use anyway.
fn drop_capabilities() -> std::io::Result<()> {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
    const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0
                && errno().raw_os_error() == Some(libc::EINVAL)
            {
                break;
            }
        }
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            SECBIT_NOROOT
                | SECBIT_NOROOT_LOCKED
                | SECBIT_NO_SETUID_FIXUP
                | SECBIT_NO_SETUID_FIXUP_LOCKED
                | SECBIT_NO_CAP_AMBIENT_RAISE
                | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
            0,
            0,
            0,
        );
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset reads the header and two data structs, all ours.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    if r != 0 {
        return Err(errno());
    }
    Ok(())
}

fn cstr(p: &Path) -> anyhow::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| anyhow::anyhow!("{}: a NUL in the path", p.display()))
}

fn mount(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> anyhow::Result<()> {
    let src_c = src.map(cstr).transpose()?;
    let dst_c = cstr(dst)?;
    let fs_c = fstype.map(|f| CString::new(f).unwrap_or_default());
    let data_c = data.map(|d| CString::new(d).unwrap_or_default());
    // SAFETY: every pointer is a NUL-terminated string we own, or null.
    let r = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            dst_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    check(r, &format!("mount {}", dst.display()))
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// Make the mount at `dst` (and those beneath it) read-only and nosuid,
/// leaving its other flags as they are (a plain remount would have to
/// repeat the locked ones).
fn make_read_only(dst: &Path) -> anyhow::Result<()> {
    set_attr(dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
}

/// Set the `MOUNT_ATTR_*` flags `set` on the mount at `dst` and those
/// beneath it, leaving the others as they are; before `mount_setattr`
/// (Linux 5.12), a bind remount with the same flags.
fn set_attr(dst: &Path, set: u64) -> anyhow::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let attr = MountAttr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let c = cstr(dst)?;
    // SAFETY: the path and the attribute struct are ours, its size given.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    let mut flags = libc::MS_BIND | libc::MS_REMOUNT;
    for (attr, flag) in [
        (MOUNT_ATTR_RDONLY, libc::MS_RDONLY),
        (MOUNT_ATTR_NOSUID, libc::MS_NOSUID),
        (MOUNT_ATTR_NODEV, libc::MS_NODEV),
    ] {
        if set & attr != 0 {
            flags |= flag;
        }
    }
    mount(None, dst, None, flags, None)
}

/// Where the view is assembled, and where the host's root is reachable
/// while it is.
const NEW_ROOT: &str = "/newroot";
const OLD_ROOT: &str = "/oldroot";

fn inside(base: &str, p: &Path) -> PathBuf {
    Path::new(base).join(p.strip_prefix("/").unwrap_or(p))
}

/// Build `view` and pivot into it. Returns whether `/proc` is a fresh one.
fn build_view(view: &View, served: Option<&mut super::fuse::Setup<'_>>) -> anyhow::Result<bool> {
    let root = Path::new("/");
    mount(None, root, None, libc::MS_REC | libc::MS_PRIVATE, None)?;
    // A scratch tmpfs on /tmp becomes the root for a moment, with the
    // host's root beneath it at /oldroot: every source is then read from
    // there, even ones under /tmp.
    let base = Path::new("/tmp");
    mount(
        Some(Path::new("tmpfs")),
        base,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=65536"),
    )?;
    std::fs::create_dir("/tmp/newroot")?;
    std::fs::create_dir("/tmp/oldroot")?;
    pivot_root(base, Path::new("/tmp/oldroot"))?;
    std::env::set_current_dir("/")?;
    let new_root = Path::new(NEW_ROOT);
    let data = format!("mode=0755,size={}", view.root_size);
    mount(Some(Path::new("tmpfs")), new_root, Some("tmpfs"), libc::MS_NOSUID | libc::MS_NODEV, Some(&data))?;
    let mut proc = false;
    for m in &view.mounts {
        let dst = inside(NEW_ROOT, m.path());
        match m {
            Mount::Bind { path, writable, required } => {
                let src = inside(OLD_ROOT, path);
                let meta = match std::fs::symlink_metadata(&src) {
                    Ok(m) => m,
                    Err(_) if !required => continue,
                    Err(e) => anyhow::bail!("{}: {e}", path.display()),
                };
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&src)?;
                    make_parent(&dst)?;
                    std::os::unix::fs::symlink(target, &dst)?;
                    continue;
                }
                if meta.is_dir() {
                    std::fs::create_dir_all(&dst)?;
                } else {
                    make_parent(&dst)?;
                    if std::fs::symlink_metadata(&dst).is_err() {
                        std::fs::File::create(&dst)?;
                    }
                }
                mount(Some(&src), &dst, None, libc::MS_BIND | libc::MS_REC, None)?;
                if *writable {
                    // Nothing setuid or a device runs from a place the
                    // payload writes.
                    set_attr(&dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
                } else {
                    make_read_only(&dst)?;
                }
            }
            Mount::Device { path } => {
                let src = inside(OLD_ROOT, path);
                if std::fs::symlink_metadata(&src).is_err() {
                    continue;
                }
                make_parent(&dst)?;
                std::fs::File::create(&dst)?;
                mount(Some(&src), &dst, None, libc::MS_BIND, None)?;
                set_attr(&dst, MOUNT_ATTR_NOSUID)?;
            }
            Mount::Socket { source, .. } => {
                let src = inside(OLD_ROOT, source);
                make_parent(&dst)?;
                std::fs::File::create(&dst)?;
                mount(Some(&src), &dst, None, libc::MS_BIND, None)?;
                set_attr(&dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
            }
            Mount::Tmpfs { size, mode, .. } => {
                std::fs::create_dir_all(&dst)?;
                let data = format!("mode={mode:o},size={size}");
                mount(
                    Some(Path::new("tmpfs")),
                    &dst,
                    Some("tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(&data),
                )?;
            }
            Mount::Proc { .. } => {
                std::fs::create_dir_all(&dst)?;
                // A container that hides parts of its own /proc refuses a
                // fresh one: the view then has none (Landlock grants none
                // of it anyway), and the report says so.
                proc = mount(
                    Some(Path::new("proc")),
                    &dst,
                    Some("proc"),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    None,
                )
                .is_ok();
            }
            Mount::Symlink { target, .. } => {
                make_parent(&dst)?;
                let _ = std::os::unix::fs::symlink(target, &dst);
            }
            Mount::Dir { .. } => {
                // Beneath a read-only bind it cannot be made; then it
                // exists already or the payload starts in `/`. One made
                // here is read-only: a write there would land nowhere the
                // user looks (the project is reached through airlock).
                if std::fs::symlink_metadata(&dst).is_err() && std::fs::create_dir_all(&dst).is_ok() {
                    mount(Some(&dst), &dst, None, libc::MS_BIND | libc::MS_REC, None)?;
                    // A served root beneath it needs its mount point made
                    // while it is still writable.
                    if let Some(s) = served.as_deref() {
                        s.make_points_beneath(new_root, &dst);
                    }
                    make_read_only(&dst)?;
                }
            }
        }
    }
    apply_covers(&view.covers)?;
    // The roots served as filesystems, over everything else at their paths.
    if let Some(s) = served {
        s.mount_all(new_root);
    }
    mount(None, new_root, None, libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV, None)?;
    umount_detach(Path::new(OLD_ROOT))?;
    std::env::set_current_dir(new_root)?;
    pivot_root(Path::new("."), Path::new("."))?;
    umount_detach(Path::new("."))?;
    std::env::set_current_dir("/")?;
    if std::env::set_current_dir(&view.cwd).is_err() {
        std::env::set_current_dir("/")?;
    }
    Ok(proc)
}

/// The guard's covers over the trees just bound (see
/// `airlock_core::sandbox::guarded`): masks are an empty file or
/// directory of the scratch root, read-only; read-only paths and pins are
/// bound over themselves. A path gone since it was found is skipped; one
/// that became a symlink is refused (a mount would follow it).
fn apply_covers(covers: &[Cover]) -> anyhow::Result<()> {
    if covers.is_empty() {
        return Ok(());
    }
    // The scratch root (`/` now) outlives nothing it lends: a bind keeps
    // its inode.
    let (empty_file, empty_dir) = (Path::new("/mask-file"), Path::new("/mask-dir"));
    std::fs::File::create(empty_file)?;
    std::fs::create_dir(empty_dir)?;
    for c in covers {
        let dst = inside(NEW_ROOT, c.path());
        let Ok(meta) = std::fs::symlink_metadata(&dst) else { continue };
        if meta.file_type().is_symlink() {
            anyhow::bail!("{} became a symlink while the view was made", c.path().display());
        }
        match c {
            Cover::Mask { dir, .. } | Cover::Hold { dir, .. } => {
                let src = if *dir { empty_dir } else { empty_file };
                mount(Some(src), &dst, None, libc::MS_BIND, None)?;
                make_read_only(&dst)?;
            }
            Cover::ReadOnly { .. } => {
                mount(Some(&dst), &dst, None, libc::MS_BIND | libc::MS_REC, None)?;
                make_read_only(&dst)?;
            }
            Cover::Pin { .. } => mount(Some(&dst), &dst, None, libc::MS_BIND | libc::MS_REC, None)?,
        }
    }
    Ok(())
}

fn make_parent(p: &Path) -> std::io::Result<()> {
    match p.parent() {
        Some(parent) => std::fs::create_dir_all(parent),
        None => Ok(()),
    }
}

fn pivot_root(new: &Path, old: &Path) -> anyhow::Result<()> {
    let (n, o) = (cstr(new)?, cstr(old)?);
    // SAFETY: two NUL-terminated strings we own.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, n.as_ptr(), o.as_ptr()) };
    check(r as libc::c_int, "pivot_root")
}

fn umount_detach(p: &Path) -> anyhow::Result<()> {
    let c = cstr(p)?;
    // SAFETY: a NUL-terminated string we own.
    check(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, &format!("umount {}", p.display()))
}

/// `ip link set lo up`, in the new network namespace.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a plain socket for the ioctls below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd was just returned to us.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the ioctls read and write the ifreq we own.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(errno());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(errno());
        }
    }
    Ok(())
}
