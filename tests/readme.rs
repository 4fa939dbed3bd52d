//! The commands of README.md, of its guides under docs/ (run, pager,
//! broker, tool, toolexec, simulator), of fuzz/README.md and of
//! traces/README.md, run as a user pastes them on a fresh clone.
//!
//! THE RULE, for every fenced block in those files:
//!
//! - The opening fence names a language. A block without one fails.
//! - `sh` blocks are run with `bash -e -o pipefail`, `python` blocks with
//!   `python3`, from the top of a copy of the repository made in a fresh
//!   directory under /tmp (its tracked and unignored files, no `target/`);
//!   each must exit 0 within 300 s. They get the caller's own PATH (a
//!   version manager's shims first, where the user has them), with
//!   `airlock` put first on it (as after `cargo install --path .`), and
//!   `cargo run --release -- ARGS` runs the airlock
//!   this test was built with (a fresh release build takes minutes; it is
//!   the same code). Any other `cargo` command runs for real.
//! - `toml` blocks are configs: each is written to a file of its own in an
//!   empty directory and `airlock run --config FILE -- true` must exit 0.
//! - Other languages (`text`, `json`, …) are not run.
//! - An HTML comment on the line just before the fence changes that:
//!   `<!-- readme-test: skip REASON -->` leaves the block out (a REASON is
//!   required: a long soak, the test command itself, a network install);
//!   `<!-- readme-test: replace "FROM" "TO" -->` (one or more, each on its
//!   own line) runs the block with FROM replaced by TO, which must occur
//!   (`--seeds 1000` → `--seeds 20`). Any other `readme-test` comment, or
//!   one not followed by a fence, fails.
//! - When every block has run, the copy holds exactly the files it held
//!   before, byte for byte: the documented commands write nowhere in a
//!   clone.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A block running longer fails (exit 124 from `timeout`).
const BLOCK_TIMEOUT_SECS: u64 = 300;

const FILES: &[&str] = &[
    "README.md",
    "docs/run.md",
    "docs/pager.md",
    "docs/broker.md",
    "docs/tool.md",
    "docs/toolexec.md",
    "docs/simulator.md",
    "fuzz/README.md",
    "traces/README.md",
];

#[derive(Debug)]
enum Action {
    Run,
    Skip(String),
}

type Replacements = Vec<(String, String)>;

#[derive(Debug)]
struct Block {
    file: &'static str,
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    body: String,
    action: Action,
    replacements: Replacements,
}

impl Block {
    fn name(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }

    fn text(&self) -> Result<String, String> {
        let mut text = self.body.clone();
        for (from, to) in &self.replacements {
            if !text.contains(from.as_str()) {
                return Err(format!("{}: replace {from:?}: not in the block", self.name()));
            }
            text = text.replace(from.as_str(), to);
        }
        Ok(text)
    }
}

/// `"a b" "c"` → ["a b", "c"]: quoted strings, no escapes.
fn quoted(args: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let inner = rest.strip_prefix('"')?;
        let end = inner.find('"')?;
        out.push(inner[..end].to_owned());
        rest = inner[end + 1..].trim_start();
    }
    Some(out)
}

fn parse(file: &'static str, text: &str) -> Result<Vec<Block>, Vec<String>> {
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    // The directives read for the next fence: where they start, and what they say.
    let mut pending: Option<(usize, Action, Replacements)> = None;
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let n = i + 1;
        let trimmed = line.trim();
        if let Some(directive) = trimmed.strip_prefix("<!-- readme-test:") {
            let Some(directive) = directive.strip_suffix("-->").map(str::trim) else {
                errors.push(format!("{file}:{n}: a readme-test comment must end on its line"));
                continue;
            };
            let entry = pending.get_or_insert_with(|| (n, Action::Run, Vec::new()));
            if let Some(reason) = directive.strip_prefix("skip") {
                if reason.trim().is_empty() {
                    errors.push(format!("{file}:{n}: skip needs a reason"));
                }
                entry.1 = Action::Skip(reason.trim().to_owned());
            } else if let Some(args) = directive.strip_prefix("replace") {
                match quoted(args).as_deref() {
                    Some([from, to]) => entry.2.push((from.clone(), to.clone())),
                    _ => errors.push(format!("{file}:{n}: want replace \"FROM\" \"TO\"")),
                }
            } else {
                errors.push(format!("{file}:{n}: unknown readme-test directive {directive:?}"));
            }
            continue;
        }
        if let Some(lang) = trimmed.strip_prefix("```") {
            let (_, action, replacements) = pending.take().unwrap_or((n, Action::Run, Vec::new()));
            if lang.trim().is_empty() {
                errors.push(format!(
                    "{file}:{n}: a fenced block must name its language (sh, python, toml, text, …)"
                ));
            }
            let mut body = String::new();
            let mut closed = false;
            for (_, l) in lines.by_ref() {
                if l.trim() == "```" {
                    closed = true;
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            if !closed {
                errors.push(format!("{file}:{n}: unclosed block"));
            }
            blocks.push(Block { file, line: n, lang: lang.trim().to_owned(), body, action, replacements });
            continue;
        }
        if let Some((at, _, _)) = pending.take() {
            errors.push(format!("{file}:{at}: a readme-test comment must come just before a fence"));
        }
    }
    if let Some((at, _, _)) = pending {
        errors.push(format!("{file}:{at}: a readme-test comment must come just before a fence"));
    }
    if errors.is_empty() {
        Ok(blocks)
    } else {
        Err(errors)
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn all_blocks() -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    for file in FILES {
        let text = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        match parse(file, &text) {
            Ok(b) => blocks.extend(b),
            Err(e) => errors.extend(e),
        }
    }
    assert!(errors.is_empty(), "README blocks break the rule (see tests/readme.rs):\n{}", errors.join("\n"));
    blocks
}

/// The repository's tracked and unignored files, copied (symlinks as
/// symlinks) into `dest`.
fn copy_repo(dest: &Path) {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(repo())
        .output()
        .expect("git runs (the test copies the repository's files with git ls-files)");
    assert!(out.status.success(), "git ls-files: {}", String::from_utf8_lossy(&out.stderr));
    for rel in out.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        let rel = Path::new(std::str::from_utf8(rel).expect("UTF-8 path"));
        let from = repo().join(rel);
        let to = dest.join(rel);
        let Ok(meta) = std::fs::symlink_metadata(&from) else { continue }; // deleted, not yet committed
        std::fs::create_dir_all(to.parent().expect("a parent")).expect("mkdir");
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).expect("readlink"), &to).expect("symlink");
        } else {
            std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", rel.display()));
        }
    }
}

/// Every file under `dir` (symlinks not followed) and its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let kind = entry.file_type().expect("file type");
            let rel = path.strip_prefix(dir).expect("under dir").to_path_buf();
            if kind.is_dir() {
                if rel != Path::new("target") {
                    stack.push(path);
                }
            } else if kind.is_symlink() {
                files.insert(
                    rel,
                    std::fs::read_link(&path).expect("readlink").into_os_string().into_encoded_bytes(),
                );
            } else {
                files.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    files
}

/// A directory holding `airlock` and a `cargo` that runs it for `cargo
/// run --release -- …` and the real cargo otherwise.
fn shims(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    std::os::unix::fs::symlink(airlock(), bin.join("airlock")).expect("airlock shim");
    let script = format!(
        "#!/bin/sh\nif [ \"$1 $2 $3\" = \"run --release --\" ]; then shift 3; exec {:?} \"$@\"; fi\nexec {:?} \"$@\"\n",
        airlock(),
        env!("CARGO")
    );
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, script).expect("cargo shim");
    let mut perm = std::fs::metadata(&cargo).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&cargo, perm).expect("chmod");
    bin
}

#[test]
fn the_rule_is_enforced() {
    let bad = "text\n```\nno language\n```\n<!-- readme-test: skip -->\n```sh\ntrue\n```\n<!-- readme-test: maybe -->\n```sh\ntrue\n```\n<!-- readme-test: skip fine -->\n\n```sh\ntrue\n```\n";
    let errors = parse("X.md", bad).unwrap_err();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(errors[0].starts_with("X.md:2: a fenced block must name its language"), "{errors:?}");
    assert!(errors[1].starts_with("X.md:5: skip needs a reason"), "{errors:?}");
    assert!(errors[2].starts_with("X.md:9: unknown readme-test directive"), "{errors:?}");
    assert!(
        errors[3].starts_with("X.md:13: a readme-test comment must come just before a fence"),
        "{errors:?}"
    );
    let good = "<!-- readme-test: replace \"--seeds 1000\" \"--seeds 2\" -->\n```sh\nx --seeds 1000\n```\n";
    let blocks = parse("X.md", good).unwrap();
    assert_eq!(blocks[0].text().unwrap(), "x --seeds 2\n");
    let stale = "<!-- readme-test: replace \"--seeds 9\" \"--seeds 2\" -->\n```sh\nx --seeds 1000\n```\n";
    assert!(parse("X.md", stale).unwrap()[0].text().is_err());
}

#[test]
fn readme_commands_work_as_pasted() {
    let blocks = all_blocks();
    let scratch = tempfile::Builder::new().prefix("airlock-readme").tempdir_in("/tmp").expect("scratch dir");
    let clone = scratch.path().join("airlock");
    copy_repo(&clone);
    let bin = shims(scratch.path());
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let before = snapshot(&clone);
    let mut failures = Vec::new();
    let mut ran = 0;
    for block in &blocks {
        if let Action::Skip(reason) = &block.action {
            println!("{}: not run: {reason}", block.name());
            continue;
        }
        let text = match block.text() {
            Ok(t) => t,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let argv: Vec<std::ffi::OsString> = match block.lang.as_str() {
            "sh" => ["bash", "-e", "-o", "pipefail", "-c", &text].map(Into::into).to_vec(),
            "python" => ["python3", "-c", &text].map(Into::into).to_vec(),
            "toml" => {
                let dir = scratch.path().join(format!("toml-{}", block.line));
                std::fs::create_dir_all(&dir).expect("mkdir");
                let file = dir.join("airlock.toml");
                std::fs::write(&file, &text).expect("write toml");
                vec![
                    airlock().into(),
                    "run".into(),
                    "--config".into(),
                    file.into(),
                    "--".into(),
                    "true".into(),
                ]
            }
            _ => continue,
        };
        // A block that hangs fails instead of holding the test. `timeout`
        // leads a process group of its own: whatever the block left
        // running in the background (a server it failed to stop) is killed
        // with it, and its output goes to files, not pipes, so a straggler
        // cannot hold the test open waiting for their end.
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=5", &BLOCK_TIMEOUT_SECS.to_string()]).args(&argv);
        ran += 1;
        let out_path = scratch.path().join("block.out");
        let err_path = scratch.path().join("block.err");
        let status = cmd
            .current_dir(&clone)
            .env("PATH", &path)
            .env_remove("AIRLOCK_FD")
            .env_remove("AIRLOCK")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out_path).expect("block stdout"))
            .stderr(std::fs::File::create(&err_path).expect("block stderr"))
            .spawn()
            .and_then(|mut child| {
                let pid = child.id();
                let status = child.wait();
                let leftovers = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).output();
                if leftovers.is_ok_and(|o| o.status.success()) {
                    failures.push(format!("{}: left processes running after it ended", block.name()));
                }
                status
            })
            .unwrap_or_else(|e| panic!("{}: cannot run: {e}", block.name()));
        if !status.success() {
            failures.push(format!(
                "{} ({}) exited {:?}\n--- stdout\n{}--- stderr\n{}",
                block.name(),
                block.lang,
                status.code(),
                String::from_utf8_lossy(&std::fs::read(&out_path).unwrap_or_default()),
                String::from_utf8_lossy(&std::fs::read(&err_path).unwrap_or_default())
            ));
        }
    }
    let after = snapshot(&clone);
    let changed: Vec<String> = after
        .keys()
        .chain(before.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| k.display().to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !changed.is_empty() {
        failures.push(format!("the commands created, changed or removed files in the clone: {changed:?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(ran >= 8, "only {ran} blocks ran: the READMEs lost their commands?");
}

/// `UpstreamEof` → `upstream_eof`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The variants of `pub enum NAME` in `source`, as their serde tags.
fn variants(source: &str, name: &str) -> Vec<String> {
    let start = source.find(&format!("pub enum {name} {{")).unwrap_or_else(|| panic!("no enum {name}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").expect("enum end")];
    body.lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|l| snake(l.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or("")))
        .collect()
}

#[test]
fn traces_readme_lists_every_input_and_output_kind() {
    let source = std::fs::read_to_string(repo().join("core/src/fsproxy/mod.rs")).unwrap();
    let readme = std::fs::read_to_string(repo().join("traces/README.md")).unwrap();
    let mut missing = Vec::new();
    for kind in variants(&source, "Input").into_iter().chain(variants(&source, "Output")) {
        if !readme.contains(&format!("| `{kind}` |")) {
            missing.push(kind);
        }
    }
    assert!(variants(&source, "Input").contains(&"upstream_eof".to_owned()));
    assert!(missing.is_empty(), "traces/README.md has no table row for {missing:?}");
}

#[test]
fn fuzz_readme_lists_every_target() {
    let manifest = std::fs::read_to_string(repo().join("fuzz/Cargo.toml")).unwrap();
    let readme = std::fs::read_to_string(repo().join("fuzz/README.md")).unwrap();
    let targets: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|bin| bin.lines().find_map(|l| l.trim().strip_prefix("name = \"")?.strip_suffix('"')))
        .collect();
    assert!(targets.len() >= 5, "fuzz/Cargo.toml lists {targets:?}");
    let missing: Vec<&&str> = targets.iter().filter(|t| !readme.contains(&format!("| `{t}` |"))).collect();
    assert!(missing.is_empty(), "fuzz/README.md has no table row for {missing:?}");
}

/// `.ci/run` runs exactly the README's test command (after installing what
/// it needs), and that command says at once when cargo-fuzz is missing,
/// before the half hour of tests that precede the fuzzing.
#[test]
fn ci_runs_the_readme_test_command_which_checks_cargo_fuzz_first() {
    let blocks = all_blocks();
    let command = blocks
        .iter()
        .filter(|b| b.file == "README.md")
        .find(|b| matches!(&b.action, Action::Skip(r) if r.starts_with("the test command itself")))
        .expect("README.md has the test command")
        .body
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .expect("a command line")
        .to_owned();
    let ci = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    assert_eq!(
        ci.lines().rfind(|l| !l.trim().is_empty()),
        Some(command.as_str()),
        ".ci/run and README.md differ"
    );
    assert!(command.starts_with("cargo fuzz --version"), "{command}");
    // `--all-targets` leaves the doc examples out: they run on their own.
    assert!(command.contains("&& cargo test --workspace --doc &&"), "{command}");
    assert!(command.find("cargo fuzz --version") < command.find("cargo test"), "{command}");
    // Where cargo-fuzz is missing, the command fails at once, naming how to
    // install it, and goes no further (its check, run here up to the
    // tests, which a marker stands for).
    let check = &command[..command.find(" && cargo test").expect("the tests follow the check")];
    let empty = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO"), empty.path().join("cargo")).unwrap();
    let out = Command::new("bash")
        .args(["-c", &format!("{check} && echo the tests would run")])
        .env("PATH", format!("{}:/usr/bin:/bin", empty.path().display()))
        .env("CARGO_HOME", empty.path().join("no-cargo-home"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cargo install cargo-fuzz --version 0.13.2 --locked"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
}
