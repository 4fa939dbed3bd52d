//! The served filesystem (issue 41) against the real binary, under the
//! default sandbox: each root of `airlock run` is a filesystem in the
//! child's view, so programs that know nothing of airlock (a Python agent
//! with ordinary file calls, git, cargo) work on the project unchanged,
//! every open decided by the same core and named in the audit log. As
//! root and as an unprivileged user (uid 65534); and the fallback to the
//! proxy alone, said in the report.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const NOBODY: (u32, u32) = (65534, 65534);

fn is_root() -> bool {
    // SAFETY: geteuid takes nothing.
    unsafe { libc::geteuid() == 0 }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A project directory in a fresh directory, owned by `owner`, with a
/// copy of the binary that user can run.
struct Project {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    bin: PathBuf,
    out: PathBuf,
    owner: Option<(u32, u32)>,
}

impl Project {
    fn new(owner: Option<(u32, u32)>) -> Project {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        chmod(&root, 0o755);
        let bin = root.join("bin/airlock");
        std::fs::create_dir(root.join("bin")).unwrap();
        chmod(&root.join("bin"), 0o755);
        std::fs::copy(airlock(), &bin).unwrap();
        chmod(&bin, 0o755);
        let (dir, out) = (root.join("project"), root.join("out"));
        for d in [&dir, &out] {
            std::fs::create_dir(d).unwrap();
            chmod(d, 0o755);
        }
        let p = Project { _tmp: tmp, dir, bin, out, owner };
        p.own(&p.dir.clone());
        p.own(&p.out.clone());
        p
    }

    /// Give `path` (and what is beneath it) to the project's owner.
    fn own(&self, path: &Path) {
        let Some((uid, gid)) = self.owner else { return };
        let status = Command::new("chown").arg("-R").arg(format!("{uid}:{gid}")).arg(path).status().unwrap();
        assert!(status.success(), "chown {}", path.display());
    }

    fn write(&self, rel: &str, content: &[u8]) {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        self.own(&self.dir.clone());
    }

    fn read(&self, rel: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(rel)).ok()
    }

    /// `airlock run FLAGS -- ARGV` from the project directory, with a
    /// report and an audit log; stdout must be valid UTF-8.
    fn run(&self, flags: &[&str], argv: &[&str]) -> Ran {
        let report = self.out.join("report.json");
        let audit = self.out.join("audit.jsonl");
        let _ = std::fs::remove_file(&report);
        let _ = std::fs::remove_file(&audit);
        let mut cmd = Command::new(&self.bin);
        cmd.current_dir(&self.dir)
            .arg("run")
            .arg("--report")
            .arg(&report)
            .arg("--audit")
            .arg(&audit)
            .args(flags)
            .arg("--")
            .args(argv)
            .env("PATH", SYSTEM_PATH)
            .env("HOME", &self.out)
            // The test's own build settings are not the child's.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.owner.filter(|_| is_root()) {
            cmd.uid(uid).gid(gid);
        }
        let output = run_with_timeout(&mut cmd, 120);
        let report = std::fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let audit = std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        Ran { output, report, audit }
    }
}

fn run_with_timeout(cmd: &mut Command, secs: u64) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // A copy of the binary another test thread's fork still holds open
    // for writing cannot be executed for a moment.
    let mut tries = 0;
    let child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.expect("airlock starts"),
        }
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out.expect("airlock's output"),
        Err(_) => {
            // SAFETY: a signal to the airlock this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("airlock did not finish within {secs} s");
        }
    }
}

struct Ran {
    output: Output,
    report: Value,
    audit: Vec<Value>,
}

impl Ran {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn ok(&self) -> &Self {
        assert!(
            self.output.status.success(),
            "airlock failed ({:?})\nstdout: {}\nstderr: {}\nreport: {}",
            self.output.status,
            self.stdout(),
            self.stderr(),
            self.report
        );
        self
    }

    fn served(&self) -> Vec<String> {
        self.report["sandbox"]["fuse"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }

    fn not_enforced(&self) -> Vec<String> {
        self.report["sandbox"]["not_enforced"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    }

    fn assert_clean(&self) {
        assert_eq!(self.report["handles_leaked"], 0, "report: {}", self.report);
        assert_eq!(self.report["files_leaked"], 0, "report: {}", self.report);
    }

    /// The paths the audit log records opens of, allowed or not.
    fn opened(&self) -> Vec<(String, bool)> {
        self.audit
            .iter()
            .filter(|r| r["op"] == "open")
            .map(|r| {
                (r["path"].as_str().unwrap_or_default().to_owned(), r["allowed"].as_bool().unwrap_or(false))
            })
            .collect()
    }
}

/// `/dev/fuse` must be usable by an unprivileged user, as distributions
/// ship it (0666): a test that needs it says so rather than skipping.
fn fuse_device_open_to_all() {
    let mode = std::fs::metadata("/dev/fuse")
        .unwrap_or_else(|e| panic!("/dev/fuse: {e}: the served filesystem needs the FUSE device"))
        .permissions()
        .mode();
    assert!(
        mode & 0o006 == 0o006,
        "/dev/fuse is mode {:o}: an unprivileged user cannot open it, so airlock would serve the roots \
         through the proxy alone; make it 0666 as distributions ship it (`chmod 0666 /dev/fuse`; .ci/run does)",
        mode & 0o777
    );
}

fn agent_project(owner: Option<(u32, u32)>) -> Project {
    let p = Project::new(owner);
    p.write("src/main.txt", b"fn main() {}\n");
    p.write("README.md", b"# project\n");
    p.write("data.bin", b"0123456789");
    p.write("old.log", b"old\n");
    std::fs::copy(support("fuse_agent.py"), p.dir.join("agent.py")).unwrap();
    p.own(&p.dir.clone());
    p
}

fn check_agent(p: &Project, ran: &Ran) {
    ran.ok().assert_clean();
    let out: Value = serde_json::from_str(ran.stdout().trim())
        .unwrap_or_else(|e| panic!("agent output {:?}: {e}\nstderr: {}", ran.stdout(), ran.stderr()));
    let walk: Vec<&str> = out["walk"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(walk, ["README.md", "agent.py", "data.bin", "old.log", "src/main.txt"], "{out}");
    assert_eq!(out["main"], "fn main() {}\n");
    assert_eq!(out["readme"], "# project\n");
    assert_eq!(out["stat_size"], 10);
    assert_eq!(out["old_gone"], true);
    assert_eq!(out["unlinked_read"], "still here");
    assert_eq!(out["exclusive"], "refused");
    assert_eq!(out["scratch_gone"], true);
    assert_eq!(out["outside"], "PermissionError");
    // What it did is on the host.
    assert_eq!(p.read("build/out/deep/result.txt").as_deref(), Some(&b"computed\nappended\n"[..]));
    assert_eq!(p.read("build/out/notes.md").as_deref(), Some(&b"# notes\n"[..]));
    assert_eq!(p.read("build/notes.md"), None);
    assert_eq!(p.read("data.bin").as_deref(), Some(&b"01XY45"[..]));
    assert_eq!(p.read("old.log"), None);
    assert_eq!(p.read("b.txt").as_deref(), Some(&b"A"[..]));
    assert_eq!(p.read("a.txt"), None);
    assert!(!p.dir.join("scratch").exists() && !p.dir.join("tmp.txt").exists());
    // Served, not fallen back.
    assert_eq!(ran.served(), [p.dir.to_string_lossy().into_owned()], "report: {}", ran.report);
    assert!(!ran.not_enforced().contains(&"fuse".to_owned()), "report: {}", ran.report);
    // The audit log names every open: each file the agent opened.
    let opened = ran.opened();
    let dir = p.dir.to_string_lossy();
    for rel in ["agent.py", "src/main.txt", "README.md", "build/out/deep/result.txt", "data.bin", "b.txt"] {
        let path = format!("{dir}/{rel}");
        assert!(
            opened.iter().any(|(p, ok)| *p == path && *ok),
            "no open of {path} in the audit log: {opened:?}"
        );
    }
    // The exclusive create of an existing file was refused before it
    // reached airlock (the kernel knew the name): no open was allowed
    // that the agent did not make.
    assert!(opened.iter().all(|(p, _)| p.starts_with(dir.as_ref())), "{opened:?}");
}

#[test]
fn a_python_agent_uses_ordinary_file_calls_as_root() {
    let p = agent_project(None);
    let ran = p.run(&["--allow-rw", "."], &["python3", "agent.py"]);
    check_agent(&p, &ran);
}

#[test]
fn a_python_agent_uses_ordinary_file_calls_as_an_unprivileged_user() {
    fuse_device_open_to_all();
    let p = agent_project(Some(NOBODY));
    let ran = p.run(&["--allow-rw", "."], &["python3", "agent.py"]);
    check_agent(&p, &ran);
}

fn git(dir: &Path, args: &[&str]) -> String {
    // The host's side, as root in a checkout another user may own.
    let out =
        Command::new("git").current_dir(dir).args(["-c", "safe.directory=*"]).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn git_checkout(owner: Option<(u32, u32)>) -> Project {
    let p = Project::new(owner);
    git(&p.dir, &["init", "-q", "-b", "main"]);
    git(&p.dir, &["config", "user.name", "Host"]);
    git(&p.dir, &["config", "user.email", "host@example.com"]);
    for i in 0..30 {
        p.write(&format!("src/f{i}.txt"), format!("{i}\n").as_bytes());
    }
    git(&p.dir, &["add", "-A"]);
    git(&p.dir, &["commit", "-qm", "init"]);
    p.write("src/f1.txt", b"changed\n");
    p.write("new.txt", b"new\n");
    p.own(&p.dir.clone());
    p
}

const GIT_SCRIPT: &str = "git status --porcelain && git add -A && \
    git -c user.name=Agent -c user.email=agent@example.com commit -qm 'from the agent' && \
    git log --format=%s && git status --porcelain && echo clean";

fn check_git(p: &Project, ran: &Ran) {
    ran.ok().assert_clean();
    let out = ran.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, [" M src/f1.txt", "?? new.txt", "from the agent", "init", "clean"], "{}", ran.stderr());
    // The commit is the host's checkout's.
    assert_eq!(git(&p.dir, &["log", "--format=%s"]), "from the agent\ninit\n");
    assert_eq!(git(&p.dir, &["status", "--porcelain"]), "");
    assert_eq!(ran.served(), [p.dir.to_string_lossy().into_owned()], "report: {}", ran.report);
}

#[test]
fn git_status_add_commit_and_log_in_the_checkout_as_root() {
    let p = git_checkout(None);
    let ran = p.run(&["--allow-rw", "."], &["sh", "-c", GIT_SCRIPT]);
    check_git(&p, &ran);
}

#[test]
fn git_status_add_commit_and_log_in_the_checkout_as_an_unprivileged_user() {
    fuse_device_open_to_all();
    let p = git_checkout(Some(NOBODY));
    let ran = p.run(&["--allow-rw", "."], &["sh", "-c", GIT_SCRIPT]);
    check_git(&p, &ran);
}

#[test]
fn cargo_builds_a_tiny_crate_offline() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let (cargo_home, rustup) = (format!("{home}/.cargo"), format!("{home}/.rustup"));
    assert!(Path::new(&cargo_home).is_dir() && Path::new(&rustup).is_dir(), "no toolchain under {home}");
    let p = Project::new(None);
    p.write(
        "Cargo.toml",
        b"[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    );
    p.write("src/main.rs", b"fn main() { println!(\"tiny says hi\"); }\n");
    let cargo = format!("{cargo_home}/bin/cargo");
    let ran = p.run(
        &["--allow-rw", ".", "--sandbox-ro", &cargo_home, "--sandbox-ro", &rustup],
        &[&cargo, "build", "--offline", "--quiet"],
    );
    ran.ok().assert_clean();
    let built = p.dir.join("target/debug/tiny");
    let out = Command::new(&built)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", built.display(), ran.stderr()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "tiny says hi\n");
}

#[test]
fn a_read_only_root_is_read_not_written() {
    let p = Project::new(None);
    p.write("keep.txt", b"keep\n");
    let ran = p.run(
        &["--allow", "."],
        &[
            "sh",
            "-c",
            "cat keep.txt; echo x > keep.txt && echo WROTE; echo y > new.txt && echo CREATED; \
             rm keep.txt && echo REMOVED; mkdir d && echo MADE; true",
        ],
    );
    ran.ok().assert_clean();
    assert_eq!(ran.stdout(), "keep\n", "stderr: {}", ran.stderr());
    assert!(ran.stderr().contains("Permission denied"), "{}", ran.stderr());
    assert_eq!(p.read("keep.txt").as_deref(), Some(&b"keep\n"[..]));
    assert_eq!(p.read("new.txt"), None);
    assert!(!p.dir.join("d").exists());
    // The refused open is in the audit log with its rule.
    let refused: Vec<&Value> =
        ran.audit.iter().filter(|r| r["op"] == "open" && r["allowed"] == false).collect();
    assert!(!refused.is_empty(), "{:?}", ran.audit);
    assert!(refused[0]["reason"].as_str().unwrap_or_default().contains("read-only"), "{:?}", refused[0]);
}

/// Reads of a file no open could write are the kernel's own (passthrough)
/// where airlock may register backing files (root), every open of the
/// file sharing one registration (two at once, then a third), and served
/// otherwise (an unprivileged user): the same bytes either way, and every
/// open still decided and audited.
fn check_passthrough(owner: Option<(u32, u32)>) {
    let p = Project::new(owner);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    p.write("big.bin", &data);
    let script = "import hashlib\n\
                  a = open('big.bin', 'rb'); b = open('big.bin', 'rb')\n\
                  print(hashlib.sha256(a.read()).hexdigest(), hashlib.sha256(b.read()).hexdigest())\n\
                  a.close(); b.close()\n\
                  with open('big.bin', 'rb') as c: print(hashlib.sha256(c.read()).hexdigest())\n";
    let ran = p.run(&["--allow", "."], &["python3", "-c", script]);
    ran.ok().assert_clean();
    let want = sha256_hex(&data);
    assert_eq!(ran.stdout(), format!("{want} {want}\n{want}\n"), "stderr: {}", ran.stderr());
    let through = ran.report["fuse"]["passthrough"].as_u64().unwrap_or(0);
    if owner.is_none() {
        assert_eq!(through, 3, "{}", ran.report);
        // Three opens, and no read of 3 MB asked of airlock.
        assert!(ran.report["fuse"]["requests"].as_u64().unwrap_or(u64::MAX) < 40, "{}", ran.report);
    } else {
        assert_eq!(through, 0, "{}", ran.report);
    }
    let opens = ran.opened().iter().filter(|(path, ok)| path.ends_with("big.bin") && *ok).count();
    assert_eq!(opens, 3, "{:?}", ran.audit);
}

/// The hex SHA-256 of `data`, as the child's Python prints it.
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("python3")
        .args([
            "-c",
            "import hashlib,sys; sys.stdout.write(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
}

#[test]
fn a_read_only_file_is_passed_through_to_the_kernel_as_root() {
    check_passthrough(None);
}

#[test]
fn a_read_only_file_is_served_to_an_unprivileged_user() {
    check_passthrough(Some(NOBODY));
}

/// The guard holds at the mount as at the protocol: `.env` and its kin are
/// absent from listings and refused by name, `.git/config` is read but
/// never changed, and each refusal is counted with its rule.
fn check_guard(owner: Option<(u32, u32)>) {
    let p = Project::new(owner);
    p.write(".env", b"SECRET=1\n");
    p.write("prod.env", b"SECRET=2\n");
    p.write(".git/config", b"[core]\n");
    p.write("a.txt", b"a\n");
    p.own(&p.dir.clone());
    let ran = p.run(
        &["--allow-rw", "."],
        &[
            "python3",
            "-c",
            "import os\n\
             print(sorted(os.listdir('.')))\n\
             for path, mode in (('.env', 'r'), ('prod.env', 'r'), ('.git/config', 'a')):\n\
             \x20   try:\n\
             \x20       open(path, mode).write('[core]\\n\\tfsmonitor = evil\\n') if mode == 'a' else open(path).read()\n\
             \x20       print(path, 'ok')\n\
             \x20   except PermissionError:\n\
             \x20       print(path, 'refused')\n\
             print(open('.git/config').read().strip())",
        ],
    );
    ran.ok().assert_clean();
    assert_eq!(
        ran.stdout(),
        "['.git', 'a.txt']\n.env refused\nprod.env refused\n.git/config refused\n[core]\n",
        "stderr: {}",
        ran.stderr()
    );
    assert_eq!(p.read(".git/config").as_deref(), Some(&b"[core]\n"[..]));
    assert_eq!(ran.served(), [p.dir.to_string_lossy().into_owned()], "report: {}", ran.report);
    let guarded = &ran.report["guarded"];
    let config = p.dir.join(".git/config").to_string_lossy().into_owned();
    assert!(guarded[&config]["refused"].as_u64() >= Some(1), "report: {}", ran.report);
}

#[test]
fn secret_files_are_absent_and_git_config_read_only_as_root() {
    check_guard(None);
}

#[test]
fn secret_files_are_absent_and_git_config_read_only_as_an_unprivileged_user() {
    fuse_device_open_to_all();
    check_guard(Some((65534, 65534)));
}

#[test]
fn links_and_dot_dot_lead_nowhere_the_sandbox_does_not_allow() {
    let p = Project::new(None);
    p.write("inside.txt", b"inside\n");
    std::os::unix::fs::symlink("/etc/passwd", p.dir.join("out")).unwrap();
    std::os::unix::fs::symlink("inside.txt", p.dir.join("near")).unwrap();
    let ran = p.run(
        &["--allow-rw", "."],
        &[
            "sh",
            "-c",
            "cat near; cat out && echo LEAKED; cat ../../../etc/passwd && echo LEAKED; \
             ln -s /etc/passwd made && echo LINKED; ln inside.txt hard && echo HARD; \
             mknod fifo p && echo FIFO; true",
        ],
    );
    ran.ok().assert_clean();
    assert_eq!(ran.stdout(), "inside\n", "stderr: {}", ran.stderr());
    // No link and no special file is made on the host.
    assert!(std::fs::symlink_metadata(p.dir.join("made")).is_err());
    assert!(std::fs::symlink_metadata(p.dir.join("hard")).is_err());
    assert!(std::fs::symlink_metadata(p.dir.join("fifo")).is_err());
}

#[test]
fn without_fuse_the_roots_are_reached_through_the_proxy_alone_and_the_report_says_so() {
    let p = Project::new(None);
    p.write("a.txt", b"a\n");
    let ran = p.run(
        &["--allow-rw", ".", "--no-fuse"],
        &["sh", "-c", "cat a.txt && echo LEAKED; \"$AIRLOCK\" fs cat a.txt"],
    );
    ran.ok().assert_clean();
    assert_eq!(ran.stdout(), "a\n", "stderr: {}", ran.stderr());
    assert!(ran.not_enforced().contains(&"fuse".to_owned()), "report: {}", ran.report);
    assert_eq!(ran.report["sandbox"]["fuse_reason"], "--no-fuse");
    assert!(ran.served().is_empty());
}

#[test]
fn an_unreachable_fuse_device_falls_back_to_the_proxy_alone() {
    assert!(is_root(), "this test hides /dev/fuse in a mount namespace of its own, which needs root");
    let p = Project::new(None);
    p.write("a.txt", b"a\n");
    // /dev/fuse replaced by /dev/null in a mount namespace of this run's own.
    let report = p.out.join("report.json");
    let script = format!(
        "mount --bind /dev/null /dev/fuse && exec {} run --report {} --allow-rw . -- sh -c '\"$AIRLOCK\" fs cat a.txt'",
        p.bin.display(),
        report.display()
    );
    let output = run_with_timeout(
        Command::new("unshare").args(["--mount", "sh", "-c", &script]).current_dir(&p.dir),
        60,
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "a\n");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let gaps = report["sandbox"]["not_enforced"].as_array().unwrap();
    assert!(gaps.iter().any(|g| g == "fuse"), "report: {report}");
    assert!(
        report["sandbox"]["fuse_reason"].as_str().unwrap_or_default().contains("mount"),
        "report: {report}"
    );
}

/// The kernel keeps a directory's listing across opens (`FOPEN_CACHE_DIR`),
/// never past a change: one made through the mount shows at the next
/// listing, and one made behind the mount's back (through the proxy, as
/// another program on the host would) once the directory's attributes are
/// asked again, at once with `--fuse-cache-ms 0`.
#[test]
fn a_kept_listing_shows_every_change_through_the_mount_and_behind_it() {
    let p = Project::new(None);
    p.write("d/a.txt", b"a\n");
    let through = "ls d; echo -; ls d; echo -; touch d/b.txt; ls d; echo -; rm d/a.txt; ls d";
    let ran = p.run(&["--allow-rw", "."], &["sh", "-c", through]);
    ran.ok().assert_clean();
    assert_eq!(ran.stdout(), "a.txt\n-\na.txt\n-\na.txt\nb.txt\n-\nb.txt\n", "stderr: {}", ran.stderr());
    let behind = "ls d; echo -; ls d; echo -; echo c | \"$AIRLOCK\" fs write d/c.txt; ls d; echo -; \
                  \"$AIRLOCK\" fs remove d/b.txt; ls d";
    let ran = p.run(&["--allow-rw", ".", "--fuse-cache-ms", "0"], &["sh", "-c", behind]);
    ran.ok().assert_clean();
    assert_eq!(ran.stdout(), "b.txt\n-\nb.txt\n-\nb.txt\nc.txt\n-\nc.txt\n", "stderr: {}", ran.stderr());
    assert_eq!(ran.served(), [p.dir.to_string_lossy().into_owned()], "report: {}", ran.report);
}
