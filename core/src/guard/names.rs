//! The built-in lists: which resolved paths are secret files and which are
//! protected paths, by their names alone.
//!
//! Every name is compared ASCII-case-insensitively: `.ENV` is a secret,
//! and on a case-folding file system (vfat, a casefold ext4 directory)
//! `.GIT/config` is git's, so it is protected too. A path is matched on
//! all its components, wherever it lies: a repository, an editor's folder
//! or a `.env` file is found at any depth beneath a root, since a root may
//! hold many projects. Shell start-up files are the exception: they count
//! only directly in a home directory (`/root`, `/home/NAME`, and the homes
//! the caller names).

use super::Rule;

/// Names of the `.env` family (after editor decorations are taken off,
/// see [`undecorated`]) are secret: `.env`, `.env.*`, `.env_*`, `.env-*`,
/// `*.env`, `.envrc`.
fn env_family(n: &[u8]) -> bool {
    n == b".envrc"
        || n.ends_with(b".env")
        || [&b".env."[..], b".env_", b".env-"].iter().any(|p| n.starts_with(p))
}

/// Files holding credentials by convention, by their own name.
const CREDENTIAL_NAMES: &[&[u8]] = &[
    b".netrc",
    b"_netrc",
    b".pgpass",
    b".npmrc",
    b".pypirc",
    b".git-credentials",
    b".my.cnf",
    b".boto",
    b".s3cfg",
    b".vault-token",
    b".dockercfg",
    b".terraformrc",
    b"application_default_credentials.json",
    b"credentials.tfrc.json",
];

/// Credential files by their directory and name.
const CREDENTIAL_PAIRS: &[(&[u8], &[u8])] = &[
    (b".aws", b"credentials"),
    (b".kube", b"config"),
    (b".docker", b"config.json"),
    (b"gh", b"hosts.yml"),
    (b".cargo", b"credentials"),
    (b".cargo", b"credentials.toml"),
    (b".gem", b"credentials"),
    (b"huggingface", b"token"),
    (b".huggingface", b"token"),
];

/// Directories whose whole content is credentials: a component pair
/// (parent, name), or a lone name.
const CREDENTIAL_DIR_PAIRS: &[(&[u8], &[u8])] =
    &[(b".aws", b"sso"), (b".aws", b"cli"), (b".config", b"gcloud")];
const CREDENTIAL_DIRS: &[&[u8]] = &[b".gnupg", b".azure"];

/// SSH private keys by their usual names, wherever they lie.
const SSH_KEY_NAMES: &[&[u8]] =
    &[b"id_rsa", b"id_dsa", b"id_ecdsa", b"id_ed25519", b"id_ecdsa_sk", b"id_ed25519_sk", b"identity"];

/// Editor configuration that runs commands when a folder is opened.
const EDITOR_DIRS: &[&[u8]] = &[b".vscode", b".idea", b".devcontainer"];
/// Agent configuration that runs commands (hooks, MCP servers).
const AGENT_DIRS: &[&[u8]] = &[b".claude", b".cursor", b".codex", b".gemini"];
const AGENT_FILES: &[&[u8]] = &[b".mcp.json", b".claude.json"];
/// Scripts a shell runs on entering their directory (direnv).
const SHELL_HOOK_FILES: &[&[u8]] = &[b".envrc"];

/// What a login, a shell, a desktop session or git runs from a home
/// directory.
const HOME_FILES: &[&[u8]] = &[
    b".bashrc",
    b".bash_profile",
    b".bash_login",
    b".bash_logout",
    b".bash_aliases",
    b".profile",
    b".zshrc",
    b".zshenv",
    b".zprofile",
    b".zlogin",
    b".zlogout",
    b".cshrc",
    b".tcshrc",
    b".login",
    b".logout",
    b".kshrc",
    b".mkshrc",
    b".inputrc",
    b".xprofile",
    b".xinitrc",
    b".xsession",
    b".xsessionrc",
    b".pam_environment",
    b".gitconfig",
];
/// Beneath a home: (directory, name or `None` for all of it).
const HOME_NESTED: &[(&[u8], Option<&[u8]>)] = &[
    (b".ssh", Some(b"config")),
    (b".ssh", Some(b"rc")),
    (b".ssh", Some(b"authorized_keys")),
    (b".ssh", Some(b"authorized_keys2")),
    (b".config/git", Some(b"config")),
    (b".config/fish", None),
    (b".config/systemd/user", None),
    (b".config/autostart", None),
];

/// Files of a git directory that make git run a command or read its
/// configuration from elsewhere.
const GIT_CONFIG_FILES: &[&[u8]] = &[b"config", b"config.worktree", b"commondir"];

fn eq(a: &[u8], b: &[u8]) -> bool {
    a.eq_ignore_ascii_case(b)
}

fn lower(n: &[u8]) -> Vec<u8> {
    n.to_ascii_lowercase()
}

/// The names an editor makes of `n` taken off one at a time, `n` first:
/// `.env~` and `.env.bak` (backups), `#.env#` (an auto-save), `.#.env`
/// (a lock), `..env.swp` (vim's swap file of `.env`).
fn undecorated(n: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![lower(n)];
    while let Some(cur) = out.last() {
        let next: Option<Vec<u8>> = if let Some(s) = cur.strip_suffix(b"~") {
            Some(s.to_vec())
        } else if cur.len() >= 2 && cur.starts_with(b"#") && cur.ends_with(b"#") {
            Some(cur[1..cur.len() - 1].to_vec())
        } else if let Some(s) = cur.strip_prefix(b".#") {
            Some(s.to_vec())
        } else if cur.len() > 5
            && cur.starts_with(b".")
            && cur[cur.len() - 4..cur.len() - 1] == *b".sw"
            && cur[cur.len() - 1].is_ascii_lowercase()
        {
            Some(cur[1..cur.len() - 4].to_vec())
        } else {
            [&b".bak"[..], b".orig", b".old", b".save", b".tmp", b".backup", b".swp"]
                .iter()
                .find_map(|suffix| cur.strip_suffix(*suffix))
                .filter(|s| !s.is_empty())
                .map(<[u8]>::to_vec)
        };
        match next {
            Some(n) if !n.is_empty() && out.len() < 16 => out.push(n),
            _ => break,
        }
    }
    out
}

/// The components of a canonical absolute path.
pub(crate) fn components(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == b'/').filter(|c| !c.is_empty()).collect()
}

/// The secret rule `path` falls under, if any.
pub fn secret(path: &[u8]) -> Option<Rule> {
    let c = components(path);
    for (i, name) in c.iter().enumerate() {
        let forms = undecorated(name);
        if forms.iter().any(|f| env_family(f)) {
            return Some(Rule::EnvFile);
        }
        if CREDENTIAL_DIRS.iter().any(|d| eq(name, d)) {
            return Some(Rule::Credentials);
        }
        let parent = i.checked_sub(1).map(|p| c[p]);
        if let Some(parent) = parent {
            if CREDENTIAL_DIR_PAIRS.iter().any(|(d, n)| eq(parent, d) && eq(name, n)) {
                return Some(Rule::Credentials);
            }
        }
        let last = i + 1 == c.len();
        if !last {
            continue;
        }
        if forms.iter().any(|f| CREDENTIAL_NAMES.iter().any(|n| f == n)) {
            return Some(Rule::Credentials);
        }
        if let Some(parent) = parent {
            if forms.iter().any(|f| CREDENTIAL_PAIRS.iter().any(|(d, n)| eq(parent, d) && f == n)) {
                return Some(Rule::Credentials);
            }
            // Any key in `.ssh` but the public ones and the host list.
            if eq(parent, b".ssh") && forms.iter().any(|f| f.starts_with(b"id_") && !f.ends_with(b".pub")) {
                return Some(Rule::SshKey);
            }
        }
        if forms.iter().any(|f| SSH_KEY_NAMES.iter().any(|n| f == n)) {
            return Some(Rule::SshKey);
        }
    }
    None
}

/// What a place a writable direct view holds empty must hold, each
/// (path beneath the place, whether a directory): the protected names
/// that place may be made to hold. Names that are files of JSON (agent
/// configuration, `.envrc`) are held as directories: an empty file there would
/// show in `git status` and be added with the rest. `commondir` is left
/// out: git refuses a repository whose `commondir` it cannot follow, so
/// no placeholder can stand there (a created one is reported).
pub fn held(git_dir: bool) -> Vec<(Vec<u8>, bool)> {
    if git_dir {
        let dirs = [&b"hooks"[..], b"modules", b"worktrees"].into_iter().map(|n| (n.to_vec(), true));
        let files = GIT_CONFIG_FILES.iter().filter(|n| **n != b"commondir").map(|n| (n.to_vec(), false));
        return dirs.chain(files).collect();
    }
    let mut out: Vec<(Vec<u8>, bool)> = std::iter::once(&b".git"[..])
        .chain(EDITOR_DIRS.iter().copied())
        .chain(AGENT_DIRS.iter().copied())
        .chain(AGENT_FILES.iter().copied())
        .chain(SHELL_HOOK_FILES.iter().copied())
        .map(|n| (n.to_vec(), true))
        .collect();
    out.extend(HOME_FILES.iter().map(|n| (n.to_vec(), false)));
    for (dir, name) in HOME_NESTED {
        match name {
            Some(n) => out.push(([*dir, b"/", n].concat(), false)),
            None => out.push((dir.to_vec(), true)),
        }
    }
    out
}

/// A component naming a git directory: `.git`, or a bare repository's
/// `NAME.git`.
fn gitdir(name: &[u8]) -> bool {
    name.len() >= 4 && eq(&name[name.len() - 4..], b".git")
}

/// The protected rule `rest` (the components beneath a git directory)
/// falls under, if any; `exact` is whether the git directory is `.git`
/// itself (not a bare `NAME.git`).
fn in_gitdir(rest: &[&[u8]], exact: bool) -> Option<Rule> {
    let is = |i: usize, n: &[u8]| rest.get(i).is_some_and(|c| eq(c, n));
    let config = |c: &[u8]| GIT_CONFIG_FILES.iter().any(|n| eq(c, n));
    match rest.len() {
        0 => return exact.then_some(Rule::GitDir),
        1 if config(rest[0]) => return Some(Rule::GitConfig),
        _ => {}
    }
    if is(0, b"hooks") {
        return Some(Rule::GitHooks);
    }
    if is(0, b"modules") {
        // `modules/NAME...`: a submodule's git directory, whose name may
        // hold slashes. The directories themselves, any `hooks` in them and
        // a last `config` are protected; their objects and refs are not.
        if rest.len() <= 2 {
            return Some(Rule::GitDir);
        }
        if rest[2..].iter().any(|c| eq(c, b"hooks")) {
            return Some(Rule::GitHooks);
        }
        if rest.last().is_some_and(|c| config(c)) {
            return Some(Rule::GitConfig);
        }
    }
    if is(0, b"worktrees") {
        if rest.len() <= 2 {
            return Some(Rule::GitDir);
        }
        let name = rest[2].to_ascii_lowercase();
        if rest.len() == 3 && (name.starts_with(b"config") || name == b"commondir" || name == b"gitdir") {
            return Some(Rule::GitConfig);
        }
        if is(2, b"hooks") {
            return Some(Rule::GitHooks);
        }
    }
    None
}

/// Whether `dir` (a canonical absolute path) is a home directory: one of
/// `homes`, `/root`, or `/home/NAME`.
fn is_home(dir: &[&[u8]], homes: &[Vec<&[u8]>]) -> bool {
    matches!(dir, [r] if *r == b"root")
        || matches!(dir, [h, _] if *h == b"home")
        || homes.iter().any(|h| h.as_slice() == dir)
}

/// The protected rule `path` falls under, if any. `homes` are the home
/// directories (canonical absolute paths) besides `/root` and
/// `/home/NAME`. `dir_into` is set for the destination of a directory
/// being moved: anywhere inside a git directory is refused then, since
/// what the directory holds would land there whole.
pub fn protected(path: &[u8], homes: &[&[u8]], dir_into: bool) -> Option<Rule> {
    let c = components(path);
    for (i, name) in c.iter().enumerate() {
        if gitdir(name) {
            let exact = eq(name, b".git");
            if let Some(rule) = in_gitdir(&c[i + 1..], exact) {
                return Some(rule);
            }
            if dir_into && i + 1 < c.len() {
                return Some(Rule::GitDir);
            }
        }
        if EDITOR_DIRS.iter().any(|d| eq(name, d)) {
            return Some(Rule::EditorConfig);
        }
        if AGENT_DIRS.iter().any(|d| eq(name, d)) {
            return Some(Rule::AgentConfig);
        }
    }
    let last = c.last()?;
    if AGENT_FILES.iter().any(|n| eq(last, n)) {
        return Some(Rule::AgentConfig);
    }
    if SHELL_HOOK_FILES.iter().any(|n| eq(last, n)) {
        return Some(Rule::ShellHook);
    }
    let homes: Vec<Vec<&[u8]>> = homes.iter().map(|h| components(h)).collect();
    for (i, _) in c.iter().enumerate() {
        if !is_home(&c[..i], &homes) {
            continue;
        }
        let rest = &c[i..];
        if rest.len() == 1 && HOME_FILES.iter().any(|n| eq(rest[0], n)) {
            return Some(Rule::HomeStartup);
        }
        for (dir, name) in HOME_NESTED {
            let d = components(dir);
            if rest.len() <= d.len() || !rest.iter().zip(&d).all(|(a, b)| eq(a, b)) {
                continue;
            }
            match name {
                None => return Some(Rule::HomeStartup),
                Some(n) if rest.len() == d.len() + 1 && eq(rest[d.len()], n) => {
                    return Some(Rule::HomeStartup)
                }
                Some(_) => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decorations_come_off_one_at_a_time() {
        let forms = |n: &str| {
            undecorated(n.as_bytes()).into_iter().map(|v| String::from_utf8(v).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(forms("#.ENV#"), ["#.env#", ".env"]);
        assert_eq!(forms("..env.swp"), ["..env.swp", ".env"]);
        assert_eq!(forms(".env~"), [".env~", ".env"]);
        assert_eq!(forms(".#prod.env"), [".#prod.env", "prod.env"]);
        assert_eq!(forms("notes.txt"), ["notes.txt"]);
        // Bounded however many decorations are stacked.
        assert!(undecorated("~".repeat(100).as_bytes()).len() <= 16);
    }
}
