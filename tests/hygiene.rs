//! Process hygiene of `airlock run` with real processes: the child gets
//! exactly descriptors 0-3, dies with airlock, and a read of handle 0
//! never holds airlock (or its signals) hostage nor swallows later input.

mod common;

use common::*;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `airlock run [args] -- python3 -c script`, spawned (not waited for).
fn spawn(args: &[&str], script: &str, stdin: Stdio) -> std::process::Child {
    Command::new(airlock())
        .arg("run")
        .arg("--sandbox-ro")
        .arg(support(""))
        .args(args)
        .arg("--")
        .args(python(script))
        .env_remove("AIRLOCK_FD")
        .env("PATH", SYSTEM_PATH)
        .env("PYTHONPATH", support(""))
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlock starts")
}

fn wait_within(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn alive(pid: i32) -> bool {
    // Gone, or a zombie waiting for a reaper that is not ours to be.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// A pipe, both ends close-on-exec unless handed out.
fn pipe() -> (OwnedFd, OwnedFd) {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
}

const LIST_FDS: &str = r#"
import fcntl
def is_open(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
        return True
    except OSError:
        return False
out([fd for fd in range(4096) if is_open(fd)])
"#;

/// The harness hands airlock an extra descriptor without close-on-exec (a
/// file outside every root on fd 7, as a careless parent would): the child
/// must not see it, confined or not.
#[test]
fn the_child_gets_exactly_descriptors_0_to_3() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "not for the child").unwrap();
    for extra in [&[][..], &["--no-sandbox"][..]] {
        let file = std::fs::File::open(&secret).unwrap();
        let raw = file.as_raw_fd();
        let mut cmd = Command::new(airlock());
        cmd.arg("run")
            .arg("--sandbox-ro")
            .arg(support(""))
            .args(extra)
            .arg("--")
            .args(python(LIST_FDS))
            .env_remove("AIRLOCK_FD")
            .env("PYTHONPATH", support(""))
            .stdin(Stdio::null());
        // SAFETY: dup2 between fork and exec, async-signal-safe; the
        // duplicate on fd 7 has no close-on-exec, so airlock inherits it.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, 7) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        drop(file);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "[0, 1, 2, 3]\n", "{extra:?}");
    }
}

/// SIGKILL of airlock (the OOM killer, `timeout -s KILL`): the child gets
/// the parent-death signal (SIGKILL) and is gone at once. Under the
/// default sandbox the child's pid is its namespace's, so it is found on
/// the host by a marker in its command line; in the fallback (no
/// namespaces) and unconfined by the pid it reports.
#[test]
fn the_child_dies_with_airlock() {
    for extra in [&[][..], &["--no-sandbox"][..]] {
        for namespaces in [true, false] {
            let marker =
                format!("dies-with-airlock-{}-{}", std::process::id(), extra.len() * 2 + namespaces as usize);
            let script =
                format!("# {marker}\nimport time\nout(os.getpid())\ntime.sleep(60)\nout('still here')");
            let mut cmd = Command::new(airlock());
            cmd.arg("run")
                .arg("--sandbox-ro")
                .arg(support(""))
                .args(extra)
                .arg("--")
                .args(python(&script))
                .env_remove("AIRLOCK_FD")
                .env("PATH", SYSTEM_PATH)
                .env("PYTHONPATH", support(""))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if !namespaces {
                cmd.env("AIRLOCK_NO_NAMESPACES", "1");
            }
            let mut airlock = cmd.spawn().expect("airlock starts");
            let mut line = String::new();
            std::io::BufReader::new(airlock.stdout.take().unwrap()).read_line(&mut line).unwrap();
            let _: i32 = line.trim().parse().unwrap_or_else(|_| panic!("no pid: {line:?}"));
            let found = pythons_with(&marker);
            assert_eq!(
                found.len(),
                1,
                "the child is not found on the host by its marker ({extra:?}): {found:?}"
            );
            airlock.kill().unwrap();
            airlock.wait().unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !pythons_with(&marker).is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let left = pythons_with(&marker);
            assert!(
                left.is_empty(),
                "the child {left:?} outlived airlock ({extra:?}, namespaces {namespaces})"
            );
        }
    }
}

/// Live (not zombie) python3 processes on the host whose command line
/// holds `marker`.
fn pythons_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_python = args.first().is_some_and(|a| a.ends_with(b"python3"));
        let marked = String::from_utf8_lossy(&cmdline).contains(marker);
        if is_python && marked && alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// A child that asks for handle 0 and exits while airlock's stdin stays
/// open (nothing written): airlock exits at once, having read nothing, and
/// bytes written afterwards are still there for the next reader.
#[test]
fn a_pending_stdin_read_neither_blocks_exit_nor_swallows_input() {
    let (rd, wr) = pipe();
    let keep_rd = rd.try_clone().unwrap();
    let script = r#"
send({"id": "r", "op": "read", "params": {"h": 0, "max": 100}})
import time
time.sleep(0.3)
out("leaving with the read pending")
"#;
    let start = Instant::now();
    let mut airlock = spawn(&[], script, Stdio::from(rd));
    let status = wait_within(&mut airlock, Duration::from_secs(10));
    let elapsed = start.elapsed();
    let mut stderr = String::new();
    airlock.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "airlock hung on its stdin; stderr: {stderr}");
    assert!(elapsed < Duration::from_secs(5), "airlock took {elapsed:?} to exit");
    let mut wr = std::fs::File::from(wr);
    wr.write_all(b"later bytes\n").unwrap();
    drop(wr);
    let mut rest = String::new();
    std::fs::File::from(keep_rd).read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "later bytes\n", "airlock swallowed input after its session");
}

/// SIGTERM while a read of handle 0 waits on an open, silent stdin:
/// passed on to the child, and airlock ends promptly with its status.
#[test]
fn sigterm_while_stdin_is_open_terminates_promptly() {
    let (rd, wr) = pipe();
    let script = r#"
out("ready")
print(call("read", h=0, max=100))
"#;
    let mut airlock = spawn(&[], script, Stdio::from(rd));
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(airlock.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "\"ready\"\n");
    std::thread::sleep(Duration::from_millis(200));
    let pid = rustix::process::Pid::from_raw(airlock.id() as i32).unwrap();
    let start = Instant::now();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = wait_within(&mut airlock, Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(128 + 15), "airlock did not end on SIGTERM");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    drop(wr);
}
