//! Confinement across levels and symlinks, with the real binary: each
//! attack of issue 7 (items 1–4) as real nested airlocks and real symlinks
//! set up by the test (outside the child), now refused, the target
//! untouched. The children reach files only through `"$AIRLOCK" fs`.

mod common;

use common::*;
use std::os::unix::fs::symlink;
use std::path::Path;

/// `sh` lines that try `fs CMD PATH` and print `PATH rc` (and any output).
fn attempt(cmd: &str, path: &str) -> String {
    format!(r#"echo pwned | "$AIRLOCK" fs {cmd} '{path}' 2>/dev/null; echo "{cmd} {path} $?"; "#)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Attack 1: a nested airlock with no roots: its relative names are its own
/// virtual files and never reach a host file at any level above.
#[test]
fn nested_level_without_roots_sees_only_its_own_virtual_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.txt"), "host").unwrap();
    let inner = format!(
        r#""$AIRLOCK" run -- sh -c '
echo virtual | "$AIRLOCK" fs write new.txt; echo "write new.txt $?"
"$AIRLOCK" fs cat new.txt
echo pwned | "$AIRLOCK" fs write host.txt; echo "write host.txt $?"
"$AIRLOCK" fs cat host.txt
"$AIRLOCK" fs cat {abs}/host.txt 2>&1 | grep -o E_PERM
'"#,
        abs = dir.path().display()
    );
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(&inner));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    // The inner level's own virtual files work; host.txt there is its own
    // virtual file too (written, then read back), and the absolute name is
    // outside the inner level's (empty) policy.
    assert_eq!(run.stdout(), "write new.txt 0\nvirtual\nwrite host.txt 0\npwned\nE_PERM\n");
    assert_eq!(read(&dir.path().join("host.txt")), "host");
    assert!(!dir.path().join("new.txt").exists(), "a nested virtual file reached the disk");
    // Nothing of it reached the top level.
    assert_eq!(run.report_u64("handles_opened"), 0, "{}", run.report);
    run.assert_no_leaks();
}

/// Attack 2: a nested `--allow-rw a/sub` cannot be left through a symlink inside
/// `a/sub` to `a/other`, though the top level allows all of `.`.
#[test]
fn nested_level_cannot_be_left_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir_all(a.join("sub")).unwrap();
    std::fs::create_dir_all(a.join("other")).unwrap();
    std::fs::write(a.join("other/secret.txt"), "secret").unwrap();
    symlink("../other", a.join("sub/up")).unwrap();
    symlink(a.join("other/secret.txt"), a.join("sub/abs")).unwrap();
    symlink("ok.txt", a.join("sub/in")).unwrap();
    let mut script =
        String::from(r#"echo fine | "$AIRLOCK" fs write a/sub/ok.txt; "$AIRLOCK" fs cat a/sub/in; "#);
    for (cmd, path) in [
        ("cat", "a/sub/up/secret.txt"),
        ("write", "a/sub/up/secret.txt"),
        ("append", "a/sub/abs"),
        ("write", "a/sub/up/new.txt"),
    ] {
        script.push_str(&attempt(cmd, path));
    }
    let inner = format!(r#""$AIRLOCK" run --allow-rw a/sub -- sh -c '{}'"#, script.replace('\'', r#"'\''"#));
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(&inner));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(
        run.stdout(),
        "fine\ncat a/sub/up/secret.txt 1\nwrite a/sub/up/secret.txt 1\nappend a/sub/abs 1\nwrite a/sub/up/new.txt 1\n"
    );
    assert_eq!(read(&a.join("other/secret.txt")), "secret");
    assert!(!a.join("other/new.txt").exists());
    assert_eq!(run.report["errors_by_code"]["E_PERM"], 4, "{}", run.report);
    run.assert_no_leaks();
}

/// Attack 3: a single-file root that is a symlink to a sibling does not open the
/// sibling, directly or under a nested level.
#[test]
fn single_file_root_that_is_a_symlink_leads_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("secret.txt"), "secret").unwrap();
    symlink("secret.txt", d.join("out.txt")).unwrap();
    for args in [&["--allow", "d/out.txt"][..], &["--allow-rw", "d/out.txt"]] {
        let script =
            attempt("cat", "d/out.txt") + &attempt("write", "d/out.txt") + &attempt("append", "d/out.txt");
        let run = run_in(dir.path(), args, &sh(&script));
        assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
        assert_eq!(run.stdout(), "cat d/out.txt 1\nwrite d/out.txt 1\nappend d/out.txt 1\n", "{args:?}");
        assert_eq!(run.report["errors_by_code"]["E_PERM"], 3, "{args:?}: {}", run.report);
        run.assert_no_leaks();
    }
    // Under a nested level, whose top allows the whole directory.
    let inner = format!(
        r#""$AIRLOCK" run --allow-rw d/out.txt -- sh -c '{}'"#,
        attempt("cat", "d/out.txt").replace('\'', r#"'\''"#)
    );
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(&inner));
    assert_eq!(run.stdout(), "cat d/out.txt 1\n", "stderr: {}", run.stderr());
    assert_eq!(read(&d.join("secret.txt")), "secret");
    assert!(std::fs::symlink_metadata(d.join("out.txt")).unwrap().file_type().is_symlink());
    // A plain file root still works.
    std::fs::remove_file(d.join("out.txt")).unwrap();
    let run =
        run_in(dir.path(), &["--allow-rw", "d/out.txt"], &sh(r#"echo ok | "$AIRLOCK" fs write d/out.txt"#));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(read(&d.join("out.txt")), "ok\n");
}

/// Attack 4: read-only is decided on the resolved file: `d/rolink -> ro` does not
/// make `d/ro/keep.txt` writable, nor let a file be created in `d/ro`.
#[test]
fn read_only_holds_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir_all(d.join("ro")).unwrap();
    std::fs::write(d.join("ro/keep.txt"), "keep").unwrap();
    symlink("ro", d.join("rolink")).unwrap();
    symlink(d.join("ro/keep.txt"), d.join("abs-keep")).unwrap();
    let script = [
        attempt("write", "d/rolink/keep.txt"),
        attempt("append", "d/rolink/keep.txt"),
        attempt("write", "d/abs-keep"),
        attempt("write", "d/rolink/new.txt"),
        r#""$AIRLOCK" fs cat d/rolink/keep.txt; echo; "#.into(),
    ]
    .concat();
    let run = run_in(dir.path(), &["--allow-rw", "d", "--allow", "d/ro"], &sh(&script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert_eq!(
        run.stdout(),
        "write d/rolink/keep.txt 1\nappend d/rolink/keep.txt 1\nwrite d/abs-keep 1\nwrite d/rolink/new.txt 1\nkeep\n"
    );
    assert_eq!(run.report["errors_by_code"]["E_PERM"], 4, "{}", run.report);
    assert_eq!(read(&d.join("ro/keep.txt")), "keep");
    assert!(!d.join("ro/new.txt").exists());
    run.assert_no_leaks();
}

/// A process outside airlock swaps a name between a regular file and a
/// symlink into the read-only directory as fast as it can while the child
/// writes to it: every write lands on the regular file or is refused, and
/// the read-only file never changes.
#[test]
fn swapping_a_symlink_during_writes_never_reaches_the_read_only_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir_all(d.join("ro")).unwrap();
    std::fs::write(d.join("ro/keep.txt"), "keep").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let (name, tmp_link, tmp_file) = (d.join("swap"), d.join(".l"), d.join(".f"));
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = symlink("ro/keep.txt", &tmp_link);
                let _ = std::fs::rename(&tmp_link, &name);
                let _ = std::fs::write(&tmp_file, "plain");
                let _ = std::fs::rename(&tmp_file, &name);
                swaps += 1;
            }
            swaps
        })
    };
    let script = r#"i=0; while [ $i -lt 200 ]; do echo pwned | "$AIRLOCK" fs write d/swap 2>/dev/null; i=$((i+1)); done"#;
    let run = run_in(dir.path(), &["--allow-rw", "d", "--allow", "d/ro"], &sh(script));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    assert!(swaps > 10, "only {swaps} swaps");
    assert_eq!(read(&d.join("ro/keep.txt")), "keep");
    run.assert_no_leaks();
}

/// A nested airlock narrows a connection of its own (attached), so the
/// processes that share its descriptor keep what they had.
#[test]
fn a_nested_level_narrows_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("other.txt"), "other").unwrap();
    let script = r#""$AIRLOCK" run --allow sub -- sh -c '"$AIRLOCK" fs cat other.txt 2>/dev/null; echo "inner $?"'
"$AIRLOCK" fs cat other.txt; echo; echo "outer $?""#;
    let run = run_in(dir.path(), &["--allow-rw", "."], &sh(script));
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    // Inside, other.txt is a virtual name of the nested level (absent).
    assert_eq!(run.stdout(), "inner 1\nother\nouter 0\n");
    run.assert_no_leaks();
}

/// An upstream that does not know `narrow` (here a minimal server that
/// answers `attach` and refuses every other op) gets nothing forwarded.
#[test]
fn an_upstream_that_cannot_narrow_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.txt"), "f").unwrap();
    let server = r#"
import os, socket, struct, json, sys
srv = socket.socket(fileno=3)
def frames(s):
    buf = b""
    while True:
        while len(buf) >= 4 and len(buf) - 4 >= struct.unpack(">I", buf[:4])[0]:
            n = struct.unpack(">I", buf[:4])[0]
            yield json.loads(buf[4:4 + n]); buf = buf[4 + n:]
        d = s.recv(65536)
        if not d: return
        buf += d
def send(s, obj):
    p = json.dumps(obj).encode(); s.sendall(struct.pack(">I", len(p)) + p)
msg, fds, _, _ = socket.recv_fds(srv, 65536, 4)
conn = socket.socket(fileno=fds[0])
req = json.loads(msg[4:])
send(conn, {"id": req["id"], "ok": True})
for r in frames(conn):
    print(r["op"], flush=True, file=sys.stderr)
    send(conn, {"id": r["id"], "ok": False, "error": {"code": "E_UNSUPPORTED", "message": "unknown op"}})
"#;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    use std::os::fd::AsRawFd;
    let theirs_fd = theirs.as_raw_fd();
    let mut srv = std::process::Command::new("python3");
    srv.arg("-c").arg(server).stderr(std::process::Stdio::piped());
    // SAFETY: dup2 in the forked child before exec, async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        srv.pre_exec(move || {
            if libc_dup2(theirs_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let srv = srv.spawn().unwrap();
    drop(theirs);
    let ours_fd = ours.as_raw_fd();
    let mut nested = std::process::Command::new(airlock());
    nested
        .current_dir(dir.path())
        .args(["run", "--allow-rw", ".", "--", "sh", "-c", r#""$AIRLOCK" fs cat f.txt; echo "rc $?""#])
        .env("AIRLOCK_FD", "3");
    // SAFETY: dup2 in the forked child before exec, async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        nested.pre_exec(move || {
            if libc_dup2(ours_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = nested.output().unwrap();
    drop(ours);
    let srv = srv.wait_with_output().unwrap();
    let seen = String::from_utf8_lossy(&srv.stderr).into_owned();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rc 1\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot narrow"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(seen.trim(), "narrow", "the upstream saw more than the narrow: {seen}");
}

/// dup2 that leaves `to` open across exec (onto itself: clears CLOEXEC).
fn libc_dup2(from: i32, to: i32) -> i32 {
    // SAFETY: both are plain descriptor numbers; dup2 and fcntl have no
    // memory effects, and `to` is never closed here.
    unsafe {
        if from == to {
            let fd = std::os::fd::BorrowedFd::borrow_raw(from);
            return match rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()) {
                Ok(()) => 0,
                Err(_) => -1,
            };
        }
        let mut target =
            std::mem::ManuallyDrop::new(<std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(to));
        match rustix::io::dup2(std::os::fd::BorrowedFd::borrow_raw(from), &mut target) {
            Ok(()) => 0,
            Err(_) => -1,
        }
    }
}
