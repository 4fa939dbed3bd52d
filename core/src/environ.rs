//! The environment policy: which of the host's variables a process airlock
//! starts (`run`'s child, `tool`'s tool, `toolexec serve`'s tools) gets.
//!
//! By default everything but credentials: a name holding `KEY`, `SECRET`,
//! `TOKEN`, `PASSWORD`, `PASSWD`, `CREDENTIAL` or `AUTH` (case-insensitive;
//! the word `AUTHOR`, as in `GIT_AUTHOR_NAME`, is not `AUTH`), a value
//! holding a URL with a password (`https://user:pw@host`), and the agent
//! sockets (`SSH_AUTH_SOCK`, `GPG_AGENT_INFO`). With [`Base::Core`]
//! (`--env-clear`) only [`CORE_NAMES`] and `LC_*` start out, and the same
//! credential rules still apply to them. `--env-pass NAME` lets one name
//! through whatever the rules say, except the names the caller withholds
//! for good (the broker's API key, airlock's own session variables: those
//! are airlock's to set, after the policy).
//!
//! The decision is a pure function of the names and values handed in; the
//! shell reads the environment and applies what [`EnvPolicy::decide`]
//! returns. It names what it removed and why, never a value.

use serde::Serialize;
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// Name parts that mark a credential, matched case-insensitively anywhere
/// in the name.
pub const CREDENTIAL_WORDS: [&str; 7] =
    ["KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"];
/// Agent sockets: whoever reaches them signs or decrypts as the user.
pub const AGENT_SOCKETS: [&str; 2] = ["SSH_AUTH_SOCK", "GPG_AGENT_INFO"];
/// What `--env-clear` keeps (with every `LC_*`).
pub const CORE_NAMES: [&str; 7] = ["PATH", "HOME", "LANG", "TERM", "TZ", "USER", "TMPDIR"];

/// Where the environment starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// The host's environment, minus credentials.
    #[default]
    Inherit,
    /// [`CORE_NAMES`] and `LC_*` only (`--env-clear`), minus credentials.
    Core,
}

/// Why a variable did not reach the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Removed {
    /// Its name holds one of [`CREDENTIAL_WORDS`].
    CredentialName,
    /// Its value holds a URL with a password.
    UrlPassword,
    /// One of [`AGENT_SOCKETS`].
    AgentSocket,
    /// Not in the core set, under [`Base::Core`].
    NotCore,
    /// Withheld by airlock whatever the flags (the broker's key, an
    /// enclosing session's variables).
    Withheld,
}

/// One variable kept from the process: its name (lossy if not UTF-8) and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RemovedVar {
    pub name: String,
    pub reason: Removed,
}

/// The policy: a base, names passed through, names withheld for good.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvPolicy {
    pub base: Base,
    /// `--env-pass`: these names go through the credential rules and the
    /// core set unchecked.
    pub pass: BTreeSet<OsString>,
    /// Never passed, whatever `pass` says.
    pub withhold: BTreeSet<OsString>,
}

/// What the process gets, and what it does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// In the order handed in.
    pub keep: Vec<(OsString, OsString)>,
    /// Sorted by name.
    pub removed: Vec<RemovedVar>,
}

impl Decision {
    /// The names removed, sorted.
    pub fn removed_names(&self) -> Vec<&str> {
        self.removed.iter().map(|r| r.name.as_str()).collect()
    }
}

impl EnvPolicy {
    /// The default policy: inherit, minus credentials.
    pub fn new() -> Self {
        EnvPolicy::default()
    }

    /// Why `name=value` is kept from the process, or `None` to pass it.
    pub fn verdict(&self, name: &OsStr, value: &OsStr) -> Option<Removed> {
        if self.withhold.contains(name) {
            return Some(Removed::Withheld);
        }
        if self.pass.contains(name) {
            return None;
        }
        let n = name.as_bytes();
        if AGENT_SOCKETS.iter().any(|a| a.as_bytes() == n) {
            return Some(Removed::AgentSocket);
        }
        if credential_name(n) {
            return Some(Removed::CredentialName);
        }
        if url_with_password(value.as_bytes()) {
            return Some(Removed::UrlPassword);
        }
        if self.base == Base::Core && !core_name(n) {
            return Some(Removed::NotCore);
        }
        None
    }

    /// Split `vars` into what the process gets and what it does not.
    pub fn decide<I>(&self, vars: I) -> Decision
    where
        I: IntoIterator<Item = (OsString, OsString)>,
    {
        let mut d = Decision::default();
        for (name, value) in vars {
            match self.verdict(&name, &value) {
                None => d.keep.push((name, value)),
                Some(reason) => {
                    d.removed.push(RemovedVar { name: name.to_string_lossy().into_owned(), reason })
                }
            }
        }
        d.removed.sort();
        d.removed.dedup();
        d
    }
}

/// Whether `name` holds a credential word (ASCII case-insensitive). `AUTH`
/// at the start of `AUTHOR` does not count unless `AUTHORI…` follows
/// (`AUTHORIZATION`, `XAUTHORITY` are credentials; `GIT_AUTHOR_NAME` is
/// not).
pub fn credential_name(name: &[u8]) -> bool {
    let upper: Vec<u8> = name.to_ascii_uppercase();
    for word in CREDENTIAL_WORDS {
        let w = word.as_bytes();
        let mut at = 0;
        while let Some(i) = find(&upper[at..], w) {
            let i = at + i;
            let author = w == b"AUTH"
                && upper[i..].starts_with(b"AUTHOR")
                && upper.get(i + 6).is_none_or(|&c| c != b'I');
            if !author {
                return true;
            }
            at = i + 1;
        }
    }
    false
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn core_name(name: &[u8]) -> bool {
    CORE_NAMES.iter().any(|c| c.as_bytes() == name) || name.starts_with(b"LC_")
}

/// Whether `value` holds, anywhere, a URL whose authority has a password:
/// `scheme://user:password@host`. A user alone (`ssh://git@host`) is not
/// a password.
pub fn url_with_password(value: &[u8]) -> bool {
    let mut at = 0;
    while let Some(i) = find(&value[at..], b"://") {
        let start = at + i + 3;
        let rest = &value[start..];
        // The authority ends at the path, query or fragment, or at what
        // separates one URL from the next in a list.
        let end = rest
            .iter()
            .position(|&c| matches!(c, b'/' | b'?' | b'#' | b' ' | b',' | b';' | b'\t' | b'\n'))
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        if let Some(atsign) = authority.iter().rposition(|&c| c == b'@') {
            if authority[..atsign].contains(&b':') {
                return true;
            }
        }
        at = start;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    #[test]
    fn credentials_are_removed_by_name_url_and_socket() {
        let d = EnvPolicy::new().decide(vars(&[
            ("PATH", "/usr/bin"),
            ("OPENAI_API_KEY", "sk-1"),
            ("ANTHROPIC_API_KEY", "sk-2"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("GITHUB_TOKEN", "ghp"),
            ("db_password", "pw"),
            ("MYSQL_PWD", "kept: no word of the list"),
            ("HTTPS_PROXY", "http://u:pw@proxy:3128"),
            ("NO_PROXY", "localhost"),
            ("GIT_REMOTE", "ssh://git@github.com/x"),
            ("SSH_AUTH_SOCK", "/tmp/ssh"),
            ("GPG_AGENT_INFO", "/run/gpg"),
            ("GIT_AUTHOR_NAME", "A"),
            ("HTTP_AUTHORIZATION", "Bearer x"),
            ("XAUTHORITY", "/home/u/.Xauthority"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/k.json"),
            ("LANG", "C"),
        ]));
        let kept: Vec<_> = d.keep.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(kept, ["PATH", "MYSQL_PWD", "NO_PROXY", "GIT_REMOTE", "GIT_AUTHOR_NAME", "LANG"]);
        let removed: Vec<_> = d.removed.iter().map(|r| (r.name.as_str(), r.reason)).collect();
        assert_eq!(
            removed,
            [
                ("ANTHROPIC_API_KEY", Removed::CredentialName),
                ("AWS_SECRET_ACCESS_KEY", Removed::CredentialName),
                ("GITHUB_TOKEN", Removed::CredentialName),
                ("GOOGLE_APPLICATION_CREDENTIALS", Removed::CredentialName),
                ("GPG_AGENT_INFO", Removed::AgentSocket),
                ("HTTPS_PROXY", Removed::UrlPassword),
                ("HTTP_AUTHORIZATION", Removed::CredentialName),
                ("OPENAI_API_KEY", Removed::CredentialName),
                ("SSH_AUTH_SOCK", Removed::AgentSocket),
                ("XAUTHORITY", Removed::CredentialName),
                ("db_password", Removed::CredentialName),
            ]
        );
    }

    #[test]
    fn pass_lets_a_name_through_and_withhold_wins() {
        let mut p = EnvPolicy::new();
        p.pass.insert("GITHUB_TOKEN".into());
        p.pass.insert("OPENAI_API_KEY".into());
        p.withhold.insert("OPENAI_API_KEY".into());
        let d = p.decide(vars(&[("GITHUB_TOKEN", "g"), ("OPENAI_API_KEY", "k"), ("GITLAB_TOKEN", "l")]));
        assert_eq!(d.keep, vars(&[("GITHUB_TOKEN", "g")]));
        assert_eq!(d.removed_names(), ["GITLAB_TOKEN", "OPENAI_API_KEY"]);
        assert_eq!(d.removed[1].reason, Removed::Withheld);
    }

    #[test]
    fn clear_keeps_the_core_set_and_passes() {
        let mut p = EnvPolicy { base: Base::Core, ..EnvPolicy::new() };
        p.pass.insert("EDITOR".into());
        let d = p.decide(vars(&[
            ("PATH", "/bin"),
            ("HOME", "/h"),
            ("LC_ALL", "C"),
            ("TERM", "xterm"),
            ("EDITOR", "vi"),
            ("PAGER", "less"),
            ("HOME_TOKEN", "t"),
        ]));
        let kept: Vec<_> = d.keep.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(kept, ["PATH", "HOME", "LC_ALL", "TERM", "EDITOR"]);
        assert_eq!(d.removed[0], RemovedVar { name: "HOME_TOKEN".into(), reason: Removed::CredentialName });
        assert_eq!(d.removed[1], RemovedVar { name: "PAGER".into(), reason: Removed::NotCore });
    }

    #[test]
    fn urls_with_passwords_anywhere_in_a_value() {
        for v in [
            "http://u:p@h",
            "HTTPS://u:p@h:443/x",
            "a b https://x:y@h",
            "http://h/ http://u:@h2",
            "socks5://u:p@[::1]:1080",
            "postgres://u:p@db/x?sslmode=require",
        ] {
            assert!(url_with_password(v.as_bytes()), "{v}");
        }
        for v in
            ["http://h/u:p@x", "http://u@h", "u:p@h", "http://h?u:p@x", "://", "", "x://", "http://h#a:b@c"]
        {
            assert!(!url_with_password(v.as_bytes()), "{v}");
        }
    }

    #[test]
    fn author_is_not_auth_but_authorization_is() {
        for n in ["GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "AUTHOR", "git_author_date", "AUTHORS"] {
            assert!(!credential_name(n.as_bytes()), "{n}");
        }
        for n in [
            "AUTH",
            "OAUTH",
            "XAUTHORITY",
            "AUTHORIZATION",
            "GIT_AUTHOR_AUTH",
            "AUTHOR_KEY",
            "npm_config__auth",
        ] {
            assert!(credential_name(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn names_that_are_not_utf8_are_decided_and_reported_lossily() {
        use std::os::unix::ffi::OsStringExt;
        let name = OsString::from_vec(b"X_\xffTOKEN".to_vec());
        let d = EnvPolicy::new().decide([(name, OsString::from("v"))]);
        assert!(d.keep.is_empty());
        assert_eq!(d.removed[0].name, "X_\u{fffd}TOKEN");
    }

    proptest! {
        /// Any name holding a credential word, in any case and position,
        /// is removed unless passed; a passed one is kept unless withheld.
        #[test]
        fn every_credential_word_anywhere(pre in "[A-Z_]{0,6}", word in 0..CREDENTIAL_WORDS.len(), post in "[A-Z_0-9]{0,6}", lower in any::<bool>(), passed in any::<bool>()) {
            let mut name = format!("{pre}{}{post}", CREDENTIAL_WORDS[word]);
            if lower {
                name = name.to_lowercase();
            }
            let upper = name.to_ascii_uppercase();
            // The one carve-out: AUTH starting AUTHOR (not AUTHORI…), with no other word.
            prop_assume!(!(CREDENTIAL_WORDS[word] == "AUTH" && post.starts_with("OR")));
            let mut p = EnvPolicy::new();
            if passed {
                p.pass.insert(name.clone().into());
            }
            let d = p.decide([(OsString::from(&name), OsString::from("v"))]);
            prop_assert_eq!(d.keep.len() == 1, passed, "{}", upper);
        }

        /// Whatever the variables, every one is either kept or removed,
        /// once, and a withheld one never reaches the process.
        #[test]
        fn kept_and_removed_partition_the_input(names in proptest::collection::btree_set("[A-Za-z_]{1,10}", 0..12), clear in any::<bool>(), withhold in "[A-Za-z_]{1,10}") {
            let mut p = EnvPolicy { base: if clear { Base::Core } else { Base::Inherit }, ..EnvPolicy::new() };
            p.withhold.insert(withhold.clone().into());
            p.pass.insert(withhold.clone().into());
            let input: Vec<(OsString, OsString)> = names.iter().map(|n| (n.into(), "v".into())).collect();
            let d = p.decide(input.clone());
            prop_assert_eq!(d.keep.len() + d.removed.len(), input.len());
            prop_assert!(d.keep.iter().all(|(k, _)| *k != OsString::from(&withhold)));
        }
    }
}
