//! A confined child's command line, checked before it starts.
//!
//! Which program `execvp` will find on the child's `PATH`, and what that
//! program really runs: its symlinks followed, a script's interpreter
//! (`#!/usr/bin/env NAME` looked up as `env` will), a virtual
//! environment's base interpreter (`pyvenv.cfg`'s `home`), and a version
//! manager's shim (pyenv, rbenv, nodenv) resolved to the version it
//! selects, as `pyenv which` would, from the version variable, the local
//! version files up from the working directory and the global version
//! file. Each file of that chain the sandbox does not already let the
//! child run is either granted read-only here, with its reason (listed in
//! the report and the audit log), or named exactly in a refusal: the child
//! never silently runs another interpreter found later on `PATH`.
//!
//! Files named as arguments are read by the child directly: one inside an
//! allowed root that the policy lets the child read is granted as a direct
//! read (listed); any other is a warning, never a refusal (the child may
//! well read it through airlock).
//!
//! The decision is a pure function of the command, the ruleset, the roots
//! and what the shell read from the filesystem ([`Facts`]). It asks for
//! one more fact at a time ([`Step::Ask`]); the shell answers and calls
//! again, until the answer is complete ([`Step::Done`]). Nothing here
//! runs a version manager: its shim is read, and its files.

use super::{Ruleset, Use};
use crate::policy::normalize;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Interpreters a program may pass through (a shim, a script, `env`, the
/// interpreter): a longer chain is refused.
pub const MAX_HOPS: usize = 8;

/// Facts the shell may be asked for one command: a bound on the loop that
/// answers them, far above what any real chain needs.
pub const MAX_ASKS: usize = 4096;

/// Arguments checked as files: beyond them, none is granted and one
/// warning says so (each fact costs a call of [`check`], which starts
/// over).
pub const MAX_ARGS: usize = 256;

/// Bytes of a file the resolution reads: a shim, a shebang line,
/// `pyvenv.cfg` and a version file all fit.
pub const HEAD_BYTES: usize = 4096;

/// Names of a version manager's `versions` directory that are read, for a
/// version given by prefix (`3.11` for the newest `3.11.x`).
pub const MAX_LISTED: usize = 4096;

/// The glibc `execvp` default when `PATH` is unset.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// One thing the shell is asked to read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ask {
    /// Follow `path` through every symlink: the resolved path and what is
    /// there, or nothing when it does not exist.
    Stat(PathBuf),
    /// The first [`HEAD_BYTES`] of the regular file at `path` (through
    /// symlinks), or nothing.
    Read(PathBuf),
    /// The names in the directory `path` (at most [`MAX_LISTED`]).
    List(PathBuf),
}

/// What a path leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file; `exec`: some execute bit is set.
    File {
        exec: bool,
    },
    Dir,
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Absolute, every symlink resolved.
    pub real: PathBuf,
    pub kind: Kind,
}

/// The shell's answer to one [`Ask`] (of the same kind).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Stat(Option<Stat>),
    Bytes(Option<Vec<u8>>),
    Names(Option<Vec<String>>),
}

/// What the shell read so far.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    answers: BTreeMap<Ask, Answer>,
}

impl Facts {
    pub fn give(&mut self, ask: Ask, answer: Answer) {
        self.answers.insert(ask, answer);
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

/// The command to check.
#[derive(Clone, Copy, Debug)]
pub struct Command<'a> {
    pub argv: &'a [OsString],
    /// The child's working directory (absolute).
    pub cwd: &'a Path,
    /// The child's environment, as it will get it (only `PATH`, `HOME` and
    /// the version managers' variables are read).
    pub env: &'a BTreeMap<OsString, OsString>,
    /// The airlock binary (resolved): its arguments are paths for the
    /// proxy, not files the child reads.
    pub airlock: Option<&'a Path>,
}

/// The allowed roots, which the child reaches through airlock.
pub struct Roots<'a> {
    /// Resolved, absolute.
    pub dirs: &'a [PathBuf],
    /// Whether the policy lets the child read the resolved path, which
    /// lies inside one of `dirs`.
    pub readable: &'a dyn Fn(&Path) -> bool,
    /// A file named as an argument outside every root is granted (the
    /// tool host's script, wherever the user keeps it) rather than warned
    /// about (`airlock run`, whose child may read it through airlock).
    pub grant_outside: bool,
}

/// A location granted read and execute on the program's behalf.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoGrant {
    pub path: PathBuf,
    /// Why: which link of the chain, or which argument, needs it.
    pub reason: String,
    /// Inside an allowed root: the child reads it past the proxy's audit
    /// log.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct_read: bool,
}

/// The command, once checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Run this instead of `argv[0]`: a shim named by its path, resolved.
    pub program: Option<PathBuf>,
    /// Variables to set in the child's environment, as the version
    /// manager's `exec` does: its version's `bin` first on `PATH`.
    pub env: Vec<(OsString, OsString)>,
    pub grants: Vec<AutoGrant>,
    /// Arguments the child cannot read directly, each said once.
    pub warnings: Vec<String>,
}

/// The next step of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Ask(Ask),
    Done(Checked),
}

/// Why the command is refused before it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A file of the chain the child may not run, and airlock grants on
    /// its own only installations, virtual environments and files inside a
    /// root.
    Unreachable { name: String, what: String, path: PathBuf, real: PathBuf, install: Option<PathBuf> },
    /// A file of the chain inside an allowed root that the policy refuses
    /// the child.
    PolicyRefuses { name: String, path: PathBuf },
    /// A location of the chain is an allowed root or lies above one: the
    /// child would reach the whole root directly.
    OverlapsRoot { name: String, path: PathBuf, root: PathBuf },
    /// A shim's version is not installed.
    NotInstalled { name: String, manager: &'static str, version: String, origin: String, root: PathBuf },
    /// No version the shim selects has the command, nor the system.
    NoCommand { name: String, manager: &'static str, versions: String, origin: String },
    /// More than [`MAX_HOPS`] interpreters.
    TooDeep { name: String },
    /// A venv's `home` that its interpreter does not lie in, or that lies
    /// where installations are not granted on their own.
    VenvHome { name: String, venv: PathBuf, home: PathBuf },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Unreachable { name, what, path, real, install } => {
                write!(f, "the program {name} runs {what} {}", path.display())?;
                if real != path {
                    write!(f, " (really {})", real.display())?;
                }
                write!(
                    f,
                    ", which the sandboxed child may not run and airlock does not grant on its own; \
                     pass --sandbox-ro {}",
                    real.display()
                )?;
                if let Some(dir) = install {
                    write!(f, " (or its installation, --sandbox-ro {})", dir.display())?;
                }
                Ok(())
            }
            Refused::PolicyRefuses { name, path } => write!(
                f,
                "the program {name} runs {}, inside an allowed root, which airlock's policy refuses the child",
                path.display()
            ),
            Refused::OverlapsRoot { name, path, root } => write!(
                f,
                "the program {name} needs {}, which would expose the whole allowed root {} to the child; \
                 grant what it needs inside the root with --sandbox-ro",
                path.display(),
                root.display()
            ),
            Refused::NotInstalled { name, manager, version, origin, root } => write!(
                f,
                "the program {name} is {manager}'s shim, and {manager} version {version} (set by {origin}) \
                 is not installed in {}",
                root.join("versions").display()
            ),
            Refused::NoCommand { name, manager, versions, origin } => write!(
                f,
                "the program {name} is {manager}'s shim, and neither {manager} version {versions} (set by \
                 {origin}) nor the system has {name}"
            ),
            Refused::VenvHome { name, venv, home } => write!(
                f,
                "the program {name} runs in the virtual environment {}, whose pyvenv.cfg names the base \
                 installation {}; airlock grants one on its own only when the interpreter lies in it and \
                 it is not right in your home directory; pass --sandbox-ro {} if you trust it",
                venv.display(),
                home.display(),
                home.display()
            ),
            Refused::TooDeep { name } => {
                write!(f, "the program {name} passes through more than {MAX_HOPS} interpreters")
            }
        }
    }
}

impl std::error::Error for Refused {}

/// The next fact needed, or the answer.
pub fn check(cmd: &Command<'_>, rules: &Ruleset, roots: &Roots<'_>, facts: &Facts) -> Result<Step, Refused> {
    let mut walk = Walk { cmd, rules, roots, facts, out: Checked::default(), prepend: Vec::new() };
    match walk.run() {
        Ok(()) => {
            if !walk.prepend.is_empty() {
                walk.out.env.push((OsString::from("PATH"), walk.child_path()));
            }
            Ok(Step::Done(walk.out))
        }
        Err(Stop::Ask(ask)) => Ok(Step::Ask(ask)),
        Err(Stop::Refused(r)) => Err(r),
    }
}

enum Stop {
    Ask(Ask),
    Refused(Refused),
}

type R<T> = Result<T, Stop>;

/// A version manager whose shims are read: `root_var` names its root in
/// the shim, `version_var` the version selected by the environment.
struct Manager {
    name: &'static str,
    root_var: &'static str,
    version_var: &'static str,
    dir_var: &'static str,
    local_file: &'static str,
}

const MANAGERS: &[Manager] = &[
    Manager {
        name: "pyenv",
        root_var: "PYENV_ROOT",
        version_var: "PYENV_VERSION",
        dir_var: "PYENV_DIR",
        local_file: ".python-version",
    },
    Manager {
        name: "rbenv",
        root_var: "RBENV_ROOT",
        version_var: "RBENV_VERSION",
        dir_var: "RBENV_DIR",
        local_file: ".ruby-version",
    },
    Manager {
        name: "nodenv",
        root_var: "NODENV_ROOT",
        version_var: "NODENV_VERSION",
        dir_var: "NODENV_DIR",
        local_file: ".node-version",
    },
];

/// The environment variables [`check`] reads.
pub fn env_read() -> impl Iterator<Item = &'static str> {
    ["PATH", "HOME"].into_iter().chain(MANAGERS.iter().flat_map(|m| [m.version_var, m.dir_var]))
}

/// A shim of `manager` whose root is `root`.
struct Shim {
    manager: &'static Manager,
    root: PathBuf,
}

/// Whether `head` is a version manager's shim: it exports the manager's
/// root and execs `ROOT…/libexec/NAME exec "$program"`.
fn shim(head: &[u8]) -> Option<Shim> {
    let text = std::str::from_utf8(head).ok()?;
    MANAGERS.iter().find_map(|m| {
        let export = format!("export {}=", m.root_var);
        let root = text.lines().find_map(|l| l.trim().strip_prefix(export.as_str()))?;
        let root = root.trim().trim_matches('"');
        let exec = format!("/libexec/{}\" exec \"$program\"", m.name);
        let execs = text.lines().any(|l| l.trim_start().starts_with("exec \"") && l.contains(&exec));
        (execs && root.starts_with('/')).then(|| Shim { manager: m, root: PathBuf::from(root) })
    })
}

/// A shebang's interpreter and its one argument (the kernel passes the
/// rest of the line as one).
fn shebang(head: &[u8]) -> Option<(PathBuf, Option<String>)> {
    let line = head.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|b| *b == b'\n')?];
    let line = std::str::from_utf8(line).ok()?.trim();
    let (interp, arg) = match line.split_once([' ', '\t']) {
        Some((i, a)) => (i, Some(a.trim().to_owned()).filter(|a| !a.is_empty())),
        None => (line, None),
    };
    (!interp.is_empty()).then(|| (PathBuf::from(interp), arg))
}

/// The command `env ARG` runs: its first word that is no option (`-S`
/// splits the rest into words).
fn env_command(arg: &str) -> Option<&str> {
    let mut words = arg.split_whitespace();
    loop {
        let w = words.next()?;
        if w == "-S" || w == "--split-string" {
            continue;
        }
        if w.starts_with('-') || w.contains('=') {
            return None;
        }
        return Some(w);
    }
}

/// A version file's versions, as `pyenv version-file-read` reads them:
/// the first word of each line, skipping empty lines, comments, and
/// versions that would leave the `versions` directory.
fn versions_in(text: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|v| !v.starts_with('#') && safe_version(v))
        .map(str::to_owned)
        .collect()
}

fn safe_version(v: &str) -> bool {
    !v.is_empty() && v != "." && v != ".." && !v.contains('/') && !v.contains('\0')
}

/// Numbers of a version name made of digits and dots only.
fn numeric(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|p| p.parse().ok()).collect()
}

/// `pyvenv.cfg`'s `home`.
fn venv_home(text: &[u8]) -> Option<PathBuf> {
    String::from_utf8_lossy(text).lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "home").then(|| PathBuf::from(v.trim())).filter(|p| p.is_absolute())
    })
}

fn name_of(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

struct Walk<'a> {
    cmd: &'a Command<'a>,
    rules: &'a Ruleset,
    roots: &'a Roots<'a>,
    facts: &'a Facts,
    out: Checked,
    /// Version directories to put first on the child's PATH, in order.
    prepend: Vec<PathBuf>,
}

impl Walk<'_> {
    fn run(&mut self) -> R<()> {
        let Some(prog) = self.cmd.argv.first() else { return Ok(()) };
        let path = self.env("PATH").unwrap_or_else(|| OsString::from(DEFAULT_PATH));
        // Not found: the child's exec fails with 127, as it would anyway.
        let Some(found) = self.find(prog, &path)? else { return Ok(()) };
        let name = prog.to_string_lossy().into_owned();
        let airlock = self.program(found, &name, 0)?;
        if !airlock {
            self.arguments()?;
        }
        Ok(())
    }

    fn env(&self, key: &str) -> Option<OsString> {
        self.cmd.env.get(OsStr::new(key)).filter(|v| !v.is_empty()).cloned()
    }

    fn abs(&self, p: &Path) -> PathBuf {
        let joined = self.cmd.cwd.join(p);
        normalize(&joined).unwrap_or(joined)
    }

    fn stat(&self, p: &Path) -> R<Option<Stat>> {
        match self.facts.answers.get(&Ask::Stat(p.to_path_buf())) {
            Some(Answer::Stat(s)) => Ok(s.clone()),
            Some(_) => Ok(None),
            None => Err(Stop::Ask(Ask::Stat(p.to_path_buf()))),
        }
    }

    fn read(&self, p: &Path) -> R<Option<Vec<u8>>> {
        match self.facts.answers.get(&Ask::Read(p.to_path_buf())) {
            Some(Answer::Bytes(b)) => Ok(b.clone()),
            Some(_) => Ok(None),
            None => Err(Stop::Ask(Ask::Read(p.to_path_buf()))),
        }
    }

    fn list(&self, p: &Path) -> R<Vec<String>> {
        match self.facts.answers.get(&Ask::List(p.to_path_buf())) {
            Some(Answer::Names(n)) => Ok(n.clone().unwrap_or_default()),
            Some(_) => Ok(Vec::new()),
            None => Err(Stop::Ask(Ask::List(p.to_path_buf()))),
        }
    }

    fn runnable(&self, p: &Path) -> R<bool> {
        Ok(matches!(self.stat(p)?, Some(Stat { kind: Kind::File { exec: true }, .. })))
    }

    /// Where `execvp` finds `prog` along `path`.
    fn find(&self, prog: &OsStr, path: &OsStr) -> R<Option<PathBuf>> {
        if prog.is_empty() {
            return Ok(None);
        }
        if prog.as_bytes().contains(&b'/') {
            let p = self.abs(Path::new(prog));
            return Ok(self.runnable(&p)?.then_some(p));
        }
        for dir in path.as_bytes().split(|b| *b == b':') {
            let dir = if dir.is_empty() {
                self.cmd.cwd.to_path_buf()
            } else {
                self.abs(Path::new(OsStr::from_bytes(dir)))
            };
            let p = dir.join(prog);
            if self.runnable(&p)? {
                return Ok(Some(p));
            }
        }
        Ok(None)
    }

    /// The child's PATH with the version directories found so far first.
    fn child_path(&self) -> OsString {
        let mut out = Vec::new();
        for p in &self.prepend {
            out.extend_from_slice(p.as_os_str().as_bytes());
            out.push(b':');
        }
        let rest = self.env("PATH").unwrap_or_else(|| OsString::from(DEFAULT_PATH));
        out.extend_from_slice(rest.as_bytes());
        OsString::from_vec(out)
    }

    fn covered(&self, p: &Path, use_: Use) -> bool {
        self.rules.permits(p, use_) || self.out.grants.iter().any(|g| p.starts_with(&g.path))
    }

    fn home(&self) -> Option<PathBuf> {
        self.env("HOME").map(PathBuf::from).and_then(|h| normalize(&h)).filter(|h| h.is_absolute())
    }

    /// The allowed root `p` lies strictly inside.
    fn inside_root(&self, p: &Path) -> Option<&PathBuf> {
        self.roots.dirs.iter().find(|r| p.starts_with(r) && p != r.as_path())
    }

    /// The allowed root `p` is, or lies above.
    fn over_root(&self, p: &Path) -> Option<&PathBuf> {
        self.roots.dirs.iter().find(|r| r.starts_with(p))
    }

    /// Whether airlock grants the directory `p` (an installation, a
    /// virtual environment) on its own: not `/`, not the home directory
    /// or above it, nor, unless `in_home` allows it, a directory directly
    /// in the home (`~/.local`, `~/.cargo`: such places hold credentials
    /// beside their programs).
    fn grantable(&self, p: &Path, in_home: bool) -> bool {
        if p.components().count() < 3 {
            return false;
        }
        if let Some(home) = self.home() {
            if home.starts_with(p) || (!in_home && p.parent() == Some(home.as_path())) {
                return false;
            }
        }
        true
    }

    fn grant(&mut self, path: PathBuf, reason: String, direct_read: bool) {
        if !self.out.grants.iter().any(|g| g.path == path) {
            self.out.grants.push(AutoGrant { path, reason, direct_read });
        }
    }

    /// Walk the chain from `found` (as `execvp` found it). Whether it is
    /// the airlock binary itself.
    fn program(&mut self, found: PathBuf, name: &str, hops: usize) -> R<bool> {
        if hops > MAX_HOPS {
            return Err(Stop::Refused(Refused::TooDeep { name: name.to_owned() }));
        }
        let Some(st) = self.stat(&found)? else { return Ok(false) };
        let real = st.real;
        if self.cmd.airlock == Some(real.as_path()) {
            return Ok(true);
        }
        let head = self.read(&real)?.unwrap_or_default();
        if let Some(shim) = shim(&head) {
            let target = self.shim_target(&shim, name, &found)?;
            if hops == 0 && self.cmd.argv.first().is_some_and(|p| p.as_bytes().contains(&b'/')) {
                // Named by its path, the shim itself would run: run what it
                // selects instead.
                self.out.program = Some(target.clone());
            }
            self.program(target, name, hops + 1)?;
            return Ok(false);
        }
        if let Some((interp, arg)) = head.starts_with(b"#!").then(|| shebang(&head)).flatten() {
            self.need(&real, &found, name, "the script")?;
            let interp = self.abs(&interp);
            let env_cmd = (interp.file_name() == Some(OsStr::new("env")))
                .then(|| arg.as_deref().and_then(env_command).map(str::to_owned))
                .flatten();
            self.program(interp, name, hops + 1)?;
            if let Some(cmd) = env_cmd {
                // `env` looks the command up on the child's PATH, shims
                // resolved so far first.
                if let Some(f) = self.find(OsStr::new(&cmd), &self.child_path())? {
                    self.program(f, &cmd, hops + 1)?;
                }
            }
            return Ok(false);
        }
        self.need(&real, &found, name, "the program")?;
        self.venv(&found, &real, name)?;
        Ok(false)
    }

    /// `real` (as `found`) must be runnable by the child: already, or by a
    /// grant of its own (inside a root) or of its installation.
    fn need(&mut self, real: &Path, found: &Path, name: &str, what: &str) -> R<()> {
        if self.covered(real, Use::Execute) {
            return Ok(());
        }
        if let Some(root) = self.inside_root(real).cloned() {
            if !(self.roots.readable)(real) {
                return Err(Stop::Refused(Refused::PolicyRefuses {
                    name: name.to_owned(),
                    path: found.into(),
                }));
            }
            let reason = format!("{what} {name} runs, inside the allowed root {}", root.display());
            self.grant(real.to_path_buf(), reason, true);
            return Ok(());
        }
        let install = real
            .parent()
            .filter(|d| d.file_name() == Some(OsStr::new("bin")))
            .and_then(Path::parent)
            .map(Path::to_path_buf);
        if let Some(dir) =
            install.as_ref().filter(|d| self.inside_root(d).is_none() && self.over_root(d).is_none())
        {
            if self.grantable(dir, false) {
                let reason = format!("the installation of {}, which {name} runs", real.display());
                self.grant(dir.clone(), reason, false);
                return Ok(());
            }
        }
        if self.roots.grant_outside {
            let reason = format!("{what} {name} runs, named on the command line");
            self.grant(real.to_path_buf(), reason, false);
            return Ok(());
        }
        Err(Stop::Refused(Refused::Unreachable {
            name: name.to_owned(),
            what: what.to_owned(),
            path: found.to_path_buf(),
            real: real.to_path_buf(),
            install,
        }))
    }

    /// A directory the interpreter reads (a virtual environment, its base
    /// installation), granted read-only unless already reachable.
    fn need_dir(&mut self, dir: &Path, name: &str, reason: String) -> R<()> {
        if self.covered(dir, Use::Read) {
            return Ok(());
        }
        if let Some(root) = self.over_root(dir).cloned() {
            let path = dir.to_path_buf();
            return Err(Stop::Refused(Refused::OverlapsRoot { name: name.to_owned(), path, root }));
        }
        if self.inside_root(dir).is_some() {
            if !(self.roots.readable)(dir) {
                return Err(Stop::Refused(Refused::PolicyRefuses {
                    name: name.to_owned(),
                    path: dir.into(),
                }));
            }
            self.grant(dir.to_path_buf(), reason, true);
            return Ok(());
        }
        if !self.grantable(dir, true) {
            return Err(Stop::Refused(Refused::Unreachable {
                name: name.to_owned(),
                what: "files in".to_owned(),
                path: dir.to_path_buf(),
                real: dir.to_path_buf(),
                install: None,
            }));
        }
        self.grant(dir.to_path_buf(), reason, false);
        Ok(())
    }

    /// A Python virtual environment around `found`: `pyvenv.cfg` beside
    /// the executable or one directory up, as Python looks for it from the
    /// path it was run by.
    fn venv(&mut self, found: &Path, interpreter: &Path, name: &str) -> R<()> {
        let Some(dir) = found.parent() else { return Ok(()) };
        let candidates: Vec<PathBuf> =
            [Some(dir), dir.parent()].into_iter().flatten().map(|d| d.join("pyvenv.cfg")).collect();
        for cfg in candidates {
            let Some(text) = self.read(&cfg)? else { continue };
            let Some(venv) = cfg.parent() else { continue };
            let real = self.stat(venv)?.map_or_else(|| venv.to_path_buf(), |s| s.real);
            let reason = format!("the virtual environment {} that {name} runs in", venv.display());
            self.need_dir(&real, name, reason)?;
            // The base installation the venv's `home` names, where Python
            // finds its standard library. A venv inside a writable root is
            // the child's to rewrite between sessions, so `home` is taken
            // only as far as the interpreter itself vouches for it: the
            // real interpreter must lie in it, and it is granted as any
            // installation is (away from the home's top and the roots).
            if let Some(home) = venv_home(&text) {
                if let Some(st) = self.stat(&home)? {
                    let base = match st.real.file_name() {
                        Some(n) if n == "bin" => st.real.parent().map_or(st.real.clone(), Path::to_path_buf),
                        _ => st.real.clone(),
                    };
                    let vouched = interpreter.starts_with(&st.real) && interpreter != st.real;
                    if self.covered(&base, Use::Read) {
                        // Already reachable: the system's, or granted.
                    } else if vouched
                        && self.grantable(&base, false)
                        && self.inside_root(&base).is_none()
                        && self.over_root(&base).is_none()
                    {
                        let reason = format!(
                            "the base interpreter of the virtual environment {} (its pyvenv.cfg home)",
                            venv.display()
                        );
                        self.grant(base, reason, false);
                    } else {
                        return Err(Stop::Refused(Refused::VenvHome {
                            name: name.to_owned(),
                            venv: venv.to_path_buf(),
                            home: base.clone(),
                        }));
                    }
                }
            }
            return Ok(());
        }
        Ok(())
    }

    /// What a version manager's shim runs for `name`, as `NAME which`
    /// finds it; the version's `bin` goes first on the child's PATH, as
    /// `NAME exec` puts it (its version variable is not set: the shim is
    /// not run again inside, and the tool host passes no such variable).
    fn shim_target(&mut self, shim: &Shim, name: &str, found: &Path) -> R<PathBuf> {
        let m = shim.manager;
        let cmd_name = name_of(Path::new(name));
        let (versions, origin) = self.selected(shim)?;
        let versions_dir = shim.root.join("versions");
        let mut missing = Vec::new();
        let mut resolved = Vec::new();
        for v in &versions {
            if v == "system" {
                resolved.push(v.clone());
                continue;
            }
            match self.installed(&versions_dir, v)? {
                Some(real) => resolved.push(real),
                None => missing.push(v.clone()),
            }
        }
        for v in &resolved {
            if v == "system" {
                continue;
            }
            let bin = versions_dir.join(v).join("bin");
            let p = bin.join(&cmd_name);
            if self.runnable(&p)? {
                // Through the version's own symlinks: the child's view has
                // the directory at its resolved path.
                let bin = self.stat(&bin)?.map_or(bin, |s| s.real);
                self.prepend.push(bin.clone());
                return Ok(bin.join(&cmd_name));
            }
        }
        if let Some(v) = missing.first() {
            return Err(Stop::Refused(Refused::NotInstalled {
                name: name.to_owned(),
                manager: m.name,
                version: v.clone(),
                origin,
                root: shim.root.clone(),
            }));
        }
        // The system's: the next on PATH past the shims' directory.
        let shims = found.parent().map(Path::to_path_buf).unwrap_or_default();
        let path = self.env("PATH").unwrap_or_else(|| OsString::from(DEFAULT_PATH));
        let rest: Vec<&[u8]> = path
            .as_bytes()
            .split(|b| *b == b':')
            .filter(|d| self.abs(Path::new(OsStr::from_bytes(d))) != shims && !d.is_empty())
            .collect();
        let rest = OsString::from_vec(rest.join(&b':'));
        match self.find(OsStr::new(&cmd_name), &rest)? {
            Some(p) => Ok(p),
            None => Err(Stop::Refused(Refused::NoCommand {
                name: name.to_owned(),
                manager: m.name,
                versions: versions.join(":"),
                origin,
            })),
        }
    }

    /// The versions a shim selects and what set them: the manager's
    /// variable, else the nearest local version file up from its directory
    /// variable or the working directory, else the global version file,
    /// else `system`.
    fn selected(&self, shim: &Shim) -> R<(Vec<String>, String)> {
        let m = shim.manager;
        if let Some(v) = self.env(m.version_var) {
            let list: Vec<String> =
                v.to_string_lossy().split(':').filter(|v| safe_version(v)).map(str::to_owned).collect();
            if !list.is_empty() {
                return Ok((list, format!("the {} variable", m.version_var)));
            }
        }
        let mut starts = Vec::new();
        if let Some(d) = self.env(m.dir_var) {
            starts.push(self.abs(Path::new(&d)));
        }
        starts.push(self.cmd.cwd.to_path_buf());
        for start in starts {
            let mut dir = Some(start.as_path());
            while let Some(d) = dir {
                let file = d.join(m.local_file);
                if let Some(text) = self.read(&file)? {
                    return Ok((Self::or_system(versions_in(&text)), file.display().to_string()));
                }
                dir = d.parent();
            }
        }
        let global = shim.root.join("version");
        let list = self.read(&global)?.map(|t| versions_in(&t)).unwrap_or_default();
        Ok((Self::or_system(list), global.display().to_string()))
    }

    fn or_system(list: Vec<String>) -> Vec<String> {
        if list.is_empty() {
            vec!["system".to_owned()]
        } else {
            list
        }
    }

    /// The installed version directory's name for `v`: itself, without a
    /// `python-` prefix, or the newest installed version it prefixes
    /// (`3.11` → `3.11.7`), as `pyenv latest` picks it.
    fn installed(&self, versions_dir: &Path, v: &str) -> R<Option<String>> {
        for name in [Some(v), v.strip_prefix("python-")].into_iter().flatten() {
            if matches!(self.stat(&versions_dir.join(name))?, Some(Stat { kind: Kind::Dir, .. })) {
                return Ok(Some(name.to_owned()));
            }
        }
        let Some(want) = numeric(v.strip_prefix("python-").unwrap_or(v)) else { return Ok(None) };
        let mut best: Option<(Vec<u64>, String)> = None;
        for n in self.list(versions_dir)? {
            let Some(have) = numeric(&n) else { continue };
            if have.len() > want.len()
                && have.starts_with(&want)
                && best.as_ref().is_none_or(|(b, _)| have > *b)
            {
                best = Some((have, n));
            }
        }
        Ok(best.map(|(_, n)| n))
    }

    /// Files named as arguments, which the child reads directly.
    fn arguments(&mut self) -> R<()> {
        if self.cmd.argv.len() > MAX_ARGS + 1 {
            self.out.warnings.push(format!(
                "only the first {MAX_ARGS} arguments were checked for files the child reads directly; \
                 the rest are granted nothing"
            ));
        }
        for arg in self.cmd.argv.iter().skip(1).take(MAX_ARGS) {
            if arg.is_empty() || arg.len() > 4096 {
                continue;
            }
            let p = self.abs(Path::new(arg));
            let Some(Stat { real, kind: Kind::File { .. } }) = self.stat(&p)? else { continue };
            if self.covered(&real, Use::Read) {
                continue;
            }
            let shown = Path::new(arg).display().to_string();
            match self.inside_root(&real).cloned() {
                Some(root) if (self.roots.readable)(&real) => {
                    let reason =
                        format!("{shown}, named on the command line, inside the allowed root {}", root.display());
                    self.grant(real, reason, true);
                }
                Some(root) => self.out.warnings.push(format!(
                    "{shown} is inside the allowed root {} but airlock's policy refuses it: the child can \
                     read it neither directly nor through airlock",
                    root.display()
                )),
                None if self.roots.grant_outside => {
                    self.grant(real, format!("{shown}, named on the command line"), false);
                }
                None => self.out.warnings.push(format!(
                    "{shown} is outside every allowed root and the sandbox: the child cannot read it directly \
                     (pass --sandbox-ro {shown} if it must, or --allow to read it through airlock)"
                )),
            }
        }
        Ok(())
    }
}
