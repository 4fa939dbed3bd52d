//! The program check against an in-memory filesystem: what a command's
//! interpreter chain is granted, refused, or warned about.

use super::program::*;
use super::*;
use crate::policy::{Access, Root};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ffi::OsString;

#[derive(Clone, Debug)]
enum Node {
    File(&'static str, bool),
    Dir,
    Link(String),
}

/// An in-memory tree: absolute paths to nodes; parents are implied
/// directories.
#[derive(Clone, Debug, Default)]
struct Fs(BTreeMap<PathBuf, Node>);

impl Fs {
    fn file(mut self, p: &str, text: &'static str) -> Self {
        self.0.insert(p.into(), Node::File(text, false));
        self
    }
    fn exe(mut self, p: &str, text: &'static str) -> Self {
        self.0.insert(p.into(), Node::File(text, true));
        self
    }
    fn dir(mut self, p: &str) -> Self {
        self.0.insert(p.into(), Node::Dir);
        self
    }
    fn link(mut self, p: &str, to: &str) -> Self {
        self.0.insert(p.into(), Node::Link(to.into()));
        self
    }

    fn node(&self, p: &Path) -> Option<Node> {
        self.0
            .get(p)
            .cloned()
            .or_else(|| self.0.keys().any(|k| k.starts_with(p) && k != p).then_some(Node::Dir))
    }

    /// Resolve every symlink of `p`, as `realpath` does.
    fn real(&self, p: &Path) -> Option<PathBuf> {
        let mut done = PathBuf::from("/");
        let mut todo: Vec<OsString> = p.components().skip(1).map(|c| c.as_os_str().to_owned()).collect();
        todo.reverse();
        let mut links = 0;
        while let Some(c) = todo.pop() {
            if c == ".." {
                done.pop();
                continue;
            }
            let next = done.join(&c);
            match self.node(&next)? {
                Node::Link(to) => {
                    links += 1;
                    if links > 40 {
                        return None;
                    }
                    let to = Path::new(&to);
                    if to.is_absolute() {
                        done = PathBuf::from("/");
                    }
                    let mut parts: Vec<OsString> = to
                        .components()
                        .filter(|c| !matches!(c, std::path::Component::RootDir))
                        .map(|c| c.as_os_str().to_owned())
                        .collect();
                    parts.reverse();
                    todo.extend(parts);
                }
                _ => done = next,
            }
        }
        Some(done)
    }

    fn answer(&self, ask: &Ask) -> Answer {
        match ask {
            Ask::Stat(p) => Answer::Stat(self.real(p).and_then(|real| {
                let kind = match self.node(&real)? {
                    Node::File(_, exec) => Kind::File { exec },
                    Node::Dir => Kind::Dir,
                    Node::Link(_) => Kind::Other,
                };
                Some(Stat { real, kind })
            })),
            Ask::Read(p) => Answer::Bytes(self.real(p).and_then(|r| match self.node(&r)? {
                Node::File(t, _) => Some(t.as_bytes().to_vec()),
                _ => None,
            })),
            Ask::List(p) => Answer::Names(self.real(p).map(|r| {
                let mut names: Vec<String> = self
                    .0
                    .keys()
                    .filter_map(|k| k.strip_prefix(&r).ok())
                    .filter_map(|rest| rest.components().next())
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                names.dedup();
                names
            })),
        }
    }
}

const PYENV_SHIM: &str = "#!/usr/bin/env bash\nset -e\n[ -n \"$PYENV_DEBUG\" ] && set -x\n\nprogram=\"${0##*/}\"\n\nexport PYENV_ROOT=\"/home/u/.pyenv\"\nexec \"/home/u/.pyenv/libexec/pyenv\" exec \"$program\" \"$@\"\n";
const ELF: &str = "\x7fELF";

/// A host with a system python, pyenv with two 3.11s and a 3.12, a
/// project with a venv on pyenv's 3.11.7, and rustup in ~/.cargo.
fn host() -> Fs {
    Fs::default()
        .exe("/usr/bin/python3", ELF)
        .exe("/usr/bin/env", ELF)
        .exe("/usr/bin/sh", ELF)
        .exe("/usr/bin/bash", ELF)
        .exe("/home/u/.pyenv/shims/python3", PYENV_SHIM)
        .exe("/home/u/.pyenv/shims/pip", PYENV_SHIM)
        .file("/home/u/.pyenv/version", "3.11.7\n")
        .exe("/home/u/.pyenv/versions/3.11.7/bin/python3.11", ELF)
        .link("/home/u/.pyenv/versions/3.11.7/bin/python3", "python3.11")
        .link("/home/u/.pyenv/versions/3.11.7/bin/python", "python3.11")
        .exe(
            "/home/u/.pyenv/versions/3.11.7/bin/pip",
            "#!/home/u/.pyenv/versions/3.11.7/bin/python3.11\nimport pip\n",
        )
        .exe("/home/u/.pyenv/versions/3.11.2/bin/python3", ELF)
        .exe("/home/u/.pyenv/versions/3.12.1/bin/python3", ELF)
        .dir("/home/u/.pyenv/versions/3.12.1/lib")
        .file("/home/u/proj/agent.py", "print('hi')\n")
        .file("/home/u/proj/data.txt", "data\n")
        .file("/home/u/proj/.env", "KEY=1\n")
        .exe("/home/u/proj/run.sh", "#!/bin/sh\necho hi\n")
        .exe("/home/u/proj/tool.py", "#!/usr/bin/env python3\nprint('hi')\n")
        .file(
            "/home/u/proj/.venv/pyvenv.cfg",
            "home = /home/u/.pyenv/versions/3.11.7/bin\ninclude-system-site-packages = false\n",
        )
        .link("/home/u/proj/.venv/bin/python", "/home/u/.pyenv/versions/3.11.7/bin/python")
        .link("/home/u/proj/.venv/bin/python3", "python")
        .file("/home/u/outside.txt", "x\n")
        .exe("/home/u/.cargo/bin/rustup", ELF)
        .link("/home/u/.cargo/bin/cargo", "rustup")
        .exe("/opt/airlock/airlock", ELF)
        .link("/bin", "usr/bin")
}

const SHIMS_PATH: &str = "/home/u/.pyenv/shims:/usr/local/bin:/usr/bin:/bin";

fn ruleset() -> Ruleset {
    let mut r = system_ruleset(7, false).unwrap();
    r.grant_read_exec("/opt/airlock/airlock".into());
    r
}

struct Case {
    fs: Fs,
    argv: Vec<&'static str>,
    cwd: &'static str,
    env: Vec<(&'static str, &'static str)>,
    roots: Vec<&'static str>,
    grant_outside: bool,
}

impl Case {
    fn new(argv: &[&'static str]) -> Case {
        Case {
            fs: host(),
            argv: argv.to_vec(),
            cwd: "/home/u/proj",
            env: vec![("PATH", SHIMS_PATH), ("HOME", "/home/u")],
            roots: vec!["/home/u/proj"],
            grant_outside: false,
        }
    }

    fn env(mut self, k: &'static str, v: &'static str) -> Case {
        self.env.retain(|(key, _)| *key != k);
        self.env.push((k, v));
        self
    }

    fn run(&self) -> Result<Checked, Refused> {
        let argv: Vec<OsString> = self.argv.iter().map(OsString::from).collect();
        let env: BTreeMap<OsString, OsString> = self.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
        let cmd = Command {
            argv: &argv,
            cwd: Path::new(self.cwd),
            env: &env,
            airlock: Some(Path::new("/opt/airlock/airlock")),
        };
        let dirs: Vec<PathBuf> = self.roots.iter().map(PathBuf::from).collect();
        let policy = Policy::new(
            PathBuf::from(self.cwd),
            dirs.iter().map(|p| Root { path: p.clone(), access: Access::ReadWrite }),
        );
        // The policy refuses `.env` files, as the FS proxy's secret rule.
        let readable = |p: &Path| {
            p.file_name() != Some(std::ffi::OsStr::new(".env"))
                && p.to_str().is_some_and(|s| policy.resolve(s, false).is_ok())
        };
        let roots = Roots { dirs: &dirs, readable: &readable, grant_outside: self.grant_outside };
        let rules = ruleset();
        let mut facts = Facts::default();
        for _ in 0..MAX_ASKS {
            match check(&cmd, &rules, &roots, &facts)? {
                Step::Done(c) => return Ok(c),
                Step::Ask(a) => {
                    let answer = self.fs.answer(&a);
                    facts.give(a, answer);
                }
            }
        }
        panic!("more than {MAX_ASKS} facts asked for {:?}", self.argv);
    }
}

fn paths(c: &Checked) -> Vec<(&str, bool)> {
    c.grants.iter().map(|g| (g.path.to_str().unwrap(), g.direct_read)).collect()
}

fn env_of<'a>(c: &'a Checked, k: &str) -> Option<&'a str> {
    c.env.iter().find(|(key, _)| key == k).and_then(|(_, v)| v.to_str())
}

#[test]
fn a_pyenv_shim_runs_the_global_version_granted_and_first_on_path() {
    let c = Case::new(&["python3", "agent.py"]).run().unwrap();
    assert_eq!(paths(&c), [("/home/u/.pyenv/versions/3.11.7", false), ("/home/u/proj/agent.py", true)]);
    assert_eq!(c.env.len(), 1, "PATH alone: {:?}", c.env);
    assert_eq!(env_of(&c, "PATH"), Some(format!("/home/u/.pyenv/versions/3.11.7/bin:{SHIMS_PATH}").as_str()));
    assert_eq!(c.program, None, "looked up by name: the PATH does it");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(c.grants[0].reason.contains("python3"), "{:?}", c.grants);
}

#[test]
fn the_version_comes_from_the_variable_then_local_files_up_the_tree_then_the_global_file() {
    let mut case = Case::new(&["python3"]);
    case.fs = case.fs.file("/home/u/.python-version", "# pinned\n\n3.12.1\n");
    let c = case.run().unwrap();
    assert_eq!(paths(&c), [("/home/u/.pyenv/versions/3.12.1", false)]);
    let c = case.env("PYENV_VERSION", "3.11.2").run().unwrap();
    assert_eq!(paths(&c), [("/home/u/.pyenv/versions/3.11.2", false)]);
}

#[test]
fn a_version_prefix_selects_the_newest_installed_match() {
    let c = Case::new(&["python3"]).env("PYENV_VERSION", "3.11").run().unwrap();
    assert_eq!(paths(&c), [("/home/u/.pyenv/versions/3.11.7", false)]);
}

#[test]
fn a_version_not_installed_is_refused_naming_it_and_what_set_it() {
    let mut case = Case::new(&["python3", "agent.py"]);
    case.fs = case.fs.file("/home/u/proj/.python-version", "3.99.0\n");
    let err = case.run().unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("3.99.0") && msg.contains("/home/u/proj/.python-version"), "{msg}");
    assert!(msg.contains("/home/u/.pyenv/versions"), "{msg}");
}

#[test]
fn a_version_file_cannot_climb_out_of_the_versions_directory() {
    let mut case = Case::new(&["python3"]);
    case.fs =
        case.fs.file("/home/u/proj/.python-version", "../../../../etc\n/etc\n").exe("/etc/bin/python3", ELF);
    // Both lines are ignored, as pyenv ignores them: the system's.
    let c = case.run().unwrap();
    assert!(c.grants.is_empty(), "{:?}", c.grants);
    assert_eq!(env_of(&c, "PATH"), None);
}

#[test]
fn the_system_version_is_the_next_on_path_past_the_shims() {
    let c = Case::new(&["python3"]).env("PYENV_VERSION", "system").run().unwrap();
    assert!(c.grants.is_empty(), "{:?}", c.grants);
    assert!(c.env.is_empty(), "pyenv exec leaves PATH alone for the system: {:?}", c.env);
}

#[test]
fn a_venv_on_a_pyenv_interpreter_is_granted_with_its_base_and_no_flag() {
    let c = Case::new(&[".venv/bin/python", "agent.py"]).run().unwrap();
    assert_eq!(
        paths(&c),
        [
            ("/home/u/.pyenv/versions/3.11.7", false),
            ("/home/u/proj/.venv", true),
            ("/home/u/proj/agent.py", true)
        ]
    );
    assert!(c.grants[1].reason.contains("virtual environment"), "{:?}", c.grants);
    assert!(c.env.is_empty() && c.program.is_none(), "{c:?}");
}

#[test]
fn a_script_inside_the_root_is_granted_and_named_without_dot_segments() {
    let c = Case::new(&["./run.sh"]).run().unwrap();
    assert_eq!(paths(&c), [("/home/u/proj/run.sh", true)]);
    // A script looked up through `env`: the shim's version is first on
    // the PATH `env` searches.
    let c = Case::new(&["./tool.py"]).run().unwrap();
    assert_eq!(paths(&c), [("/home/u/proj/tool.py", true), ("/home/u/.pyenv/versions/3.11.7", false)]);
    assert_eq!(env_of(&c, "PATH"), Some(format!("/home/u/.pyenv/versions/3.11.7/bin:{SHIMS_PATH}").as_str()));
}

#[test]
fn a_script_outside_every_root_is_refused_naming_it_exactly() {
    let mut case = Case::new(&["python3", "agent.py"]);
    case.fs = case.fs.exe("/home/u/bin/python3", "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n");
    let case = case.env("PATH", "/home/u/bin:/usr/bin");
    let msg = case.run().unwrap_err().to_string();
    assert!(msg.contains("--sandbox-ro /home/u/bin/python3"), "{msg}");
    assert!(!msg.contains("found later"), "{msg}");
}

#[test]
fn an_installation_directly_in_home_is_named_not_granted() {
    let case = Case::new(&["cargo", "build"]).env("PATH", "/home/u/.cargo/bin:/usr/bin");
    let msg = case.run().unwrap_err().to_string();
    assert!(
        msg.contains("/home/u/.cargo/bin/cargo") && msg.contains("--sandbox-ro /home/u/.cargo/bin/rustup"),
        "{msg}"
    );
    assert!(msg.contains("--sandbox-ro /home/u/.cargo)"), "{msg}");
}

#[test]
fn arguments_inside_a_root_are_granted_and_others_warned_about() {
    let c = Case::new(&["sh", "-c", "cat \"$1\"", "sh", "data.txt", "../outside.txt", ".env", "missing"])
        .run()
        .unwrap();
    assert_eq!(paths(&c), [("/home/u/proj/data.txt", true)]);
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("../outside.txt") && c.warnings[0].contains("outside every allowed root"));
    assert!(c.warnings[1].contains(".env") && c.warnings[1].contains("refuses"), "{:?}", c.warnings);
}

#[test]
fn the_tool_host_grants_its_script_wherever_it_lies() {
    let mut case = Case::new(&["python3", "../outside.txt", ".env"]);
    case.grant_outside = true;
    let c = case.run().unwrap();
    assert_eq!(paths(&c)[1..], [("/home/u/outside.txt", false)]);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
}

#[test]
fn the_tool_host_grants_the_program_it_was_given_by_path() {
    let mut case = Case::new(&["/home/u/bin/tool"]);
    case.fs = case.fs.exe("/home/u/bin/tool", ELF);
    assert!(case.run().is_err(), "run refuses it");
    case.grant_outside = true;
    assert_eq!(paths(&case.run().unwrap()), [("/home/u/bin/tool", false)]);
}

#[test]
fn many_arguments_are_checked_up_to_the_bound_within_the_ask_bound() {
    let many: Vec<&'static str> = ["sh", "-c", "cat \"$@\"", "sh"]
        .into_iter()
        .chain(std::iter::repeat_n("data.txt", MAX_ARGS + 50))
        .collect();
    let c = Case::new(&many).run().unwrap();
    assert_eq!(paths(&c), [("/home/u/proj/data.txt", true)]);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains(&format!("first {MAX_ARGS} arguments")), "{:?}", c.warnings);
}

#[test]
fn airlocks_own_arguments_are_paths_for_the_proxy() {
    let c = Case::new(&["/opt/airlock/airlock", "fs", "cat", "../outside.txt"]).run().unwrap();
    assert_eq!(c, Checked::default());
}

#[test]
fn a_program_the_policy_refuses_is_refused() {
    let mut case = Case::new(&["./.env"]);
    case.fs = case.fs.exe("/home/u/proj/.env", ELF);
    let msg = case.run().unwrap_err().to_string();
    assert!(msg.contains("policy refuses"), "{msg}");
}

#[test]
fn a_shim_named_by_its_path_is_replaced_by_what_it_selects() {
    let c = Case::new(&["/home/u/.pyenv/shims/python3"]).run().unwrap();
    assert_eq!(c.program.as_deref(), Some(Path::new("/home/u/.pyenv/versions/3.11.7/bin/python3")));
}

#[test]
fn a_chain_that_loops_is_refused_not_followed() {
    let mut case = Case::new(&["python3"]);
    case.fs = case.fs.link("/home/u/.pyenv/versions/3.11.7/bin/python3", "/home/u/.pyenv/shims/python3");
    assert!(matches!(case.run(), Err(Refused::TooDeep { .. })));
}

/// A venv in a writable root is the child's to rewrite between sessions:
/// a `home` its interpreter does not lie in, or one right in the home
/// directory, is named in a refusal, never granted.
#[test]
fn a_venv_home_is_granted_only_where_its_interpreter_lies() {
    let mut case = Case::new(&[".venv/bin/python"]);
    case.fs = case
        .fs
        .file(
            "/home/u/proj/.venv/pyvenv.cfg",
            "home = /home/u/.ssh
",
        )
        .file("/home/u/.ssh/id_ed25519", "KEY")
        .file("/home/u/.config/gh/hosts.yml", "token")
        .dir("/home/u/.config/gh/bin");
    let msg = case.run().unwrap_err().to_string();
    assert!(msg.contains("--sandbox-ro /home/u/.ssh"), "{msg}");
    case.fs = case.fs.file(
        "/home/u/proj/.venv/pyvenv.cfg",
        "home = /home/u/.config/gh/bin
",
    );
    let msg = case.run().unwrap_err().to_string();
    assert!(msg.contains("--sandbox-ro /home/u/.config/gh"), "{msg}");
    // The interpreter itself moved there, right in the home: still no.
    case.fs = case
        .fs
        .exe("/home/u/.ssh/bin/python", ELF)
        .link("/home/u/proj/.venv/bin/python", "/home/u/.ssh/bin/python")
        .file(
            "/home/u/proj/.venv/pyvenv.cfg",
            "home = /home/u/.ssh/bin
",
        );
    assert!(case.run().is_err());
}

#[test]
fn a_venv_that_is_a_root_or_holds_one_is_refused() {
    let mut case = Case::new(&[".venv/bin/python"]);
    case.roots = vec!["/home/u/proj/.venv"];
    let msg = case.run().unwrap_err().to_string();
    assert!(msg.contains("expose the whole allowed root /home/u/proj/.venv"), "{msg}");
}

proptest! {
    /// Whatever the links and files, the check ends within its bound and
    /// every grant is inside a root (a direct read the policy allows), an
    /// installation or venv away from the home's top and the roots.
    #[test]
    fn every_grant_is_bounded_and_accounted_for(
        links in proptest::collection::vec((0usize..6, 0usize..6), 0..8),
        shebangs in proptest::collection::vec(0usize..6, 0..4),
        prog in 0usize..6,
    ) {
        const SPOTS: [&str; 6] = [
            "/home/u/proj/a", "/home/u/x/bin/b", "/home/u/.pyenv/shims/python3",
            "/opt/t/bin/c", "/home/u/proj/.venv/bin/python", "/home/u/.cargo/bin/d",
        ];
        let mut fs = host();
        for (i, (from, to)) in links.iter().enumerate() {
            if i % 2 == 0 { fs = fs.link(SPOTS[*from], SPOTS[*to]); } else { fs = fs.exe(SPOTS[*from], ELF); }
        }
        for s in shebangs {
            fs = fs.exe(SPOTS[s], ["#!/home/u/x/bin/b\n", "#!/usr/bin/env python3\n", "#!/home/u/proj/a\n"][s % 3]);
        }
        let mut case = Case::new(&[]);
        case.argv = vec![SPOTS[prog], "agent.py"];
        case.fs = fs;
        if let Ok(c) = case.run() {
            for g in &c.grants {
                let p = g.path.to_str().unwrap();
                prop_assert!(p != "/home/u" && p != "/home/u/.cargo" && p != "/home/u/proj" && p != "/", "{:?}", c);
                prop_assert_eq!(g.direct_read, p.starts_with("/home/u/proj/"), "{:?}", c);
            }
        }
    }
}
