//! An agent run from its own project directory, under the default
//! sandbox, with the PATH a user has: the program's interpreter chain
//! (a pyenv shim, a venv built on a pyenv interpreter) is granted
//! read-only on its own and listed in the report and the audit log, for
//! `run`, `tool` and `toolexec serve` alike; files named as arguments
//! inside a root are granted as direct reads, others are a warning; a
//! program airlock does not grant on its own is refused before starting,
//! naming exactly what to grant. Never a silent substitute: each test
//! checks which interpreter actually ran.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Reads its data through `"$AIRLOCK" fs` from a subprocess (which closes
/// descriptor 3), shows that a direct read of it is refused, and says
/// which interpreter runs it and whether the venv's own module is found.
const AGENT: &str = r#"
import os, subprocess, sys
print("python:", sys.version.split()[0], sys.prefix)
try:
    import agentlib
    print("agentlib:", agentlib.WHERE)
except ImportError:
    print("agentlib: missing")
out = subprocess.run([os.environ["AIRLOCK"], "fs", "cat", "data.txt"], capture_output=True, text=True)
print("via airlock:", out.returncode, out.stdout.strip())
try:
    open("data.txt").read()
    print("direct: read")
except OSError as e:
    print("direct: refused", e.errno)
"#;

/// The same agent as a VFS tool: its data through `fs.read`.
const TOOL_AGENT: &str = r#"
import json, sys
sys.stdin.readline()
try:
    import agentlib
    lib = agentlib.WHERE
except ImportError:
    lib = "missing"
print(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "fs.read", "params": {"path": "data.txt"}}), flush=True)
data = json.loads(sys.stdin.readline())["result"]["content"].strip()
said = f"python: {sys.version.split()[0]} {sys.prefix}\nagentlib: {lib}\ndata: {data}"
print(json.dumps({"jsonrpc": "2.0", "method": "result", "params": {"content": said}}), flush=True)
"#;

/// The same agent as a ToolExec tool's script: it runs in the working
/// directory, which the tool may read directly.
const DIRECT_AGENT: &str = r#"
import sys
try:
    import agentlib
    lib = agentlib.WHERE
except ImportError:
    lib = "missing"
print("python:", sys.version.split()[0], sys.prefix)
print("agentlib:", lib)
print("data:", open("data.txt").read().strip())
"#;

fn project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("agent.py"), AGENT).unwrap();
    std::fs::write(project.join("tool_agent.py"), TOOL_AGENT).unwrap();
    std::fs::write(project.join("direct_agent.py"), DIRECT_AGENT).unwrap();
    std::fs::write(project.join("data.txt"), "the data\n").unwrap();
    (dir, project)
}

/// `airlock ARGS` in `cwd` with `PATH` as given (the test process's own,
/// which is the caller's, unless a test names another).
fn airlock_in(cwd: &Path, args: &[&str], path_env: Option<&str>) -> Output {
    let mut c = Command::new(airlock());
    c.current_dir(cwd).args(args).env_remove("AIRLOCK_FD").env_remove("PYENV_VERSION").stdin(Stdio::null());
    if let Some(p) = path_env {
        c.env("PATH", p);
    }
    c.output().expect("airlock runs")
}

fn run(cwd: &Path, args: &[&str], path_env: Option<&str>) -> Output {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    airlock_in(cwd, &all, path_env)
}

/// `path` was opened through airlock (the served filesystem's door), as
/// the audit log at `audit` says: a read the sandbox let past airlock
/// would leave no line.
fn assert_served_and_audited(audit: &Path, path: &Path, ctx: &str) {
    let text = std::fs::read_to_string(audit).unwrap();
    let want = path.display().to_string();
    assert!(
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .any(|l| l["op"] == "open" && l["allowed"] == true && l["path"].as_str() == Some(want.as_str())),
        "{ctx}: no open of {want} in the audit log: {text}"
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ------------------------------------------------- pyenv and its venvs

/// The version the tests build on, as the issue's user had it.
const VERSION: &str = "3.11.7";

struct Pyenv {
    root: PathBuf,
}

impl Pyenv {
    /// pyenv as installed for the caller; this machine (and CI) has it,
    /// so a missing one fails the test rather than skipping it.
    fn get() -> Pyenv {
        let root = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(&std::env::var_os("HOME").expect("HOME is set")).join(".pyenv"));
        let p = Pyenv { root };
        for need in [p.shims().join("python3"), p.version_dir().join("bin/python3")] {
            assert!(need.exists(), "these tests need pyenv with Python {VERSION}: no {}", need.display());
        }
        p
    }

    fn shims(&self) -> PathBuf {
        self.root.join("shims")
    }

    /// The version's directory, resolved as the sandbox sees it.
    fn version_dir(&self) -> PathBuf {
        let dir = self.root.join("versions").join(VERSION);
        std::fs::canonicalize(&dir).unwrap_or(dir)
    }

    /// The PATH a pyenv user has: the shims first, then the caller's.
    fn user_path(&self) -> String {
        format!("{}:{}", self.shims().display(), std::env::var("PATH").unwrap_or_default())
    }

    /// In `project`: `.python-version` naming the version, and a venv
    /// built with the shim's `python3 -m venv`, holding a module of its
    /// own (`agentlib`) that no other interpreter has.
    fn venv(&self, project: &Path) {
        std::fs::write(project.join(".python-version"), format!("{VERSION}\n")).unwrap();
        let out = Command::new("python3")
            .args(["-m", "venv", "--without-pip", ".venv"])
            .current_dir(project)
            .env("PATH", self.user_path())
            .env_remove("PYENV_VERSION")
            .output()
            .unwrap();
        assert!(out.status.success(), "python3 -m venv: {}", text(&out.stderr));
        let cfg = std::fs::read_to_string(project.join(".venv/pyvenv.cfg")).unwrap();
        assert!(
            cfg.contains(&format!("versions/{VERSION}/bin")),
            "the venv is not on pyenv's {VERSION}: {cfg}"
        );
        let site = project.join(format!(".venv/lib/python{}/site-packages", &VERSION[..4]));
        std::fs::write(site.join("agentlib.py"), "WHERE = 'the venv'\n").unwrap();
    }

    /// The lines an agent printed say it ran on pyenv's version, in the
    /// venv (`in_venv`, with its module) or not.
    fn assert_ran(&self, said: &str, project: &Path, in_venv: bool, ctx: &str) {
        let prefix =
            if in_venv { std::fs::canonicalize(project).unwrap().join(".venv") } else { self.version_dir() };
        let want = format!("python: {VERSION} {}", prefix.display());
        assert!(said.lines().any(|l| l == want), "{ctx}: not pyenv's {VERSION} ({want}):\n{said}");
        let lib = if in_venv { "agentlib: the venv" } else { "agentlib: missing" };
        assert!(said.lines().any(|l| l == lib), "{ctx}: {lib} expected:\n{said}");
    }
}

/// The report's and the audit log's automatic grants.
fn granted(report: &Value) -> Vec<(String, bool)> {
    report["sandbox"]["granted"]
        .as_array()
        .unwrap_or_else(|| panic!("no sandbox.granted in the report: {report}"))
        .iter()
        .map(|g| (g["path"].as_str().unwrap().to_owned(), g["direct_read"] == Value::Bool(true)))
        .collect()
}

/// `airlock run --allow-rw . -- .venv/bin/python agent.py`, `python3
/// agent.py` with pyenv's shims first on PATH, and `python3 agent.py`
/// with the venv activated (its `bin` first): no grant typed by hand, and
/// each runs pyenv's interpreter (in the venv where it should), reads its
/// data through airlock, and cannot read it directly. The report and the
/// audit log list each automatic grant with its reason.
#[test]
fn an_agent_in_a_venv_on_pyenv_runs_under_run_with_no_grant_typed() {
    let pyenv = Pyenv::get();
    let (dir, project) = project();
    pyenv.venv(&project);
    let venv_path = format!("{}/.venv/bin:{}", project.display(), pyenv.user_path());
    let real_project = std::fs::canonicalize(&project).unwrap();
    let version = pyenv.version_dir().display().to_string();
    for (i, (program, path, in_venv)) in [
        (".venv/bin/python", pyenv.user_path(), true),
        ("python3", pyenv.user_path(), false),
        ("python3", venv_path, true),
    ]
    .into_iter()
    .enumerate()
    {
        let ctx = format!("{program} with PATH={path}");
        let report = dir.path().join(format!("report{i}.json"));
        let audit = dir.path().join(format!("audit{i}.jsonl"));
        let (r, a) = (report.to_str().unwrap(), audit.to_str().unwrap());
        let args = ["--allow-rw", ".", "--report", r, "--audit", a, "--", program, "agent.py"];
        let out = run(&project, &args, Some(&path));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {stdout}{stderr}");
        pyenv.assert_ran(&stdout, &project, in_venv, &ctx);
        assert!(stdout.contains("via airlock: 0 the data"), "{ctx}: {stdout}{stderr}");
        // The rest of the root is served by airlock as a filesystem: the
        // agent's plain `open` is answered, and audited, by airlock.
        assert!(stdout.contains("direct: read"), "{ctx}: {stdout}{stderr}");
        assert_served_and_audited(&audit, &real_project.join("data.txt"), &ctx);
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let grants = granted(&report);
        let agent = real_project.join("agent.py").display().to_string();
        let venv = real_project.join(".venv").display().to_string();
        let mut want = vec![(version.clone(), false)];
        if in_venv {
            want.push((venv.clone(), true));
        }
        want.push((agent.clone(), true));
        want.sort();
        let mut got = grants.clone();
        got.sort();
        assert_eq!(got, want, "{ctx}: {report}");
        let direct: Vec<&str> =
            report["sandbox"]["direct_read"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(direct.contains(&agent.as_str()), "{ctx}: {report}");
        let audit = std::fs::read_to_string(&audit).unwrap();
        for (path, direct) in &want {
            let op = if *direct { "direct_read" } else { "grant" };
            assert!(
                audit.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).any(|l| l["op"] == op
                    && l["path"] == path.as_str()
                    && l["automatic"] == true
                    && l["reason"].as_str().is_some_and(|r| !r.is_empty())),
                "{ctx}: no {op} line for {path}: {audit}"
            );
        }
    }
}

/// `airlock tool` runs the same interpreters: the venv's python by path,
/// pyenv's through its shim, and the activated venv's.
#[test]
fn an_agent_in_a_venv_on_pyenv_runs_under_tool_with_no_grant_typed() {
    let pyenv = Pyenv::get();
    let (_dir, project) = project();
    pyenv.venv(&project);
    let venv_path = format!("{}/.venv/bin:{}", project.display(), pyenv.user_path());
    for (program, path, in_venv) in [
        (".venv/bin/python", pyenv.user_path(), true),
        ("python3", pyenv.user_path(), false),
        ("python3", venv_path, true),
    ] {
        let ctx = format!("tool {program} with PATH={path}");
        let out = airlock_in(&project, &["tool", "--", program, "tool_agent.py"], Some(&path));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {stdout}{stderr}");
        let j: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{ctx}: {e}: {stdout}"));
        assert_eq!(j["outcome"], "completed", "{ctx}: {j}\n{stderr}");
        let said = j["content"][0]["text"].as_str().unwrap_or_default();
        pyenv.assert_ran(said, &project, in_venv, &ctx);
        assert!(said.contains("data: the data"), "{ctx}: {said}");
        // Each automatic grant is said on stderr, the version's included.
        assert!(
            stderr.contains(&format!("granted read-only: {}", pyenv.version_dir().display())),
            "{ctx}: {stderr}"
        );
    }
}

/// `airlock toolexec serve` started with the user's PATH: `--tool
/// python3` runs pyenv's version through the shim, and a tool fixed to
/// the venv's python runs in the venv.
#[test]
fn an_agent_in_a_venv_on_pyenv_runs_under_toolexec_with_no_grant_typed() {
    let pyenv = Pyenv::get();
    let (_dir, project) = project();
    pyenv.venv(&project);
    let venv_py = format!("venvpy={}", project.join(".venv/bin/python").display());
    let mut server = Command::new(airlock())
        .current_dir(&project)
        .args(["toolexec", "serve", "--tool", "python3", "--tool", &venv_py])
        .env("AIFO_TOOLEEXEC_TOKEN", "agent-token")
        .env("PATH", pyenv.user_path())
        .env_remove("PYENV_VERSION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
    let Some(url) = url else {
        let _ = server.kill();
        panic!("toolexec serve printed no URL: {:?}", server.wait_with_output());
    };
    for (tool, in_venv) in [("python3", false), ("venvpy", true)] {
        let out = Command::new(airlock())
            .current_dir(&project)
            .args(["toolexec", "shim", tool, "direct_agent.py"])
            .env("AIFO_TOOLEEXEC_URL", &url)
            .env("AIFO_TOOLEEXEC_TOKEN", "agent-token")
            .output()
            .unwrap();
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{tool}: {said}");
        pyenv.assert_ran(&said, &project, in_venv, tool);
        assert!(said.contains("data: the data"), "{tool}: {said}");
    }
    // SAFETY: kill(2) on the server we started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let out = server.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("granted read-only: {}", pyenv.version_dir().display())), "{stderr}");
}

/// An attack across sessions: a child of an `--allow-rw .` session
/// rewrites the project's venv so that its `pyvenv.cfg` names a secret
/// directory of the user's as its base installation. The next session
/// run from that venv is refused before starting, naming the directory,
/// and nothing of it is read.
#[test]
fn a_venv_rewritten_by_an_earlier_session_widens_nothing() {
    let pyenv = Pyenv::get();
    let (dir, project) = project();
    pyenv.venv(&project);
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".secret")).unwrap();
    std::fs::write(home.join(".secret/key"), "the-users-secret\n").unwrap();
    let rewrite = format!(
        r#"printf 'home = {}\n' | "$AIRLOCK" fs write .venv/pyvenv.cfg"#,
        home.join(".secret").display()
    );
    let out = run(&project, &["--allow-rw", ".", "--", "sh", "-c", &rewrite], Some(&pyenv.user_path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let key = home.join(".secret/key").display().to_string();
    let out = Command::new(airlock())
        .current_dir(&project)
        .args(["run", "--allow-rw", ".", "--", ".venv/bin/python", "-c"])
        .arg(format!("print(open({key:?}).read())"))
        .env("PATH", pyenv.user_path())
        .env("HOME", &home)
        .env_remove("AIRLOCK_FD")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(125), "{stdout}{stderr}");
    assert!(!stdout.contains("the-users-secret"), "{stdout}");
    let secret = std::fs::canonicalize(home.join(".secret")).unwrap();
    assert!(stderr.contains(&format!("--sandbox-ro {}", secret.display())), "{stderr}");
}

// ------------------------------------------------ grants and refusals

#[test]
fn an_agent_granted_by_hand_is_listed_as_a_direct_read() {
    let (dir, project) = project();
    let report = dir.path().join("report.json");
    let audit = dir.path().join("audit.jsonl");
    let out = run(
        &project,
        &[
            "--allow-rw",
            ".",
            "--sandbox-ro",
            "agent.py",
            "--report",
            report.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
            "--",
            "/usr/bin/python3",
            "agent.py",
        ],
        None,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("via airlock: 0 the data"), "{stdout}{stderr}");
    // Only agent.py was granted: the rest of the root is still reached
    // through airlock alone, served as a filesystem and audited.
    assert!(stdout.contains("direct: read"), "{stdout}{stderr}");
    assert_served_and_audited(&audit, &std::fs::canonicalize(project.join("data.txt")).unwrap(), "by hand");
    let agent = std::fs::canonicalize(project.join("agent.py")).unwrap();
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["sandbox"]["fs"], "confined", "{report}");
    assert_eq!(report["sandbox"]["direct_read"], serde_json::json!([agent.to_str().unwrap()]), "{report}");
    // Granted by hand: nothing automatic.
    assert!(report["sandbox"].get("granted").is_none(), "{report}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    let first: Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    assert_eq!(first["op"], "direct_read", "{audit}");
    assert_eq!(first["path"], agent.to_str().unwrap(), "{audit}");
    // The proxied read is in the log too, after it.
    assert!(audit.lines().skip(1).any(|l| l.contains("data.txt")), "{audit}");
}

/// An argument that is a file inside an allowed root is never refused,
/// whether the child reads it through airlock or directly; one outside
/// every root is a warning on stderr, and the child starts.
#[test]
fn arguments_inside_a_root_are_granted_and_outside_every_root_warned_about() {
    let (dir, project) = project();
    let out = run(
        &project,
        &["--allow", ".", "--", "sh", "-c", r#""$AIRLOCK" fs cat "$1""#, "sh", "data.txt"],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "the data\n");

    let out = run(&project, &["--allow", ".", "--", "cat", "data.txt"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "the data\n");

    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "outside\n").unwrap();
    let out = run(&project, &["--allow", ".", "--", "cat", outside.to_str().unwrap()], None);
    let stderr = text(&out.stderr);
    // The child started, and its own read failed.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Permission denied") || stderr.contains("No such file"), "{stderr}");
    assert!(
        stderr.contains("airlock: warning:") && stderr.contains("outside every allowed root"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("--sandbox-ro {}", outside.display())), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// A relative script inside the root runs, granted as a direct read and
/// named without `./`; a program airlock does not grant on its own (a
/// shim it does not know, outside every root) is refused before starting,
/// naming exactly what to pass; granted by hand, that shim runs, and says
/// so.
#[test]
fn a_program_airlock_does_not_grant_is_refused_naming_it_exactly() {
    let (dir, project) = project();
    let script = project.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho run.sh ran\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let report = dir.path().join("run-report.json");
    let out = run(&project, &["--allow", ".", "--report", report.to_str().unwrap(), "--", "./run.sh"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "run.sh ran\n");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let real = std::fs::canonicalize(&script).unwrap();
    assert_eq!(granted(&report), [(real.display().to_string(), true)], "{report}");

    let shims = dir.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let shim = shims.join("python3");
    std::fs::write(&shim, "#!/bin/sh\necho shim ran >&2\nexec /usr/bin/python3 \"$@\"\n").unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", shims.display());
    let out = run(&project, &["--allow-rw", ".", "--", "python3", "agent.py"], Some(&path));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(&format!("pass --sandbox-ro {}", shim.display())), "{stderr}");
    assert!(!stderr.contains("/./") && !stderr.contains("found later"), "{stderr}");
    assert!(out.stdout.is_empty(), "another python3 ran: {}", text(&out.stdout));

    let args = ["--allow-rw", ".", "--sandbox-ro", shims.to_str().unwrap(), "--", "python3", "agent.py"];
    let out = run(&project, &args, Some(&path));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("shim ran"), "the shim did not run: {stderr}");
    assert!(stdout.contains("via airlock: 0 the data"), "{stdout}{stderr}");
}

#[test]
fn sandbox_ro_of_the_root_or_above_it_is_refused_naming_the_root() {
    let (_dir, project) = project();
    let root = std::fs::canonicalize(&project).unwrap();
    for ro in [".", ".."] {
        let out = run(&project, &["--allow-rw", ".", "--sandbox-ro", ro, "--", "python3", "agent.py"], None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{ro}: {stderr}");
        assert!(stderr.contains(root.to_str().unwrap()), "{ro}: {stderr}");
        assert!(stderr.contains("expose the whole root"), "{ro}: {stderr}");
        assert!(out.stdout.is_empty(), "{ro}: {}", text(&out.stdout));
    }
}

/// `--sandbox-rw PATH` outside every root (a toolchain's cache): the child
/// writes there directly, and the file is on the host afterwards; the same
/// flag on the root itself, inside it or above it is refused naming the
/// root, before anything starts.
#[test]
fn sandbox_rw_outside_the_roots_is_written_directly_and_over_a_root_is_refused() {
    let (dir, project) = project();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cache_arg = cache.to_str().unwrap();
    let out = run(
        &project,
        &[
            "--allow-rw",
            ".",
            "--sandbox-rw",
            cache_arg,
            "--",
            "sh",
            "-c",
            &format!("echo built > {cache_arg}/out"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(cache.join("out")).unwrap(), "built\n");
    for over in [".", "sub", ".."] {
        std::fs::create_dir_all(project.join("sub")).unwrap();
        let marker = dir.path().join("started");
        let script = format!("touch {}", marker.display());
        let out = run(&project, &["--allow-rw", ".", "--sandbox-rw", over, "--", "sh", "-c", &script], None);
        assert_eq!(out.status.code(), Some(125), "--sandbox-rw {over}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("--sandbox-rw") && err.contains("overlaps the allowed root"), "{over}: {err}");
        assert!(!marker.exists(), "--sandbox-rw {over}: the child started");
    }
}
