//! The terminal airlock was started from (issue 39). airlock runs with a
//! real pseudo-terminal as its controlling terminal and on its fds 0-2,
//! started as a job by a minimal job-control shell (tests/attacks/
//! jobshell.py, the terminal's session leader); the child inherits it. A child that pushes a command
//! into the terminal's input (`TIOCSTI` through fd 0, 1 and 2, with the
//! request's high bits set, through a fresh `/dev/tty`, from a grandchild
//! in a process group of its own) gets nothing in: the terminal echoes
//! none of it and its input queue is empty when airlock has exited. And
//! job control still works: ^C typed at the terminal interrupts the
//! session, ^Z stops it and it carries on after SIGCONT. Both modes, as
//! root and as uid 65534; this kernel has `dev.tty.legacy_tiocsti` = 1
//! (checked), so without airlock's refusal the push would land.

mod common;
mod confine_common;
mod confine_who;

use confine_who::*;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A pseudo-terminal: the master the test types into and reads, the slave
/// that becomes airlock's controlling terminal.
struct Pty {
    master: File,
    slave: File,
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl Pty {
    fn open() -> Pty {
        // SAFETY: plain calls on a descriptor we own; the name buffer is ours.
        unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(m >= 0, "posix_openpt: {}", errno());
            let master = File::from(OwnedFd::from_raw_fd(m));
            assert_eq!(libc::grantpt(m), 0, "grantpt: {}", errno());
            assert_eq!(libc::unlockpt(m), 0, "unlockpt: {}", errno());
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0, "ptsname: {}", errno());
            let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(s >= 0, "open the slave: {}", errno());
            Pty { master, slave: File::from(OwnedFd::from_raw_fd(s)) }
        }
    }

    /// Start `cmd` (the job shell) as a terminal starts a login shell: in
    /// a session of its own whose controlling terminal is the slave, on
    /// its fds 0-2.
    fn spawn(&self, mut cmd: std::process::Command) -> Child {
        cmd.stdin(Stdio::from(self.slave.try_clone().unwrap()))
            .stdout(Stdio::from(self.slave.try_clone().unwrap()))
            .stderr(Stdio::from(self.slave.try_clone().unwrap()));
        // SAFETY: setsid and ioctl are async-signal-safe and allocate nothing.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().expect("airlock starts")
    }

    /// Everything the terminal shows, read on a thread as it comes.
    fn screen(&self) -> Screen {
        let text = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (text.clone(), stop.clone());
        let mut master = self.master.try_clone().unwrap();
        let fd = master.as_raw_fd();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !s.load(Ordering::Relaxed) {
                let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd of ours.
                if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
                    continue;
                }
                match master.read(&mut buf) {
                    Ok(n) if n > 0 => t.lock().unwrap().extend_from_slice(&buf[..n]),
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Screen { text, stop, thread: Some(thread) }
    }

    fn type_(&self, bytes: &[u8]) {
        (&self.master).write_all(bytes).unwrap();
    }

    /// Bytes waiting in the terminal's input, whole lines or not: the
    /// slave is switched to raw mode first, which makes a partial line
    /// readable too.
    fn pending_input(&self) -> Vec<u8> {
        let fd = self.slave.as_raw_fd();
        // SAFETY: termios calls and a non-blocking read on our descriptor.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(fd, &mut t), 0, "tcgetattr: {}", errno());
            libc::cfmakeraw(&mut t);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            assert_eq!(libc::tcsetattr(fd, libc::TCSANOW, &t), 0, "tcsetattr: {}", errno());
            let mut buf = [0u8; 4096];
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            buf[..n.max(0) as usize].to_vec()
        }
    }
}

struct Screen {
    text: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Screen {
    fn now(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).replace('\r', "")
    }

    fn wait_for(&self, what: &str, ctx: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.now().contains(what) {
            assert!(Instant::now() < deadline, "{ctx}: {what:?} never showed: {}", self.now());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(mut self) -> String {
        std::thread::sleep(Duration::from_millis(100));
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.now()
    }
}

fn wait_exit(child: &mut Child, within: Duration, ctx: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{ctx}: airlock did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn legacy_tiocsti_on() {
    let v = std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").unwrap_or_default();
    assert_eq!(
        v.trim(),
        "1",
        "dev.tty.legacy_tiocsti is not 1 here: TIOCSTI would be refused by the kernel itself, and this \
         test could not tell whether airlock refuses it"
    );
}

/// Nothing pushed by the child reaches the terminal's input, through any
/// of its inherited descriptors, the high-bit spelling, `/dev/tty`, or a
/// grandchild; `TIOCLINUX` is refused by airlock (EPERM), not merely
/// unknown to a pseudo-terminal.
#[test]
fn a_confined_child_pushes_nothing_into_the_terminal() {
    legacy_tiocsti_on();
    for (mode, who) in cases() {
        let ctx = format!("{mode:?} as {who:?}");
        let f = Fixture::new(who);
        let marker = format!("touch /tmp/airlock-injected-{}", confine_common::unique());
        let pty = Pty::open();
        let screen = pty.screen();
        let report = f.report_path();
        let cmd = f.attack("tty.py", std::slice::from_ref(&marker));
        let mut shell = pty.spawn(f.run_wrapped(mode, &job_shell(&f), &[], &report, &cmd));
        let status = wait_exit(&mut shell, Duration::from_secs(30), &ctx);
        let shown = screen.finish();
        let pending = pty.pending_input();
        let got = outcomes(&shown);
        assert!(status.success() && shown.contains("shell: exit 0"), "{ctx}: {shown}");
        assert_eq!(
            outcome(&got, "fd 0 is a terminal"),
            "ok",
            "{ctx}: the child's fd 0 is no terminal: {shown}"
        );
        for label in ["tiocsti fd 0", "tiocsti fd 1", "tiocsti fd 2", "tiocsti high bits", "tiocsti /dev/tty"]
        {
            assert_ne!(outcome(&got, label), "ok", "{ctx}: {label} got through: {got:?}");
        }
        assert_ne!(outcome(&got, "tiocsti grandchild"), "ok", "{ctx}: a grandchild got through: {got:?}");
        assert_eq!(outcome(&got, "tioclinux"), "EPERM", "{ctx}: TIOCLINUX was not refused: {got:?}");
        assert!(!shown.contains(&marker), "{ctx}: the terminal echoed pushed input: {shown}");
        assert!(
            pending.is_empty(),
            "{ctx}: the terminal's input holds {:?} after airlock exited",
            String::from_utf8_lossy(&pending)
        );
        let r = read_report(&report, &ctx, &shown);
        assert_eq!(r["sandbox"]["seccomp"], true, "{ctx}: {r}");
    }
}

/// Job control is the user's, as without airlock: ^Z typed at the
/// terminal stops the job (the shell sees it stopped and continues it, as
/// `fg`), and ^C then ends the session with the child's interrupt status
/// (130, as the shell reports it).
#[test]
fn job_control_at_the_terminal_still_works() {
    for (mode, who) in cases() {
        let ctx = format!("{mode:?} as {who:?}");
        let f = Fixture::new(who);
        let pty = Pty::open();
        let screen = pty.screen();
        let report = f.report_path();
        let script = "echo ready; sleep 60; echo continued".to_owned();
        let cmd = ["sh".to_owned(), "-c".to_owned(), script];
        let mut shell = pty.spawn(f.run_wrapped(mode, &job_shell(&f), &[], &report, &cmd));
        screen.wait_for("ready", &ctx);
        pty.type_(b"\x1a");
        screen.wait_for("shell: stopped", &ctx);
        std::thread::sleep(Duration::from_millis(200));
        pty.type_(b"\x03");
        let status = wait_exit(&mut shell, Duration::from_secs(10), &ctx);
        let shown = screen.finish();
        assert!(status.success(), "{ctx}: {shown}");
        assert!(shown.contains("shell: exit 130"), "{ctx}: ^C did not interrupt the session: {shown}");
        assert!(!shown.contains("continued"), "{ctx}: the child carried on after ^C: {shown}");
        let r = read_report(&report, &ctx, &shown);
        assert_eq!(r["child_exit"]["signal"], libc::SIGINT, "{ctx}: {r}");
    }
}

/// `python3 jobshell.py`, in front of airlock's path.
fn job_shell(f: &Fixture) -> Vec<String> {
    vec!["python3".to_owned(), f.attacks.join("jobshell.py").display().to_string()]
}
