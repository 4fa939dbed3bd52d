//! Confinement in depth (issue 29) for an unprivileged user, and on a
//! kernel that refuses user namespaces. The attacks of
//! tests/confinement_attacks.rs that make sense without root are run by
//! the real binary as uid/gid 65534 (when the test process is root: CI and
//! here; otherwise as the caller, who is unprivileged already), with
//! namespaces and in the forced fallback. The binary and the attack
//! scripts are copied into a fresh directory that user can read and
//! execute, and the project directory is the user's own. The host side of
//! each attack (a segment, a key, a process of the same user, a listener,
//! a file the user owns) is set up and checked by the test, outside
//! airlock; where an attack's reach is not obvious, the same script run
//! unconfined by the same user shows it getting through. Last, the
//! kernel, not `AIRLOCK_NO_NAMESPACES`, refuses airlock namespaces: inside
//! a user namespace whose limit on one kind of namespace is 0, and under a
//! seccomp filter that lets them be created but refuses setting them up
//! (a mount, loopback), as Ubuntu 24.04's AppArmor default does.

mod common;
mod confine_common;

use common::*;
use confine_common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The unprivileged user a root test process drops to (`nobody`).
const NOBODY: u32 = 65534;
fn is_root() -> bool {
    // SAFETY: geteuid takes nothing.
    unsafe { libc::geteuid() == 0 }
}

/// The uid and gid airlock runs as: 65534 for a root test process, the
/// caller's own otherwise.
fn user() -> (u32, u32) {
    if is_root() {
        (NOBODY, NOBODY)
    } else {
        // SAFETY: getuid and getgid take nothing.
        unsafe { (libc::getuid(), libc::getgid()) }
    }
}

/// Run `cmd` as `who`: a root test process drops to it (std clears the
/// supplementary groups when root sets a uid); anyone else runs as
/// itself.
fn run_as(cmd: &mut Command, (uid, gid): (u32, u32)) -> &mut Command {
    // SAFETY: getuid takes nothing.
    if is_root() && uid != unsafe { libc::getuid() } {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

fn chown(p: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A fresh directory the user may read and execute, holding a copy of
/// the binary, a copy of the attack scripts, the user's own project
/// directory (working directory, home and reports) and `outside`, a
/// directory of the user's outside every root.
struct Fixture {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    attacks: PathBuf,
    project: PathBuf,
    outside: PathBuf,
    owner: (u32, u32),
}

impl Fixture {
    /// Owned by `user()`.
    fn new() -> Fixture {
        Fixture::owned_by(user())
    }

    fn owned_by(owner: (u32, u32)) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        chmod(&root, 0o755);
        let bin = root.join("bin/airlock");
        std::fs::create_dir(root.join("bin")).unwrap();
        chmod(&root.join("bin"), 0o755);
        std::fs::copy(airlock(), &bin).unwrap();
        chmod(&bin, 0o755);
        let attacks = root.join("attacks");
        std::fs::create_dir(&attacks).unwrap();
        chmod(&attacks, 0o755);
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks");
        for entry in std::fs::read_dir(source).unwrap().flatten() {
            let to = attacks.join(entry.file_name());
            std::fs::copy(entry.path(), &to).unwrap();
            chmod(&to, 0o644);
        }
        let (project, outside) = (root.join("project"), root.join("outside"));
        for d in [&project, &outside] {
            std::fs::create_dir(d).unwrap();
            chmod(d, 0o755);
            chown(d, owner);
        }
        Fixture { _tmp: tmp, bin, attacks, project, outside, owner }
    }

    /// `python3 attacks/SCRIPT ARGS…`
    fn attack(&self, script: &str, args: &[String]) -> Vec<String> {
        let mut v = vec!["python3".to_owned(), self.attacks.join(script).display().to_string()];
        v.extend(args.iter().cloned());
        v
    }

    /// A file of the owner's in the project.
    fn project_file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.project.join(name);
        std::fs::write(&p, content).unwrap();
        chown(&p, self.owner);
        p
    }

    /// A command in the project with a plain environment (the user's own
    /// home: the caller's may be unreadable to it).
    fn plain(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.current_dir(&self.project)
            .env_clear()
            .env("PATH", SYSTEM_PATH)
            .env("HOME", &self.project)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null());
        c
    }

    /// The copied airlock as the owner under `mode`, its pid in its
    /// children's environment as `AIRLOCK_HOST_PID` (a shell exports its
    /// own pid, then execs airlock), with `wrap` (a program and its
    /// arguments ending in a shell that execs `"$@"`) in front of that
    /// shell when given. The caller adds airlock's arguments.
    fn airlock(&self, mode: Mode, wrap: &[&str]) -> Command {
        let mut c = self.plain(wrap.first().copied().unwrap_or("sh"));
        c.args(wrap.iter().skip(1))
            .args(["-c", r#"AIRLOCK_HOST_PID=$$; export AIRLOCK_HOST_PID; exec "$@""#, "sh"])
            .arg(&self.bin);
        if mode == Mode::Fallback {
            c.env(NO_NAMESPACES, "1");
        }
        run_as(&mut c, self.owner);
        c
    }

    /// `airlock run --sandbox-ro ATTACKS ARGS --report REPORT -- CMD`.
    fn command(&self, mode: Mode, wrap: &[&str], args: &[&str], report: &Path, cmd: &[String]) -> Command {
        let mut c = self.airlock(mode, wrap);
        c.arg("run")
            .arg("--sandbox-ro")
            .arg(&self.attacks)
            .args(args)
            .arg("--report")
            .arg(report)
            .arg("--")
            .args(cmd);
        c
    }

    fn report_path(&self) -> PathBuf {
        self.project.join(format!("report-{}.json", unique()))
    }

    fn run(&self, mode: Mode, args: &[&str], cmd: &[String]) -> Run {
        self.run_wrapped(mode, &[], args, cmd)
    }

    fn run_wrapped(&self, mode: Mode, wrap: &[&str], args: &[&str], cmd: &[String]) -> Run {
        let report = self.report_path();
        let start = Instant::now();
        let output = self.command(mode, wrap, args, &report, cmd).output().expect("airlock runs");
        let elapsed = start.elapsed();
        let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
            panic!(
                "{mode:?}: no report ({e}); status {:?}; stdout: {}; stderr: {}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        });
        let report = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{mode:?}: an unfinished report ({e}): {}", String::from_utf8_lossy(&output.stderr))
        });
        Run { output, report, elapsed }
    }

    /// The attack script run by the user directly, unconfined: what it
    /// reaches without airlock.
    fn unconfined(&self, script: &str, args: &[String]) -> BTreeMap<String, String> {
        let argv = self.attack(script, args);
        let mut c = self.plain(&argv[0]);
        c.args(&argv[1..]);
        let out = run_as(&mut c, self.owner).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        parse_outcomes(&text, &String::from_utf8_lossy(&out.stderr))
    }
}

// ------------------------------------------------- outcomes and the report

fn parse_outcomes(stdout: &str, stderr: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| match l {
            Value::Array(v) if v.len() == 3 => Some((v[0].as_str()?.to_owned(), v[1].as_str()?.to_owned())),
            _ => None,
        })
        .inspect(|(label, o)| assert_ne!(o, "broken", "attack {label:?} is broken: {stdout}\n{stderr}"))
        .collect()
}

/// label → outcome ("ok" or the errno's name) of the attack's lines.
fn outcomes(run: &Run) -> BTreeMap<String, String> {
    parse_outcomes(&run.stdout(), &run.stderr())
}

/// Whether the attack on `label` got through; an attack that never tried
/// it fails the test.
fn got_through(got: &BTreeMap<String, String>, label: &str) -> bool {
    got.get(label).unwrap_or_else(|| panic!("the attack never tried {label:?}: {got:?}")) == "ok"
}

/// The attack failed, or the report lists one of `gaps` as not enforced;
/// with no `gaps` the attack must fail.
fn assert_refused_or_listed(run: &Run, attack_succeeded: bool, class: &str, gaps: &[&str]) {
    if !attack_succeeded {
        return;
    }
    let listed = not_enforced(run);
    assert!(
        gaps.iter().any(|g| listed.iter().any(|l| l == g)),
        "{class}: the attack got through and the report lists none of {gaps:?} as not enforced \
         (not_enforced: {listed:?})\nchild stdout: {}\nstderr: {}",
        run.stdout(),
        run.stderr()
    );
}

fn namespaces_in_force(run: &Run) -> Vec<String> {
    run.report["sandbox"]["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("report has no sandbox.namespaces: {}", run.report))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// The layers that need no namespace are applied, whoever runs airlock:
/// No namespace is in force and each is listed; the other layers are.
fn assert_fallback(run: &Run, ctx: &str) {
    assert!(namespaces_in_force(run).is_empty(), "{ctx}: namespaces reported in force: {}", run.report);
    let listed = not_enforced(run);
    for ns in NAMESPACES {
        assert!(listed.contains(&format!("ns_{ns}")), "{ctx}: ns_{ns} is not listed: {}", run.report);
    }
    assert_layers_without_namespaces(run, ctx);
}

/// Landlock confines the files, seccomp is installed, and the
/// capabilities are dropped (without failing for want of CAP_SETPCAP).
fn assert_layers_without_namespaces(run: &Run, ctx: &str) {
    let sandbox = &run.report["sandbox"];
    assert_eq!(sandbox["fs"], "confined", "{ctx}: Landlock is not in force: {sandbox}");
    assert!(sandbox["landlock_abi"].as_u64().unwrap_or(0) > 0, "{ctx}: no Landlock ABI: {sandbox}");
    assert_eq!(sandbox["seccomp"], Value::Bool(true), "{ctx}: seccomp is not in force: {sandbox}");
    assert_eq!(sandbox["capabilities"], "dropped", "{ctx}: capabilities are kept: {sandbox}");
}

/// With namespaces all six are in force for the unprivileged user (this
/// kernel allows them); in the fallback each one is listed; the other
/// layers are applied either way.
fn assert_mode(run: &Run, mode: Mode) {
    let in_force = namespaces_in_force(run);
    let listed = not_enforced(run);
    for ns in NAMESPACES {
        let on = in_force.iter().any(|n| n == ns);
        let gap = listed.contains(&format!("ns_{ns}"));
        assert!(on != gap, "{mode:?}: namespace {ns} must be either in force or listed: {}", run.report);
        match mode {
            Mode::Namespaces => assert!(on, "{mode:?}: namespace {ns} is not in force: {}", run.report),
            Mode::Fallback => assert!(gap, "{mode:?}: namespace {ns} is not listed: {}", run.report),
        }
    }
    assert_layers_without_namespaces(run, &format!("{mode:?}"));
}

// ------------------------------------------------------- host-side objects

/// A process of the user's holding a 0600 SysV segment and a key in its
/// user keyring (as a login tool caches a token), both with a secret.
/// Each line on its stdin asks for the segment's content; EOF removes
/// both and ends it.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: BufReader<std::process::ChildStdout>,
    shmid: i64,
}

const HOLDER: &str = r#"
import ctypes, json, sys
sys.path.insert(0, sys.argv[1])
from probe import SYSCALLS, check, libc
key, desc, secret = int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4].encode()
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0
KEY_SPEC_USER_KEYRING, KEYCTL_SETPERM, KEYCTL_INVALIDATE = -4, 5, 21
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
shmid = check(libc.shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0o600))
addr = libc.shmat(shmid, None, 0)
ctypes.memmove(addr, secret + b"\0", len(secret) + 1)
kid = check(libc.syscall(SYSCALLS["add_key"], b"user", desc, secret, ctypes.c_size_t(len(secret)), ctypes.c_long(KEY_SPEC_USER_KEYRING)))
# possessor: all; user: view, read, search.
check(libc.syscall(SYSCALLS["keyctl"], ctypes.c_long(KEYCTL_SETPERM), ctypes.c_long(kid), ctypes.c_long(0x3f0b0000)))
print(json.dumps({"shmid": shmid}), flush=True)
for _ in sys.stdin:
    print(json.dumps({"content": ctypes.string_at(addr, 256).split(b"\0")[0].decode(errors="replace")}), flush=True)
libc.shmctl(shmid, IPC_RMID, None)
libc.syscall(SYSCALLS["keyctl"], ctypes.c_long(KEYCTL_INVALIDATE), ctypes.c_long(kid))
"#;

impl Holder {
    fn start(f: &Fixture, key: i32, desc: &str, secret: &str) -> Holder {
        let mut c = f.plain("python3");
        c.args(["-c", HOLDER])
            .env("HOLDER_SECRET", secret)
            .arg(&f.attacks)
            .args([key.to_string(), desc.to_owned(), secret.to_owned()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = run_as(&mut c, f.owner).spawn().unwrap();
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the holder did not start ({e}): {line:?}"));
        let shmid = v["shmid"].as_i64().unwrap_or_else(|| panic!("no shmid: {v}"));
        Holder { child, stdin, lines, shmid }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn content(&mut self) -> String {
        let stdin = self.stdin.as_mut().expect("the holder's stdin");
        stdin.write_all(b"content\n").unwrap();
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("holder ({e}): {line:?}"));
        v["content"].as_str().unwrap_or_default().to_owned()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + GONE_WITHIN;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // SAFETY: IPC_RMID takes no buffer; the segment was the holder's.
        unsafe { libc::shmctl(self.shmid as i32, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

/// A process's limits, nice value and affinity, as /proc shows them.
fn process_state(pid: u32) -> (String, String, String) {
    let field = |file: &str, key: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
        text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in {file}")).to_owned()
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let nice = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(16).unwrap().to_owned();
    (field("limits", "Max open files"), nice, field("status", "Cpus_allowed_list"))
}

/// A file of the owner's in `outside` with a `user.keep` attribute.
fn host_file_with_xattr(f: &Fixture) -> PathBuf {
    let file = f.outside.join(format!("host-{}.txt", unique()));
    std::fs::write(&file, "host").unwrap();
    chown(&file, f.owner);
    let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the name and value outlive the call.
    let r = unsafe { libc::setxattr(c.as_ptr(), c"user.keep".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(r, 0, "setxattr on the host: {}", errno());
    file
}

fn xattr_args(file: &Path) -> Vec<String> {
    vec![
        file.parent().unwrap().display().to_string(),
        file.file_name().unwrap().to_string_lossy().into_owned(),
    ]
}

// ------------------------------------------------------------------ tests

/// The user's own secrets in other processes: a 0600 SysV segment and a
/// key in the user keyring, both held by another process of the same
/// user. Run by that user unconfined, the attacks read both; under
/// airlock the key is out of reach in both modes (seccomp), and so is
/// the segment (the IPC namespace; in the fallback, seccomp).
#[test]
fn the_same_users_shm_and_keyring_are_out_of_reach() {
    let f = Fixture::new();
    let key = 0x4155_0000 | ((std::process::id() as i32 & 0xfff) << 4);
    let desc = format!("airlock-unpriv-{}-{}", std::process::id(), unique());
    let secret = format!("same-user-secret-{}", unique());
    let mut holder = Holder::start(&f, key, &desc, &secret);
    let shm_args = [key.to_string(), holder.shmid.to_string()];
    for mode in MODES {
        let run = f.run(mode, &[], &f.attack("keyring.py", std::slice::from_ref(&desc)));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let leaked =
            got_through(&got, "search") || got_through(&got, "request_key") || run.stdout().contains(&secret);
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} keyring {got:?}"), &[]);
        assert_mode(&run, mode);

        let run = f.run(mode, &[], &f.attack("shm.py", &shm_args));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let content = holder.content();
        let leaked = ["list", "attach by key", "attach by id"].iter().any(|l| got_through(&got, l))
            || run.stdout().contains(&secret)
            || content != secret;
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} SysV shm {got:?} now {content:?}"), &[]);
        if mode == Mode::Fallback {
            assert_eq!(got.get("attach by key").map(String::as_str), Some("EPERM"), "{mode:?}: {got:?}");
        }
        assert_mode(&run, mode);
    }
    // The same scripts, run by the same user without airlock, reach both:
    // what airlock refused was within the user's reach.
    let got = f.unconfined("keyring.py", std::slice::from_ref(&desc));
    assert!(got_through(&got, "search"), "the key is out of the user's own reach: {got:?}");
    let got = f.unconfined("shm.py", &shm_args);
    assert!(got_through(&got, "attach by key"), "the segment is out of the user's own reach: {got:?}");
    assert_eq!(holder.content(), "pwned", "the unconfined attack did not overwrite the segment");
}

/// airlock itself and another process of the same user: `prlimit` of
/// airlock's RLIMIT_FSIZE to 0 fails and airlock writes its report; the
/// other process's limits, priority and affinity stay as they were. The
/// child still sets its own limits. Refused in both modes.
#[test]
fn airlock_and_another_process_of_the_same_user_are_out_of_reach() {
    let f = Fixture::new();
    let holder = Holder::start(&f, 0x4156_0000 | (std::process::id() as i32 & 0xffff), "airlock-procs", "x");
    for mode in MODES {
        let before = process_state(holder.pid());
        let run = f.run(mode, &[], &f.attack("procs.py", &[holder.pid().to_string()]));
        let after = process_state(holder.pid());
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        for label in [
            "prlimit airlock",
            "setpriority airlock",
            "prlimit parent",
            "prlimit other",
            "setpriority other",
            "affinity other",
        ] {
            assert_refused_or_listed(
                &run,
                got_through(&got, label),
                &format!("{mode:?} {label} {got:?}"),
                &[],
            );
        }
        assert_refused_or_listed(
            &run,
            before != after,
            &format!("{mode:?} the other process changed {before:?} → {after:?}"),
            &[],
        );
        assert!(got_through(&got, "prlimit self"), "{mode:?}: the child cannot set its own limits: {got:?}");
        assert_mode(&run, mode);
    }
}

/// Another process of the same user: its environment (`/proc/PID/environ`)
/// is unreadable and a signal does not reach it, in both modes (the PID
/// namespace hides it; without it, Landlock grants no `/proc` and scopes
/// signals), though the same commands run by the user without airlock
/// read the secret and signal it.
#[test]
fn another_process_of_the_same_user_is_neither_read_nor_signalled() {
    let f = Fixture::new();
    let secret = format!("environ-secret-{}", unique());
    let holder =
        Holder::start(&f, 0x4157_0000 | (std::process::id() as i32 & 0xffff), "airlock-environ", &secret);
    let script = format!(
        "tr '\\0' '\\n' < /proc/{pid}/environ; kill -CONT {pid} && echo signalled; echo finished",
        pid = holder.pid()
    );
    for mode in MODES {
        let run = f.run(mode, &[], &sh(&script));
        let out = run.stdout();
        assert!(out.contains("finished"), "{mode:?}: {out} {}", run.stderr());
        assert!(!out.contains(&secret), "{mode:?}: the child read another process's environment: {out}");
        assert!(!out.contains("signalled"), "{mode:?}: the child signalled another process: {out}");
        assert_mode(&run, mode);
    }
    let mut c = f.plain("sh");
    c.args(["-c", &script]);
    let out = run_as(&mut c, f.owner).output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.contains(&secret) && out.contains("signalled"), "out of the user's own reach: {out}");
}

/// The host's network: TCP and MPTCP connects to a host loopback
/// listener and UDP to a host socket. Nothing reaches the host in either
/// mode, or the report lists the class.
#[test]
fn the_hosts_network_is_out_of_reach_of_an_unprivileged_user() {
    let f = Fixture::new();
    for mode in MODES {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        let tcp_port = tcp.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        let _tcp = Background::start(move || {
            while tcp.accept().is_ok() {
                a.fetch_add(1, Ordering::Relaxed);
            }
        });
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_nonblocking(true).unwrap();
        let udp_port = udp.local_addr().unwrap().port();
        let free_port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let args = [
            tcp_port.to_string(),
            udp_port.to_string(),
            free_port.to_string(),
            f.project.join("no-such.sock").display().to_string(),
            format!("airlock-unpriv-abstract-{}-{}", std::process::id(), unique()),
            "no-marker".to_owned(),
        ];
        let run = f.run(mode, &[], &f.attack("net.py", &args));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let mut buf = [0u8; 64];
        let udp_got = udp.recv_from(&mut buf).is_ok();
        let ctx = |class: &str| format!("{mode:?} {class} {got:?}");
        let tcp_leaked = got_through(&got, "tcp connect");
        let mptcp_leaked = got_through(&got, "mptcp connect");
        assert_refused_or_listed(&run, tcp_leaked, &ctx("TCP connect"), &["tcp"]);
        assert_refused_or_listed(&run, mptcp_leaked, &ctx("MPTCP connect"), &["mptcp"]);
        // seccomp's own errno, in both modes: any other would show the
        // rule is not what stopped it.
        for label in ["mptcp connect", "mptcp listen"] {
            assert_eq!(got.get(label).map(String::as_str), Some("EACCES"), "{}", ctx(label));
        }
        assert_refused_or_listed(
            &run,
            accepted.load(Ordering::Relaxed) > 0,
            &ctx("a host listener accepted"),
            &["tcp", "mptcp"],
        );
        assert_refused_or_listed(&run, udp_got, &ctx("UDP send"), &["udp"]);
        assert_mode(&run, mode);
    }
}

/// Metadata of a file the user owns outside every root: `setxattr` and
/// `removexattr` of `user.*` fail and the attributes stay as they were
/// (seccomp, both modes), though the same script run by the user without
/// airlock changes them.
#[test]
fn xattrs_of_the_users_own_file_outside_every_root_stay_unchanged() {
    let f = Fixture::new();
    let file = host_file_with_xattr(&f);
    let before = xattrs(&file);
    for mode in MODES {
        let run = f.run(mode, &[], &f.attack("xattr.py", &xattr_args(&file)));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let leaked =
            got_through(&got, "setxattr") || got_through(&got, "removexattr") || xattrs(&file) != before;
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} xattr {got:?}"), &[]);
        assert_mode(&run, mode);
    }
    let got = f.unconfined("xattr.py", &xattr_args(&file));
    assert!(got_through(&got, "setxattr"), "the user cannot set its own file's attributes: {got:?}");
    assert_ne!(xattrs(&file), before, "the unconfined attack changed nothing");
}

/// Lifetime: a double-forked `setsid` daemon is gone soon after its
/// session ends, and a child that clears its parent-death signal is gone
/// soon after airlock is SIGKILLed. With namespaces the PID namespace
/// ends them. In the fallback the subreaper stage kills the daemon when
/// the payload ends; a SIGKILL of airlock defeats the stage, so there the
/// child may outlive it only where the report lists `ns_pid`.
#[test]
fn an_unprivileged_users_daemons_do_not_outlive_airlock() {
    let f = Fixture::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        let marker = format!("aud{}x{i}", std::process::id() % 100_000);
        let run = f.run(mode, &[], &f.attack("lifetime.py", &["daemon".into(), marker.clone()]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        assert!(got_through(&outcomes(&run), "daemon started"), "{mode:?}: {}", run.stdout());
        // The daemon sleeps 30 s: a session that lasted that long waited
        // it out instead of ending it.
        assert!(run.elapsed < Duration::from_secs(15), "{mode:?}: the session lasted {:?}", run.elapsed);
        assert_refused_or_listed(
            &run,
            outlives(&marker),
            &format!("{mode:?}: a setsid daemon outlived it"),
            &[],
        );
        assert_mode(&run, mode);

        let marker = format!("aup{}x{i}", std::process::id() % 100_000);
        let report = f.report_path();
        let mut airlock = f
            .command(mode, &[], &[], &report, &f.attack("lifetime.py", &["pdeathsig".into(), marker.clone()]))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(airlock.stdout.take().unwrap()).read_line(&mut line).unwrap();
        if !line.contains("ready") {
            let _ = airlock.kill();
            let mut err = String::new();
            let _ = airlock.stderr.take().unwrap().read_to_string(&mut err);
            panic!("{mode:?}: the child never got ready: {line:?} {err}");
        }
        airlock.kill().unwrap();
        airlock.wait().unwrap();
        let leaked = outlives(&marker);
        let run = f.run(mode, &[], &sh("true"));
        assert_refused_or_listed(
            &run,
            leaked,
            &format!("{mode:?}: the child outlived a SIGKILLed airlock"),
            &["ns_pid"],
        );
        assert_mode(&run, mode);
    }
}

/// Ordinary programs keep working for an unprivileged user: an `sh`
/// pipeline, a scratch file in /tmp, python3's `subprocess` and
/// `multiprocessing.Pool`, git, a nested `airlock run` and `"$AIRLOCK" fs
/// cat`; in the fallback what needs the private /tmp and /dev/shm must
/// fail (Landlock grants neither of the host's) and the report lists
/// `ns_mount`. The child runs as the user, and holds no
/// capability: effective, permitted, inheritable and ambient sets empty,
/// `no_new_privs` set; with namespaces the bounding set is empty too.
#[test]
fn ordinary_programs_keep_working_for_an_unprivileged_user() {
    let f = Fixture::new();
    f.project_file("data.txt", "data");
    let script = format!("id -u; id -g; exec sh {}", f.attacks.join("works.sh").display());
    let needs_private_tmp = ["tmp", "multiprocessing", "git"];
    let (uid, gid) = user();
    for mode in MODES {
        let run = f.run(mode, &["--allow", "."], &sh(&script));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let out = run.stdout();
        let ids: Vec<&str> = out.lines().take(2).collect();
        assert_eq!(ids, [uid.to_string(), gid.to_string()], "{mode:?}: the child's ids: {out}");
        let checks: Vec<(&str, &str)> = out.lines().skip(2).filter_map(|l| l.split_once(' ')).collect();
        assert_eq!(checks.len(), 7, "{mode:?}: {out}\n{}", run.stderr());
        for (name, result) in checks {
            let host_tmp = mode == Mode::Fallback && needs_private_tmp.contains(&name);
            let want = if host_tmp { "FAILED" } else { "ok" };
            assert_eq!(result, want, "{mode:?}: {name}\n{out}\n{}", run.stderr());
        }
        if mode == Mode::Fallback {
            assert!(not_enforced(&run).iter().any(|g| g == "ns_mount"), "{:?}", not_enforced(&run));
        }
        assert_mode(&run, mode);

        let run = f.run(mode, &[], &f.attack("caps.py", &[format!("unpriv{}", unique())]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let mut want = vec![("effective", "0"), ("permitted", "0"), ("inheritable", "0"), ("ambient", "0")];
        want.push(("no_new_privs", "1"));
        if mode == Mode::Namespaces {
            want.push(("bounding", "0"));
        }
        for (field, value) in want {
            let got_value = got.get(field).unwrap_or_else(|| panic!("{mode:?}: no {field}: {got:?}"));
            let v = got_value.trim_start_matches('0');
            assert_eq!(if v.is_empty() { "0" } else { v }, value, "{mode:?}: capabilities {field}: {got:?}");
        }
        for label in ["dmesg", "sethostname", "setdomainname"] {
            assert_refused_or_listed(
                &run,
                got_through(&got, label),
                &format!("{mode:?} {label} {got:?}"),
                &[],
            );
        }
        assert_mode(&run, mode);
    }
}

// ------------------------------------- a kernel that refuses namespaces

/// Who runs airlock where the kernel refuses namespaces: the test
/// process's own user (root here, as in CI) and, when that is root, 65534
/// as well.
fn whos() -> Vec<(u32, u32)> {
    // SAFETY: getuid and getgid take nothing.
    let me = unsafe { (libc::getuid(), libc::getgid()) };
    if is_root() {
        vec![me, (NOBODY, NOBODY)]
    } else {
        vec![me]
    }
}

/// Each namespace's per-user-namespace limit in `/proc/sys/user/`, and
/// `unshare`'s flag for a nested one.
const NS_LIMITS: [(&str, &str, &str); 6] = [
    ("user", "max_user_namespaces", "--user"),
    ("pid", "max_pid_namespaces", "--pid"),
    ("ipc", "max_ipc_namespaces", "--ipc"),
    ("net", "max_net_namespaces", "--net"),
    ("uts", "max_uts_namespaces", "--uts"),
    ("mount", "max_mnt_namespaces", "--mount"),
];

/// In front of airlock's shell: a user namespace mapping only the
/// caller's own ids, whose limit on `ns` namespaces is set to 0 from
/// inside (the limits are per user namespace and bind its descendants;
/// its creator holds CAP_SYS_RESOURCE there, which `--keep-caps` keeps for
/// an unprivileged creator's shell). A control then tries to create a
/// nested namespace of that kind (in a nested user namespace) and stops
/// the run if the kernel allows it; the capabilities `--keep-caps` passed
/// on are dropped again (setpriv), and airlock's shell runs.
fn refusing(ns: &str) -> Vec<String> {
    let (_, limit, flag) = NS_LIMITS.iter().find(|(n, _, _)| *n == ns).expect("a namespace");
    let nested = if *flag == "--user" { "--user".to_owned() } else { format!("--user {flag}") };
    let script = format!(
        r#"echo 0 > /proc/sys/user/{limit} || exit 97
if why=$(unshare {nested} true 2>&1); then echo "control: a nested {ns} namespace was allowed" >&2; exit 98; fi
echo "control: nested {ns} namespace refused: $why" >&2
exec setpriv --inh-caps=-all --ambient-caps=-all -- "$@""#
    );
    ["unshare", "--user", "--map-current-user", "--keep-caps", "sh", "-c", &script, "sh", "sh"]
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn borrowed(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn assert_control_refused(stderr: &str) {
    assert!(
        stderr.contains("control: nested ")
            && stderr.contains(" namespace refused: ")
            && stderr.contains("No space left on device"),
        "the kernel did not refuse a nested namespace as set up: {stderr}"
    );
}

/// airlock where the kernel itself refuses user namespaces (no
/// `AIRLOCK_NO_NAMESPACES`): it starts, the child runs as the caller, the
/// report lists every namespace as not enforced and says Landlock,
/// seccomp and the dropped capabilities are in force, and the fallback's
/// attacks are still refused: an `xattr` write on the user's own file
/// outside every root; `prlimit` of airlock, `prlimit`, `setpriority` and
/// affinity of another process of the same user; capabilities (a root
/// caller's child loses its bounding set too).
#[test]
fn a_kernel_that_refuses_user_namespaces_gets_the_fallback_and_says_so() {
    for who in whos() {
        let f = Fixture::owned_by(who);
        let ctx = format!("uid {}", who.0);
        let file = host_file_with_xattr(&f);
        let before = xattrs(&file);
        let mut other = f.plain("sleep");
        other.arg("30");
        let mut other = run_as(&mut other, who).spawn().unwrap();
        let other_before = process_state(other.id());
        let script = format!(
            "id -u; python3 {xattr} {args}; python3 {procs} {pid}; python3 {caps} refused{n}",
            xattr = f.attacks.join("xattr.py").display(),
            args = xattr_args(&file).join(" "),
            procs = f.attacks.join("procs.py").display(),
            pid = other.id(),
            caps = f.attacks.join("caps.py").display(),
            n = unique(),
        );
        let run = f.run_wrapped(Mode::Namespaces, &borrowed(&refusing("user")), &[], &sh(&script));
        let other_after = process_state(other.id());
        let _ = other.kill();
        let _ = other.wait();
        assert_control_refused(&run.stderr());
        assert_eq!(run.code(), Some(0), "{ctx}: {}", run.stderr());
        assert_eq!(run.stdout().lines().next(), Some(who.0.to_string().as_str()), "{ctx}: {}", run.stdout());

        assert_fallback(&run, &ctx);

        let got = outcomes(&run);
        let leaked =
            got_through(&got, "setxattr") || got_through(&got, "removexattr") || xattrs(&file) != before;
        assert_refused_or_listed(&run, leaked, &format!("{ctx} xattr {got:?}"), &[]);
        for label in
            ["prlimit airlock", "setpriority airlock", "prlimit other", "setpriority other", "affinity other"]
        {
            assert_refused_or_listed(&run, got_through(&got, label), &format!("{ctx} {label} {got:?}"), &[]);
        }
        assert_eq!(other_before, other_after, "{ctx}: the other process changed");
        let mut want = vec!["effective", "permitted", "inheritable", "ambient"];
        if who.0 == 0 {
            want.push("bounding");
        }
        for field in want {
            let v = got.get(field).unwrap_or_else(|| panic!("{ctx}: no {field}: {got:?}"));
            assert!(v.chars().all(|c| c == '0'), "{ctx}: capabilities {field} {v}: {got:?}");
        }
        assert_eq!(got.get("no_new_privs").map(String::as_str), Some("1"), "{ctx}: {got:?}");
    }
}

/// With `--require-namespaces`, where the kernel refuses them, airlock
/// refuses to start: exit 125, a message naming the namespaces, and the
/// child never runs.
#[test]
fn require_namespaces_refuses_to_start_where_the_kernel_refuses_them() {
    for who in whos() {
        let f = Fixture::owned_by(who);
        let report = f.report_path();
        let out = f
            .command(
                Mode::Namespaces,
                &borrowed(&refusing("user")),
                &["--require-namespaces"],
                &report,
                &sh("echo child-ran"),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_control_refused(&stderr);
        assert_eq!(out.status.code(), Some(125), "uid {}: {stderr}", who.0);
        assert!(
            stderr.contains("namespaces are not available") && stderr.contains("--require-namespaces"),
            "uid {}: the refusal names neither the namespaces nor the flag: {stderr}",
            who.0
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("child-ran"), "uid {}: the child ran", who.0);
    }
}

/// The VFS tool (`airlock tool`) where the kernel refuses namespaces: it
/// starts, answers, and still reaches no file outside its view directly
/// (Landlock); with `--require-namespaces` it does not start.
#[test]
fn the_vfs_tool_runs_confined_where_the_kernel_refuses_namespaces() {
    for who in whos() {
        let f = Fixture::owned_by(who);
        let secret = f.outside.join("secret.txt");
        std::fs::write(&secret, "outside-secret\n").unwrap();
        let script = format!(
            r#"
import errno, json, sys
sys.stdin.readline()
try:
    got = "ok: " + open({secret:?}).read()
except OSError as e:
    got = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({{"jsonrpc": "2.0", "method": "result", "params": {{"content": got}}}}), flush=True)
"#,
            secret = secret.display().to_string()
        );
        let out = f
            .airlock(Mode::Namespaces, &borrowed(&refusing("user")))
            .args(["tool", "--", "python3", "-c", &script])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_control_refused(&stderr);
        let j: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("uid {}: not one JSON line ({e}): {stdout:?}\n{stderr}", who.0));
        let text =
            j["content"][0]["text"].as_str().unwrap_or_else(|| panic!("uid {}: no result: {j}", who.0));
        assert_eq!(text, "EACCES", "uid {}: the tool read a file outside its view: {j}", who.0);

        let out = f
            .airlock(Mode::Namespaces, &borrowed(&refusing("user")))
            .args(["tool", "--require-namespaces", "--", "python3", "-c", &script])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_control_refused(&stderr);
        assert!(!out.status.success(), "uid {}: the tool started without namespaces", who.0);
        assert!(
            stderr.contains("namespaces are not available"),
            "uid {}: the refusal does not name the namespaces: {stderr}",
            who.0
        );
    }
}

const TOKEN: &str = "unprivileged-test-token";

/// `toolexec serve` where the kernel refuses namespaces: its tool runs,
/// confined (a file outside its sandbox stays unread); with
/// `--require-namespaces` the tool does not start and the answer names
/// the namespaces.
#[test]
fn toolexec_tools_run_confined_where_the_kernel_refuses_namespaces() {
    for who in whos() {
        let f = Fixture::owned_by(who);
        let secret = f.outside.join("secret.txt");
        std::fs::write(&secret, "outside-secret\n").unwrap();
        let tool = f.project_file(
            "peek",
            &format!("#!/bin/sh\ncat {} 2>/dev/null && echo 'outside read'\necho done\n", secret.display()),
        );
        chmod(&tool, 0o755);
        f.project_file("token", &format!("{TOKEN}\n"));
        let peek = format!("peek={}", tool.display());
        for require in [false, true] {
            let ctx = format!("uid {} require {require}", who.0);
            let mut c = f.airlock(Mode::Namespaces, &borrowed(&refusing("user")));
            c.args(["toolexec", "serve", "--token-file", "token", "--tool", &peek])
                .args(if require { &["--require-namespaces"][..] } else { &[] })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut server = c.spawn().unwrap();
            let mut lines = BufReader::new(server.stdout.take().unwrap());
            let mut url = None;
            let mut line = String::new();
            while lines.read_line(&mut line).unwrap_or(0) > 0 {
                if let Some(u) = line.trim().strip_prefix("AIFO_TOOLEEXEC_URL=") {
                    url = Some(u.to_owned());
                    break;
                }
                line.clear();
            }
            let body = url.as_ref().map(|url| {
                let out = Command::new("curl")
                    .args(["-sS", "--max-time", "20", "-H"])
                    .arg(format!("Authorization: Bearer {TOKEN}"))
                    .args(["-H", "X-Aifo-Proto: 2", "--data-urlencode", "tool=peek", url])
                    .output()
                    .expect("curl is installed");
                String::from_utf8_lossy(&out.stdout).into_owned()
            });
            // SAFETY: kill(2) on the server this test started.
            unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
            let _ = server.wait();
            let mut stderr = String::new();
            let _ = server.stderr.take().unwrap().read_to_string(&mut stderr);
            assert_control_refused(&stderr);
            let body = body.unwrap_or_else(|| panic!("{ctx}: the server printed no URL: {stderr}"));
            assert!(!body.contains("outside"), "{ctx}: the tool read a file outside its sandbox: {body:?}");
            if require {
                assert!(!body.contains("done"), "{ctx}: the tool ran without namespaces: {body:?}");
                assert!(
                    body.contains("namespaces are not available")
                        || stderr.contains("namespaces are not available"),
                    "{ctx}: the refusal does not name the namespaces: {body:?} {stderr}"
                );
            } else {
                assert!(body.contains("done"), "{ctx}: the tool did not run: {body:?} {stderr}");
            }
        }
    }
}

/// A kernel that refuses any one kind of namespace (a limit of 0 for
/// user, PID, IPC, network, UTS or mount namespaces): airlock starts with
/// none, the child runs, and the report lists every namespace as not
/// enforced and the other layers as applied.
#[test]
fn a_kernel_that_refuses_any_one_namespace_gets_the_whole_fallback() {
    let f = Fixture::new();
    for (ns, _, _) in NS_LIMITS {
        let run = f.run_wrapped(Mode::Namespaces, &borrowed(&refusing(ns)), &[], &sh("echo child-ran"));
        assert_control_refused(&run.stderr());
        assert_eq!(run.code(), Some(0), "{ns}: {}", run.stderr());
        assert_eq!(run.stdout(), "child-ran\n", "{ns}: {}", run.stderr());
        assert_fallback(&run, ns);
    }
}

/// A wrapper that lets the kernel create namespaces but refuses what
/// setting them up needs, as Ubuntu 24.04's AppArmor default does (it
/// lets an unprivileged process create a user namespace, then denies it
/// every capability there): a seccomp filter refusing `mount` (argv[1]
/// `mount`) or the ioctl that brings an interface up (`loopback`) with
/// EPERM. A control in a forked child shows the namespaces are created
/// and that step refused, then the rest of argv is exec'd.
const SETUP_REFUSING: &str = r#"
import ctypes, os, platform, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
kind = sys.argv[1]
ARCH, MOUNT, IOCTL = {"x86_64": (0xc000003e, 165, 16), "aarch64": (0xc00000b7, 40, 29)}[platform.machine()]
SIOCSIFFLAGS, EPERM, ALLOW = 0x8914, 0x00050001, 0x7fff0000
LD, JEQ, RET = 0x20, 0x15, 0x06
def ins(code, jt, jf, k): return struct.pack("HBBI", code, jt, jf, k)
if kind == "mount":
    prog = [ins(LD, 0, 0, 4), ins(JEQ, 0, 3, ARCH), ins(LD, 0, 0, 0), ins(JEQ, 0, 1, MOUNT), ins(RET, 0, 0, EPERM), ins(RET, 0, 0, ALLOW)]
else:
    prog = [ins(LD, 0, 0, 4), ins(JEQ, 0, 5, ARCH), ins(LD, 0, 0, 0), ins(JEQ, 0, 3, IOCTL), ins(LD, 0, 0, 24), ins(JEQ, 0, 1, SIOCSIFFLAGS), ins(RET, 0, 0, EPERM), ins(RET, 0, 0, ALLOW)]
code = ctypes.create_string_buffer(b"".join(prog))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
p = Prog(len(prog), ctypes.cast(code, ctypes.c_void_p))
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(p), 0, 0):
    sys.exit("seccomp: " + os.strerror(ctypes.get_errno()))
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 0x40000000, 0x4000, 0x40000
pid = os.fork()
if pid == 0:
    if libc.unshare(CLONE_NEWUSER | (CLONE_NEWNS if kind == "mount" else CLONE_NEWNET)):
        os._exit(2)
    try:
        if kind == "mount":
            if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None):
                os._exit(1)
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            fcntl = __import__("fcntl")
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", 0x41))
    except OSError:
        os._exit(1)
    os._exit(0)
_, st = os.waitpid(pid, 0)
if os.waitstatus_to_exitcode(st) != 1:
    sys.exit("control: namespaces refused or %s allowed (%d)" % (kind, os.waitstatus_to_exitcode(st)))
print("control: namespaces created, %s refused" % kind, file=sys.stderr, flush=True)
os.execvp(sys.argv[2], sys.argv[2:])
"#;

/// A kernel that creates the namespaces but refuses setting them up (a
/// mount of the view, or bringing up loopback; Ubuntu 24.04's AppArmor
/// default refuses both to an unprivileged user): airlock starts without
/// namespaces, the child runs, the report lists every namespace and the
/// other layers as applied, and the fallback's attacks are refused. With
/// `--require-namespaces` airlock refuses to start, naming the step.
#[test]
fn a_kernel_that_refuses_setting_up_namespaces_gets_the_whole_fallback() {
    for who in whos() {
        let f = Fixture::owned_by(who);
        let file = host_file_with_xattr(&f);
        let before = xattrs(&file);
        for kind in ["mount", "loopback"] {
            let ctx = format!("uid {} {kind} refused", who.0);
            let wrap = ["python3", "-c", SETUP_REFUSING, kind, "sh"];
            let script = format!(
                "id -u; python3 {xattr} {args}",
                xattr = f.attacks.join("xattr.py").display(),
                args = xattr_args(&file).join(" "),
            );
            let run = f.run_wrapped(Mode::Namespaces, &wrap, &[], &sh(&script));
            let control = format!("control: namespaces created, {kind} refused");
            assert!(run.stderr().contains(&control), "{ctx}: the control did not hold: {}", run.stderr());
            assert_eq!(run.code(), Some(0), "{ctx}: {}", run.stderr());
            assert_eq!(
                run.stdout().lines().next(),
                Some(who.0.to_string().as_str()),
                "{ctx}: {}",
                run.stdout()
            );
            assert_fallback(&run, &ctx);
            let got = outcomes(&run);
            let leaked =
                got_through(&got, "setxattr") || got_through(&got, "removexattr") || xattrs(&file) != before;
            assert_refused_or_listed(&run, leaked, &format!("{ctx} xattr {got:?}"), &[]);

            let report = f.report_path();
            let out = f
                .command(Mode::Namespaces, &wrap, &["--require-namespaces"], &report, &sh("echo child-ran"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(&control), "{ctx}: the control did not hold: {stderr}");
            assert_eq!(out.status.code(), Some(125), "{ctx}: {stderr}");
            assert!(
                stderr.contains("--require-namespaces"),
                "{ctx}: the refusal does not name the flag: {stderr}"
            );
            assert!(!String::from_utf8_lossy(&out.stdout).contains("child-ran"), "{ctx}: the child ran");
        }
    }
}
