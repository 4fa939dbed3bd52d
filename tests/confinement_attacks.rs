//! Confinement in depth (issue 29), attacked by real children of the real
//! binary. Each class of the issue is a test that runs its attack twice:
//! with namespaces (the default here: this kernel allows unprivileged user
//! namespaces) and in the forced fallback (`AIRLOCK_NO_NAMESPACES=1` on
//! the airlock process). Each attack either fails inside, as the host side
//! observes it, or its class is listed under `sandbox.not_enforced` in the
//! report: never a silent pass. The attack scripts are in `tests/attacks/`;
//! the host side of each (a segment, a key, a listener, a process) is set
//! up and checked by the test itself, outside the child. The last test is
//! issue 31's: a rustup toolchain granted to `toolexec serve`.

mod common;
mod confine_common;

use common::*;
use confine_common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Mode {
    fn apply(self, cmd: &mut Command) {
        cmd.env_remove(NO_NAMESPACES);
        if self == Mode::Fallback {
            cmd.env(NO_NAMESPACES, "1");
        }
    }
}

fn attacks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks")
}

/// `python3 tests/attacks/SCRIPT ARGS…`
fn attack(script: &str, args: &[String]) -> Vec<String> {
    let mut v = vec!["python3".to_owned(), attacks().join(script).display().to_string()];
    v.extend(args.iter().cloned());
    v
}

/// `airlock run` as `run_in` starts it (the attack scripts readable
/// through `--sandbox-ro`), under `mode`. airlock's own pid is in the
/// child's environment as `AIRLOCK_HOST_PID`: a shell exports its own pid
/// and then execs airlock.
fn command(dir: &Path, mode: Mode, args: &[&str], report: &Path, cmd: &[String]) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", r#"AIRLOCK_HOST_PID=$$; export AIRLOCK_HOST_PID; exec "$@""#, "sh", airlock(), "run"])
        .arg("--sandbox-ro")
        .arg(attacks())
        .args(args)
        .arg("--report")
        .arg(report)
        .arg("--")
        .args(cmd)
        .current_dir(dir)
        .env_remove("AIRLOCK_FD")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PATH", SYSTEM_PATH)
        .stdin(Stdio::null());
    mode.apply(&mut c);
    c
}

fn run_mode(dir: &Path, mode: Mode, args: &[&str], cmd: &[String]) -> Run {
    let report = dir.join(format!("report-{}.json", unique()));
    let start = Instant::now();
    let output = command(dir, mode, args, &report, cmd).output().expect("airlock runs");
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
        panic!(
            "{mode:?}: airlock did not finish its report ({e}); status {:?}; stderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    });
    Run { output, report, elapsed }
}

/// label → (outcome, detail) from the attack's `[label, outcome, detail]`
/// lines. An attack whose lines are missing fails the test where its
/// label is looked up.
fn outcomes(run: &Run) -> BTreeMap<String, (String, String)> {
    run.lines()
        .into_iter()
        .filter_map(|l| match l {
            Value::Array(v) if v.len() == 3 => {
                Some((v[0].as_str()?.to_owned(), (v[1].as_str()?.to_owned(), v[2].as_str()?.to_owned())))
            }
            _ => None,
        })
        .collect()
}

fn outcome<'a>(got: &'a BTreeMap<String, (String, String)>, label: &str) -> &'a str {
    &got.get(label).unwrap_or_else(|| panic!("the attack never tried {label:?}: {got:?}")).0
}

fn got_through(got: &BTreeMap<String, (String, String)>, label: &str) -> bool {
    match outcome(got, label) {
        "ok" => true,
        "broken" => panic!("attack {label:?} is broken: {got:?}"),
        _ => false,
    }
}

/// The attack on `class` either failed, or the report lists one of `gaps`
/// (the layers whose absence lets it through) as not enforced. With no
/// `gaps`, the class is closed by a layer that is always in force, and the
/// attack must fail.
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

/// The report says which namespaces are in force and lists every other
/// one as not enforced; with namespaces (this kernel allows them) all six
/// are in force, and in the fallback the user namespace is not. seccomp
/// and the dropped capabilities are in force either way.
fn assert_mode(run: &Run, mode: Mode) {
    let sandbox = &run.report["sandbox"];
    let in_force: Vec<&str> = sandbox["namespaces"]
        .as_array()
        .unwrap_or_else(|| panic!("report has no sandbox.namespaces: {}", run.report))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let listed = not_enforced(run);
    for ns in NAMESPACES {
        let on = in_force.contains(&ns);
        let gap = listed.contains(&format!("ns_{ns}"));
        assert!(on != gap, "{mode:?}: namespace {ns} must be either in force or listed: {sandbox}");
        match mode {
            Mode::Namespaces => {
                assert!(on, "namespace {ns} is not in force on a kernel that allows it: {sandbox}")
            }
            Mode::Fallback if ns == "user" => {
                assert!(gap, "the fallback hides that it has no user namespace: {sandbox}")
            }
            Mode::Fallback => {}
        }
    }
    // The layers that need no namespace are in force in both modes.
    assert_eq!(sandbox["seccomp"], Value::Bool(true), "{mode:?}: seccomp is not in force: {sandbox}");
    assert_eq!(sandbox["capabilities"], "dropped", "{mode:?}: capabilities are kept: {sandbox}");
}

// ------------------------------------------------------- host-side objects

/// A SysV shared memory segment of the test process (0600), removed on drop.
struct Shm {
    id: i32,
}

impl Shm {
    fn create(key: i32, content: &str) -> Shm {
        // SAFETY: shmget takes plain integers.
        let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o600) };
        assert!(id >= 0, "shmget: {}", errno());
        let shm = Shm { id };
        shm.with(|p| {
            p.fill(0);
            p[..content.len()].copy_from_slice(content.as_bytes());
        });
        shm
    }

    fn with<T>(&self, f: impl FnOnce(&mut [u8]) -> T) -> T {
        // SAFETY: the segment is ours and 4096 bytes long; it stays attached
        // while the slice lives and is detached right after.
        unsafe {
            let p = libc::shmat(self.id, std::ptr::null(), 0);
            assert!(p as isize != -1, "shmat: {}", errno());
            let r = f(std::slice::from_raw_parts_mut(p.cast::<u8>(), 4096));
            libc::shmdt(p);
            r
        }
    }

    fn content(&self) -> String {
        self.with(|p| String::from_utf8_lossy(p.split(|b| *b == 0).next().unwrap_or_default()).into_owned())
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: IPC_RMID takes no buffer.
        unsafe { libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

const KEY_SPEC_USER_KEYRING: libc::c_long = -4;

/// A key in the user's keyring, readable by the user (as a token cached by
/// a login tool would be), invalidated on drop.
struct Key {
    id: libc::c_long,
}

impl Key {
    fn add(desc: &str, secret: &str) -> Key {
        let (ty, d) = (c"user", std::ffi::CString::new(desc).unwrap());
        // SAFETY: the strings and the payload outlive the call; the kernel copies them.
        let id = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                ty.as_ptr(),
                d.as_ptr(),
                secret.as_ptr(),
                secret.len(),
                KEY_SPEC_USER_KEYRING,
            )
        };
        assert!(id >= 0, "add_key: {}", errno());
        // possessor: all; user: view, read, search.
        // SAFETY: KEYCTL_SETPERM takes integers.
        let r = unsafe { libc::syscall(libc::SYS_keyctl, 5, id, 0x3f0b_0000u32) };
        assert!(r >= 0, "keyctl setperm: {}", errno());
        Key { id }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: KEYCTL_INVALIDATE takes integers.
        unsafe { libc::syscall(libc::SYS_keyctl, 21, self.id) };
    }
}

// ------------------------------------------------------------------ tests

/// Other processes' memory: a host process's 0600 SysV segment (same
/// user) can be neither listed, nor attached by key or id, nor read, nor
/// overwritten from inside. Closed by the IPC namespace; without it, by
/// seccomp, which refuses the SysV calls in the fallback (the report still
/// lists `ns_ipc`, and that is no excuse).
#[test]
fn sysv_shared_memory_of_a_host_process_is_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    for (i, mode) in MODES.into_iter().enumerate() {
        let key = 0x4149_0000 | ((std::process::id() as i32 & 0xfff) << 4) | i as i32;
        let secret = format!("host-secret-{key}");
        let seg = Shm::create(key, &secret);
        let run = run_mode(dir.path(), mode, &[], &attack("shm.py", &[key.to_string(), seg.id.to_string()]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let content = seg.content();
        let leaked = ["list", "attach by key", "attach by id"].iter().any(|l| got_through(&got, l))
            || got.values().any(|(_, d)| d.contains(&secret))
            || content != secret;
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} SysV shm {got:?} now {content:?}"), &[]);
        if mode == Mode::Fallback {
            // Refused by seccomp's EPERM, not by a missing segment.
            assert_eq!(outcome(&got, "attach by key"), "EPERM", "{mode:?}: {got:?}");
        }
        assert_mode(&run, mode);
    }
}

/// Secrets in the kernel keyring: a key the user keeps in the user keyring
/// is neither found (keyctl search, request_key) nor read from inside.
/// seccomp refuses the keyring calls in both modes.
#[test]
fn the_users_kernel_keyring_is_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    for mode in MODES {
        let desc = format!("airlock-test-{}-{}", std::process::id(), unique());
        let secret = format!("keyring-secret-{}", unique());
        let _key = Key::add(&desc, &secret);
        let run = run_mode(dir.path(), mode, &[], &attack("keyring.py", &[desc]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let leaked = ["search", "request_key"].iter().any(|l| got_through(&got, l))
            || got.values().any(|(_, d)| d.contains(&secret));
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} keyring {got:?}"), &[]);
        assert_mode(&run, mode);
    }
}

/// The network, each route checked on the host side: TCP and MPTCP
/// connects to a host loopback listener, UDP to a host socket, an MPTCP
/// listener a host process connects to, AF_PACKET sniffing of host
/// loopback traffic (as root), a `socketpair` datagram socket's `sendto`
/// to a named host socket, and an abstract unix name the host then cannot
/// bind. With namespaces the child has a loopback of its own and nothing
/// reaches the host; in the fallback, seccomp and Landlock refuse what
/// they cover and the report lists the rest (`udp`,
/// `unix_socket_connect`, `ns_net` for abstract names).
#[test]
fn the_hosts_network_is_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
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

        // A port free on the host for the child's MPTCP listener, and a
        // host process that keeps trying to connect to it.
        let listen_port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let _connector = Background::start(move || {
            if let Ok(mut s) =
                TcpStream::connect_timeout(&([127, 0, 0, 1], listen_port).into(), Duration::from_millis(100))
            {
                let _ = s.write_all(b"host");
            }
        });

        // Host loopback traffic carrying a marker, for the sniffer to find.
        let marker = format!("airlock-sniff-{}-{}", std::process::id(), unique());
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink_addr = sink.local_addr().unwrap();
        let m = marker.clone();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let _traffic = Background::start(move || {
            let _ = sender.send_to(m.as_bytes(), sink_addr);
        });

        let unix_path = dir.path().join(format!("host-{}.sock", unique()));
        let unix = UnixDatagram::bind(&unix_path).unwrap();
        unix.set_nonblocking(true).unwrap();

        // A host daemon that binds the abstract name now and then; it finds
        // it taken only if the child's name is the host's.
        let abstract_name = format!("airlock-test-abstract-{}-{}", std::process::id(), unique());
        let blocked = Arc::new(AtomicBool::new(false));
        let (b, name) = (blocked.clone(), abstract_name.clone());
        let _daemon = Background::start(move || {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            if let Err(e) = std::os::unix::net::UnixListener::bind_addr(&addr) {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    b.store(true, Ordering::Relaxed);
                }
            }
        });

        let args = [
            tcp_port.to_string(),
            udp_port.to_string(),
            listen_port.to_string(),
            unix_path.display().to_string(),
            abstract_name.clone(),
            marker.clone(),
        ];
        let run = run_mode(dir.path(), mode, &[], &attack("net.py", &args));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let mut buf = [0u8; 64];
        let udp_got = udp.recv_from(&mut buf).is_ok();
        let unix_got = unix.recv(&mut buf).is_ok();
        let ctx = |class: &str| format!("{mode:?} {class} {got:?}");
        let tcp_leaked = got_through(&got, "tcp connect");
        let mptcp_leaked = got_through(&got, "mptcp connect");
        assert_refused_or_listed(&run, tcp_leaked, &ctx("TCP connect"), &["tcp"]);
        assert_refused_or_listed(&run, mptcp_leaked, &ctx("MPTCP connect"), &["mptcp"]);
        assert_refused_or_listed(
            &run,
            accepted.load(Ordering::Relaxed) > 0,
            &ctx("a host listener accepted"),
            if tcp_leaked { &["tcp"] } else { &["mptcp"] },
        );
        assert_refused_or_listed(&run, udp_got, &ctx("UDP send"), &["udp"]);
        assert_refused_or_listed(&run, got_through(&got, "mptcp listen"), &ctx("MPTCP listen"), &["mptcp"]);
        // seccomp refuses an MPTCP socket in both modes, with Landlock's
        // errno: any other (a kernel without MPTCP says EPROTONOSUPPORT, a
        // private loopback ECONNREFUSED) would show the rule is not what
        // stopped it.
        for label in ["mptcp connect", "mptcp listen"] {
            assert_eq!(outcome(&got, label), "EACCES", "{}", ctx(label));
        }
        assert_refused_or_listed(&run, got_through(&got, "packet sniff"), &ctx("AF_PACKET"), &[]);
        assert_refused_or_listed(&run, unix_got, &ctx("socketpair sendto"), &["unix_socket_connect"]);
        assert_refused_or_listed(&run, blocked.load(Ordering::Relaxed), &ctx("abstract bind"), &["ns_net"]);
        assert_mode(&run, mode);
    }
}

fn proc_field(pid: u32, file: &str, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    text.lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/{file}"))
        .to_owned()
}

/// The nice value, field 19 of /proc/PID/stat.
fn nice(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(16).unwrap().to_owned()
}

/// airlock itself and other host processes: `prlimit` of airlock's
/// RLIMIT_FSIZE to 0 fails, and airlock completes and writes its report;
/// a same-user host process's limits, priority and affinity stay as they
/// were. The child still sets its own limits. Refused in both modes (the
/// PID namespace hides the pids; seccomp refuses other pids).
#[test]
fn airlock_and_other_host_processes_are_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    for mode in MODES {
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = other.id();
        let before = (
            proc_field(pid, "limits", "Max open files"),
            nice(pid),
            proc_field(pid, "status", "Cpus_allowed_list"),
        );
        let run = run_mode(dir.path(), mode, &[], &attack("procs.py", &[pid.to_string()]));
        let after = (
            proc_field(pid, "limits", "Max open files"),
            nice(pid),
            proc_field(pid, "status", "Cpus_allowed_list"),
        );
        let _ = other.kill();
        let _ = other.wait();
        // The report exists (run_mode read it) and the session ended well.
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
            &format!("{mode:?} host process changed {before:?} → {after:?}"),
            &[],
        );
        assert_eq!(outcome(&got, "prlimit self"), "ok", "{mode:?}: {got:?}");
        assert_mode(&run, mode);
    }
}

fn read_trimmed(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}")).trim().to_owned()
}

/// Restores the host's names and `dmesg_restrict` however the test ends.
struct HostNames {
    saved: Vec<(&'static str, String)>,
}

impl Drop for HostNames {
    fn drop(&mut self) {
        for (p, v) in &self.saved {
            if read_trimmed(p) != *v {
                let _ = std::fs::write(p, v);
            }
        }
    }
}

/// Capabilities of a child started by root (as CI is): none effective,
/// permitted, inheritable, bounding or ambient, and `no_new_privs`; the kernel log is
/// unreadable with `dmesg_restrict=1`; the host's host and domain names
/// are unchanged by `sethostname`/`setdomainname` (inside a UTS namespace
/// they would change only the child's own). Refused in both modes.
#[test]
fn a_root_child_has_no_capabilities_over_the_host() {
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: getuid takes nothing.
    assert_eq!(unsafe { libc::getuid() }, 0, "this test is for a root caller, as CI runs");
    let names =
        ["/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname", "/proc/sys/kernel/dmesg_restrict"];
    let _restore = HostNames { saved: names.iter().map(|p| (*p, read_trimmed(p))).collect() };
    if read_trimmed(names[2]) != "1" {
        std::fs::write(names[2], "1").unwrap();
    }
    for mode in MODES {
        let before = (read_trimmed(names[0]), read_trimmed(names[1]));
        let name = format!("pwned{}", unique());
        let run = run_mode(dir.path(), mode, &[], &attack("caps.py", &[name]));
        let after = (read_trimmed(names[0]), read_trimmed(names[1]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        for (field, want) in [
            ("effective", "0"),
            ("permitted", "0"),
            ("inheritable", "0"),
            ("bounding", "0"),
            ("ambient", "0"),
            ("no_new_privs", "1"),
        ] {
            let value = outcome(&got, field).trim_start_matches('0');
            let value = if value.is_empty() { "0" } else { value };
            assert_refused_or_listed(
                &run,
                value != want,
                &format!("{mode:?} capabilities: {field} {got:?}"),
                &[],
            );
        }
        assert_refused_or_listed(&run, got_through(&got, "dmesg"), &format!("{mode:?} dmesg {got:?}"), &[]);
        assert_refused_or_listed(
            &run,
            before != after,
            &format!("{mode:?} host names {before:?} → {after:?}"),
            &[],
        );
        assert_mode(&run, mode);
    }
}

/// Lifetime: a child that clears its parent-death signal is gone soon
/// after airlock is SIGKILLed. With namespaces the PID namespace ends with
/// airlock; in the fallback it is gone too or the report of the same
/// configuration lists `ns_pid` (airlock, killed, writes none itself).
#[test]
fn a_child_that_clears_its_death_signal_dies_with_a_killed_airlock() {
    let dir = tempfile::tempdir().unwrap();
    for (i, mode) in MODES.into_iter().enumerate() {
        let marker = format!("alpd{}x{i}", std::process::id() % 100_000);
        let report = dir.path().join(format!("killed-{i}.json"));
        let mut airlock = command(
            dir.path(),
            mode,
            &[],
            &report,
            &attack("lifetime.py", &["pdeathsig".into(), marker.clone()]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let mut stdout = BufReader::new(airlock.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        if !line.contains("ready") {
            let _ = airlock.kill();
            let mut err = String::new();
            let _ = airlock.stderr.take().unwrap().read_to_string(&mut err);
            panic!("{mode:?}: the child never got ready: {line:?} {err}");
        }
        airlock.kill().unwrap();
        airlock.wait().unwrap();
        let leaked = outlives(&marker);
        let run = run_mode(dir.path(), mode, &[], &sh("true"));
        assert_refused_or_listed(
            &run,
            leaked,
            &format!("{mode:?}: the child outlived a SIGKILLed airlock"),
            &["ns_pid"],
        );
        assert_mode(&run, mode);
    }
}

/// Lifetime: a double-forked `setsid` daemon with every descriptor closed
/// is gone soon after its session ends normally. With namespaces it dies
/// with the PID namespace; in the fallback the subreaper stage kills every
/// descendant left when the payload ends (the report's `ns_pid` excuses
/// nothing here).
#[test]
fn a_setsid_daemon_does_not_outlive_its_session() {
    let dir = tempfile::tempdir().unwrap();
    for (i, mode) in MODES.into_iter().enumerate() {
        let marker = format!("alsd{}x{i}", std::process::id() % 100_000);
        let run = run_mode(dir.path(), mode, &[], &attack("lifetime.py", &["daemon".into(), marker.clone()]));
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        assert_eq!(outcome(&outcomes(&run), "daemon started"), "ok");
        // The daemon sleeps 30 s: a session that lasted that long waited
        // it out instead of ending it.
        assert!(run.elapsed < Duration::from_secs(15), "{mode:?}: the session lasted {:?}", run.elapsed);
        assert_refused_or_listed(
            &run,
            outlives(&marker),
            &format!("{mode:?}: a setsid daemon outlived its session"),
            &[],
        );
        assert_mode(&run, mode);
    }
}

/// Host files' metadata: `setxattr` and `removexattr` of `user.*` on a
/// host file outside every root fail, and its attributes stay as they
/// were. seccomp refuses xattr writes in both modes.
#[test]
fn xattrs_of_host_files_outside_every_root_stay_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let file = outside.path().join("host.txt");
    std::fs::write(&file, "host").unwrap();
    let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the name and value outlive the call.
    let r = unsafe { libc::setxattr(c.as_ptr(), c"user.keep".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(r, 0, "setxattr on the host: {}", errno());
    let before = xattrs(&file);
    for mode in MODES {
        let run = run_mode(
            dir.path(),
            mode,
            &[],
            &attack("xattr.py", &[outside.path().display().to_string(), "host.txt".to_owned()]),
        );
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let got = outcomes(&run);
        let after = xattrs(&file);
        let leaked = got_through(&got, "setxattr") || got_through(&got, "removexattr") || after != before;
        assert_refused_or_listed(&run, leaked, &format!("{mode:?} xattr {got:?}"), &[]);
        assert_mode(&run, mode);
    }
}

/// A VFS tool (`airlock tool`) that speaks the protocol only to hand back
/// what it tried directly: reading the project's `.env` (never accessible
/// through the protocol), a file outside the project, and a TCP connect to
/// a host listener. All fail in both modes; `tool` writes no report, so
/// nothing here may be listed instead. `.env` is also named on the tool's
/// command line: a file named there is granted to the tool directly only
/// when its policy would let it read the file, and `.env` never is.
#[test]
fn the_vfs_tool_itself_reaches_nothing_directly() {
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join(".env"), "TOOL_SECRET=env\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-secret\n").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        r#"
import errno, json, socket, sys
sys.stdin.readline()
got = {{}}
def probe(label, f):
    try:
        got[label] = "ok: " + str(f())
    except OSError as e:
        got[label] = errno.errorcode.get(e.errno, str(e.errno))
probe(".env", lambda: open({env:?}).read())
probe("outside", lambda: open({outside:?}).read())
probe("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2).close())
print(json.dumps({{"jsonrpc": "2.0", "method": "result", "params": {{"content": json.dumps(got)}}}}), flush=True)
"#,
        env = project.path().join(".env").display().to_string(),
        outside = outside.path().join("secret.txt").display().to_string(),
    );
    for mode in MODES {
        let mut c = Command::new(airlock());
        c.current_dir(project.path())
            .args(["tool", "--", "python3", "-c", &script, ".env"])
            .stdin(Stdio::null());
        mode.apply(&mut c);
        let out = c.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let j: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{mode:?}: not one JSON line ({e}): {stdout:?}\n{stderr}"));
        let text =
            j["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{mode:?}: no result: {j}\n{stderr}"));
        let got: BTreeMap<String, String> = serde_json::from_str(text).unwrap();
        for label in [".env", "outside", "tcp"] {
            let o = got.get(label).unwrap_or_else(|| panic!("{mode:?}: {label} not tried: {got:?}"));
            assert!(!o.starts_with("ok"), "{mode:?}: the tool reached {label} directly: {got:?}");
        }
        assert!(listener.accept().is_err(), "{mode:?}: the host listener accepted the tool's connection");
    }
}

const TOKEN: &str = "attack-test-token";

/// A running `airlock toolexec serve` in `work` (token file written
/// there), SIGTERMed on drop.
struct Serve {
    child: std::process::Child,
    url: String,
}

impl Serve {
    /// With `inherit`, that descriptor is fd 5 of the server, without
    /// CLOEXEC, as a careless parent would leave it.
    fn start(work: &Path, mode: Mode, args: &[&str], inherit: Option<std::os::fd::RawFd>) -> Serve {
        use std::os::unix::process::CommandExt;
        std::fs::write(work.join("token"), format!("{TOKEN}\n")).unwrap();
        let mut c = Command::new(airlock());
        c.current_dir(work)
            .args(["toolexec", "serve", "--token-file", "token"])
            .args(args)
            .env_remove("AIFO_TOOLEEXEC_TOKEN")
            // Tools get the server's environment: a target directory the
            // test runner was given lies outside what they may write.
            .env_remove("CARGO_TARGET_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        mode.apply(&mut c);
        if let Some(fd) = inherit {
            // SAFETY: dup2 is async-signal-safe and touches only descriptors.
            unsafe {
                c.pre_exec(move || {
                    if libc::dup2(fd, 5) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = c.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(url) = line.trim().strip_prefix("AIFO_TOOLEEXEC_URL=") {
                return Serve { url: url.to_owned(), child };
            }
            line.clear();
        }
        let _ = child.kill();
        let _ = child.wait();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("{mode:?}: serve {args:?} printed no URL: {err}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the server we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// A file outside every sandbox, open on fd 5 of `toolexec serve` without
/// CLOEXEC (an inherited descriptor, as a careless parent leaves it): a
/// tool reads it neither through fd 5 nor by reopening /proc/self/fd/5.
/// Descriptors above 2 are closed before every tool's exec, in both modes.
#[test]
fn toolexec_tools_do_not_inherit_servers_descriptors() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    let outside = tempfile::tempdir().unwrap();
    let secret_path = outside.path().join("secret.txt");
    std::fs::write(&secret_path, "inherited-secret\n").unwrap();
    let work = tempfile::tempdir().unwrap();
    let work = std::fs::canonicalize(work.path()).unwrap().join("w");
    std::fs::create_dir_all(&work).unwrap();
    let tool = work.join("peek");
    std::fs::write(
        &tool,
        "#!/bin/sh\ncat <&5 2>/dev/null && echo 'fd5 read'\ncat /proc/self/fd/5 2>/dev/null && echo 'proc read'\necho done\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    for mode in MODES {
        let secret = std::fs::File::open(&secret_path).unwrap();
        let peek = format!("peek={}", tool.display());
        let server = Serve::start(&work, mode, &["--tool", &peek], Some(secret.as_raw_fd()));
        let url = server.url.clone();
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-H"])
            .arg(format!("Authorization: Bearer {TOKEN}"))
            .args(["-H", "X-Aifo-Proto: 2", "--data-urlencode", "tool=peek", &url])
            .output()
            .expect("curl is installed");
        drop(server);
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            body.contains("done"),
            "{mode:?}: the tool did not run: {body:?} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !body.contains("inherited-secret") && !body.contains(" read"),
            "{mode:?}: a tool read the server's inherited descriptor: {body:?}"
        );
    }
}

/// Ordinary programs keep working under the default sandbox: an `sh`
/// pipeline, a scratch file in /tmp, python3's `subprocess` and
/// `multiprocessing.Pool`, git init and commit in /tmp, a nested `airlock
/// run`, and `"$AIRLOCK" fs cat` through the proxy. With namespaces all of
/// them. In the fallback the ones that need the private /tmp and /dev/shm
/// of the mount namespace must fail, since Landlock grants neither of the
/// host's (one that worked wrote the host's /tmp), and the report lists
/// `ns_mount`; the others work.
#[test]
fn ordinary_programs_keep_working_inside() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "data").unwrap();
    let script = vec!["sh".to_owned(), attacks().join("works.sh").display().to_string()];
    let needs_private_tmp = ["tmp", "multiprocessing", "git"];
    for mode in MODES {
        let run = run_mode(dir.path(), mode, &["--allow", "."], &script);
        assert_eq!(run.code(), Some(0), "{mode:?}: {}", run.stderr());
        let out = run.stdout();
        let checks: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once(' ')).collect();
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
    }
}

// ------------------------------------------------- toolchains (issue 31)

fn home() -> PathBuf {
    PathBuf::from(std::env::var("HOME").expect("HOME is set"))
}

/// A tiny crate without dependencies in `work/tiny`, and the POSIX shim
/// for `cargo` in `work/shims`.
fn tiny_crate(work: &Path) -> PathBuf {
    let krate = work.join("tiny");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(krate.join("src/main.rs"), "fn main() {\n    println!(\"tiny ok\");\n}\n").unwrap();
    let out = Command::new(airlock())
        .args(["toolexec", "write-shims"])
        .arg(work.join("shims"))
        .args(["--client", "posix", "--tool", "cargo"])
        .output()
        .unwrap();
    assert!(out.status.success(), "write-shims: {}", String::from_utf8_lossy(&out.stderr));
    krate
}

fn cargo_through_shim(work: &Path, server: &Serve, krate: &Path) -> std::process::Output {
    Command::new(work.join("shims/cargo"))
        .args(["build", "--offline"])
        .current_dir(krate)
        .env("AIFO_TOOLEEXEC_URL", &server.url)
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .env("TMPDIR", work)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// rustup's cargo (in `~/.cargo/bin`, outside the system locations) runs
/// confined under `toolexec serve` once granted with `--sandbox-ro
/// ~/.cargo --sandbox-ro ~/.rustup` and the registry cache with
/// `--sandbox-rw`: `cargo build --offline` of a crate without dependencies,
/// through the shim, builds into the target directory under the working
/// directory. Without the grants the spawn fails with a message naming the
/// flag and the path it needs.
#[test]
fn a_rustup_toolchain_builds_through_toolexec_once_granted() {
    let tmp = tempfile::tempdir().unwrap();
    let work = std::fs::canonicalize(tmp.path()).unwrap().join("w");
    std::fs::create_dir_all(&work).unwrap();
    let krate = tiny_crate(&work);
    let (cargo_home, rustup_home) = (home().join(".cargo"), home().join(".rustup"));
    let registry = cargo_home.join("registry");
    let granted = [
        "--tool",
        "cargo",
        "--sandbox-ro",
        cargo_home.to_str().unwrap(),
        "--sandbox-ro",
        rustup_home.to_str().unwrap(),
        "--sandbox-rw",
        registry.to_str().unwrap(),
    ];
    let server = Serve::start(&work, Mode::Namespaces, &granted, None);
    let out = cargo_through_shim(&work, &server, &krate);
    drop(server);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo build through toolexec failed ({:?}): {stderr}", out.status);
    let built = krate.join("target/debug/tiny");
    assert!(built.exists(), "no {} after: {stderr}", built.display());
    let ran = Command::new(&built).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "tiny ok\n");

    let server = Serve::start(&work, Mode::Namespaces, &["--tool", "cargo"], None);
    let out = cargo_through_shim(&work, &server, &krate);
    drop(server);
    // The shim passes the server's refusal on as the tool's output, on
    // its stdout.
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "cargo ran without its grants: {said}");
    assert!(
        said.contains("spawn failed")
            && said.contains("--sandbox-ro")
            && said.contains(cargo_home.to_str().unwrap()),
        "the refusal names neither the flag nor the path ({:?}): {said}",
        out.status
    );
}
