//! The session socket is a socket, nothing more (issue 39). The child
//! cannot write into the socket's directory (nothing past the private
//! `/tmp`'s bound lands on the host's disk), cannot plant a setuid file
//! there or anywhere it may write (every call that takes a mode refuses
//! the setuid and setgid bits), its writable binds are `nosuid,nodev` and
//! the socket's bind `ro,nosuid,nodev`; the directory goes at the end
//! even when the child changed its modes, and a SIGKILLed airlock's
//! directory goes when the user's next airlock starts. Both modes, as
//! root and as uid 65534.

mod common;
mod confine_common;
mod confine_who;

use confine_common::Mode;
use confine_who::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// The base the socket's directory lives in for these runs: `$TMPDIR`,
/// one per fixture (the plain environment has no `$XDG_RUNTIME_DIR`), so
/// the sweep of another test's airlock cannot remove what this one
/// watches.
fn base(f: &Fixture) -> PathBuf {
    let b = f.root.join("tmp");
    if !b.exists() {
        std::fs::create_dir(&b).unwrap();
        chmod(&b, 0o1777);
    }
    b
}

/// airlock's socket directories in `base` for the airlock process `pid`.
fn dirs_of(base: &Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("airlock-{pid}.");
    std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        // Beside them, a session's placeholder ledger is a file.
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Every file beneath `dir` (not following links), with its mode.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path(), m.mode()));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out
}

struct Held {
    airlock: Child,
    lines: Vec<String>,
    rest: BufReader<std::process::ChildStdout>,
    rw: PathBuf,
    report: PathBuf,
}

/// Start the attack and read until it holds. The process is waited for
/// by [`Held::release`], or killed and waited for by the caller.
#[allow(clippy::zombie_processes)]
fn start(f: &Fixture, mode: Mode) -> Held {
    let rw = f.root.join(format!("rw-{}", confine_common::unique()));
    std::fs::create_dir(&rw).unwrap();
    chown(&rw, who_ids(f));
    std::fs::write(f.project.join("data.txt"), "through the socket\n").unwrap();
    let report = f.report_path();
    let rw_s = rw.display().to_string();
    let args = ["--allow", "data.txt", "--sandbox-rw", &rw_s, "--sandbox-ro", "/proc"];
    let cmd = f.attack("socket_dir.py", std::slice::from_ref(&rw_s));
    let mut airlock = f
        .run_command(mode, &args, &report, &cmd)
        .env("TMPDIR", base(f))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rest = BufReader::new(airlock.stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if rest.read_line(&mut line).unwrap() == 0 {
            let _ = airlock.kill();
            let _ = airlock.wait();
            panic!("{mode:?}: the attack ended before holding: {lines:?}");
        }
        let held = line.contains(r#"["hold""#);
        lines.push(line);
        if held {
            return Held { airlock, lines, rest, rw, report };
        }
    }
}

fn who_ids(f: &Fixture) -> (u32, u32) {
    f.who.ids()
}

impl Held {
    fn got(&self) -> BTreeMap<String, String> {
        outcomes(&self.lines.concat())
    }

    fn release(mut self) -> (std::process::ExitStatus, String) {
        std::fs::write(self.rw.join("release"), "").unwrap();
        let mut tail = String::new();
        self.rest.read_to_string(&mut tail).unwrap();
        let st = self.airlock.wait().unwrap();
        (st, self.lines.concat() + &tail)
    }
}

/// While the session runs: its directory holds the socket alone, nothing
/// setuid lies in it or in the writable directory, and every attempt that
/// could put data or a mode there failed (but chmod of the directory
/// itself in the fallback, which Landlock does not govern: it must not
/// keep the directory on disk). After a normal exit the directory is gone.
#[test]
fn the_socket_dir_holds_the_socket_alone_and_goes_at_the_end() {
    for (mode, who) in cases() {
        let ctx = format!("{mode:?} as {who:?}");
        let f = Fixture::new(who);
        let held = start(&f, mode);
        let pid = held.airlock.id();
        let got = held.got();
        let dirs = dirs_of(&base(&f), pid);
        assert_eq!(dirs.len(), 1, "{ctx}: {dirs:?}");
        let dir = &dirs[0];
        let inside: Vec<_> = modes(dir).into_iter().map(|(p, _)| p).collect();
        assert_eq!(inside, vec![dir.join("session")], "{ctx}: the socket's directory holds more: {got:?}");
        for label in
            ["write in the socket dir", "0500 subdir in the socket dir", "setuid id in the socket dir"]
        {
            assert_ne!(outcome(&got, label), "ok", "{ctx}: {label}: {got:?}");
        }
        if mode == Mode::Namespaces {
            for label in ["chmod the socket", "chmod the socket dir"] {
                assert_ne!(outcome(&got, label), "ok", "{ctx}: {label}: {got:?}");
            }
        }
        for name in ["setuid", "setgid"] {
            for call in ["chmod", "fchmod", "chmod(2)", "fchmodat2", "open O_CREAT", "mknod", "O_TMPFILE"] {
                let label = format!("{name} {call}");
                assert_ne!(outcome(&got, &label), "ok", "{ctx}: {label}: {got:?}");
            }
        }
        let setid: Vec<_> = modes(&held.rw).into_iter().filter(|(_, m)| m & 0o6000 != 0).collect();
        assert!(setid.is_empty(), "{ctx}: setuid/setgid files where the child writes: {setid:?}");
        if mode == Mode::Namespaces {
            assert_eq!(
                outcome(&got, "session through the socket"),
                "ok",
                "{ctx}: the read-only socket does not serve: {got:?}"
            );
            let line = held.lines.iter().find(|l| l.contains("mount options")).unwrap();
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let (rw_opts, sock_opts) = v[2].as_str().unwrap().split_once('|').unwrap();
            for (what, opts, want) in [
                ("--sandbox-rw", rw_opts, &["rw", "nosuid", "nodev"]),
                ("socket", sock_opts, &["ro", "nosuid", "nodev"]),
            ] {
                let have: Vec<&str> = opts.split(',').collect();
                for w in want {
                    assert!(have.contains(w), "{ctx}: the {what} bind is {opts}, not {w}");
                }
            }
        }
        let report = held.report.clone();
        let (st, text) = held.release();
        assert_eq!(st.code(), Some(0), "{ctx}: {text}");
        assert_eq!(outcome(&outcomes(&text), "done"), "ok", "{ctx}: {text}");
        assert!(!dir.exists(), "{ctx}: {} stays after a normal exit: {:?}", dir.display(), modes(dir));
        let r = read_report(&report, &ctx, &text);
        assert_eq!(r["sandbox"]["seccomp"], true, "{ctx}: {r}");
    }
}

/// A SIGKILLed airlock leaves its directory (modes changed by the child
/// in the fallback); the user's next airlock removes it, leaves a live
/// session's alone, and leaves another user's alone.
#[test]
fn a_killed_sessions_dir_goes_when_the_next_airlock_starts() {
    for (mode, who) in cases() {
        let ctx = format!("{mode:?} as {who:?}");
        let f = Fixture::new(who);
        let live = start(&f, mode);
        let killed = start(&f, mode);
        let mut killed_airlock = killed.airlock;
        let dead = dirs_of(&base(&f), killed_airlock.id());
        assert_eq!(dead.len(), 1, "{ctx}");
        killed_airlock.kill().unwrap();
        killed_airlock.wait().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(dead[0].exists(), "{ctx}: a SIGKILLed airlock's directory is gone by itself?");
        // Another user's leftover, of a pid that cannot run.
        let other = base(&f).join(format!("airlock-4194999.1-{:x}", confine_common::unique() + 0xc0de));
        std::fs::create_dir(&other).unwrap();
        chown(&other, if who == Who::Root { (NOBODY, NOBODY) } else { (0, 0) });
        chmod(&other, 0o700);

        let out = f
            .airlock(mode)
            .args(["run", "--", "true"])
            .env("TMPDIR", base(&f))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success(), "{ctx}: {}", String::from_utf8_lossy(&out.stderr));
        let gone = !dead[0].exists();
        let other_kept = other.exists();
        let live_kept = dirs_of(&base(&f), live.airlock.id()).len() == 1;
        let _ = std::fs::remove_dir(&other);
        let (st, text) = live.release();
        assert!(gone, "{ctx}: the killed session's {} stays: {:?}", dead[0].display(), modes(&dead[0]));
        assert!(other_kept, "{ctx}: another user's leftover was removed");
        assert!(live_kept, "{ctx}: a live session's directory was removed");
        assert_eq!(st.code(), Some(0), "{ctx}: {text}");
    }
}
