//! What the terminal, socket-directory, fallback-network and bounds suites
//! share: each attack runs in both modes (namespaces, and the forced
//! fallback) and as both users (root, as CI runs, and uid/gid 65534). For
//! the unprivileged user the binary and the attack scripts are copied into
//! a fresh directory it can read and execute, and the project directory
//! is its own.

#![allow(dead_code)]

use crate::common::SYSTEM_PATH;
use crate::confine_common::{Mode, NO_NAMESPACES};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Who runs airlock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Root,
    /// uid and gid 65534.
    Nobody,
}

pub const NOBODY: u32 = 65534;

pub const WHOS: [Who; 2] = [Who::Root, Who::Nobody];

impl Who {
    pub fn ids(self) -> (u32, u32) {
        match self {
            Who::Root => (0, 0),
            Who::Nobody => (NOBODY, NOBODY),
        }
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid takes nothing.
    unsafe { libc::geteuid() == 0 }
}

/// Every (mode, who) pair, in a fixed order.
pub fn cases() -> Vec<(Mode, Who)> {
    assert!(is_root(), "these suites run as root (as CI does), to run airlock as root and as uid 65534");
    let mut v = Vec::new();
    for who in WHOS {
        for mode in crate::confine_common::MODES {
            v.push((mode, who));
        }
    }
    v
}

pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn chown(p: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

/// A fresh directory holding a copy of the binary and of the attack
/// scripts (readable by anyone) and a project directory owned by `who`.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub bin: PathBuf,
    pub attacks: PathBuf,
    pub project: PathBuf,
    pub who: Who,
}

impl Fixture {
    pub fn new(who: Who) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        chmod(&root, 0o755);
        std::fs::create_dir(root.join("bin")).unwrap();
        chmod(&root.join("bin"), 0o755);
        let bin = root.join("bin/airlock");
        std::fs::copy(crate::common::airlock(), &bin).unwrap();
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
        let project = root.join("project");
        std::fs::create_dir(&project).unwrap();
        chmod(&project, 0o755);
        chown(&project, who.ids());
        Fixture { tmp, root, bin, attacks, project, who }
    }

    /// `python3 attacks/SCRIPT ARGS…`
    pub fn attack(&self, script: &str, args: &[String]) -> Vec<String> {
        let mut v = vec!["python3".to_owned(), self.attacks.join(script).display().to_string()];
        v.extend(args.iter().cloned());
        v
    }

    /// The copied airlock run by `who` under `mode`, in the project, with
    /// a plain environment: `airlock run --sandbox-ro ATTACKS ARGS
    /// --report REPORT -- CMD`. stdin is /dev/null unless the caller sets
    /// it.
    pub fn run_command(&self, mode: Mode, args: &[&str], report: &Path, cmd: &[String]) -> Command {
        self.run_wrapped(mode, &[], args, report, cmd)
    }

    /// [`Fixture::run_command`] behind `wrap` (see [`Fixture::wrapped`]).
    pub fn run_wrapped(
        &self,
        mode: Mode,
        wrap: &[String],
        args: &[&str],
        report: &Path,
        cmd: &[String],
    ) -> Command {
        let mut c = self.wrapped(mode, wrap);
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

    /// The copied airlock as `who` under `mode`; the caller adds arguments.
    pub fn airlock(&self, mode: Mode) -> Command {
        self.wrapped(mode, &[])
    }

    /// `wrap` (a program and its arguments, ending where airlock's path
    /// goes) in front of the copied airlock, as `who` under `mode`.
    pub fn wrapped(&self, mode: Mode, wrap: &[String]) -> Command {
        let mut c = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        c.current_dir(&self.project)
            .env_clear()
            .env("PATH", SYSTEM_PATH)
            .env("HOME", &self.project)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null());
        if mode == Mode::Fallback {
            c.env(NO_NAMESPACES, "1");
        }
        if self.who == Who::Nobody {
            let (uid, gid) = self.who.ids();
            c.uid(uid).gid(gid);
        }
        c
    }

    pub fn report_path(&self) -> PathBuf {
        self.project.join(format!("report-{}.json", crate::confine_common::unique()))
    }
}

/// The report at `path`, or a panic naming what airlock said.
pub fn read_report(path: &Path, ctx: &str, stderr: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{ctx}: no report ({e}): {stderr}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{ctx}: an unfinished report ({e}): {stderr}"))
}

/// `[label, outcome, detail]` lines among `text`'s lines → label → outcome.
pub fn outcomes(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .filter_map(|l| match l {
            serde_json::Value::Array(v) if v.len() == 3 => {
                Some((v[0].as_str()?.to_owned(), v[1].as_str()?.to_owned()))
            }
            _ => None,
        })
        .inspect(|(label, o)| assert_ne!(o, "broken", "attack {label:?} is broken: {text}"))
        .collect()
}

/// The outcome of `label`; an attack that never tried it fails the test.
pub fn outcome<'a>(got: &'a std::collections::BTreeMap<String, String>, label: &str) -> &'a str {
    got.get(label).unwrap_or_else(|| panic!("the attack never tried {label:?}: {got:?}"))
}
