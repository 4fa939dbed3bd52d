//! What a session leaves on the host while it runs (its socket's
//! directory, its cgroups), named so that a later airlock of the same
//! user can tell a dead session's leftovers from a live one's and remove
//! them: `airlock-<pid>.<start>-<suffix>`, where `<start>` is the owner's
//! start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`), so
//! a reused pid is not taken for its former owner. A SIGKILLed airlock
//! cleans nothing up; the next one does.

use std::path::{Path, PathBuf};

/// Every name begins so.
pub const PREFIX: &str = "airlock-";

/// The longest path of a unix socket (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Where a session's socket directory goes: the user's runtime directory
/// (`$XDG_RUNTIME_DIR`, which the system empties at logout and reboot)
/// when it is `private` (a directory of the user's own, mode 0700, not a
/// symlink) and short enough for `tail` (the directory's name and the
/// socket's) beneath it; else the temporary directory, else `/tmp`.
pub fn socket_base(runtime_dir: Option<(&Path, bool)>, temp_dir: &Path, tail: usize) -> PathBuf {
    let fits = |p: &Path| p.is_absolute() && p.as_os_str().len() + 1 + tail <= MAX_SOCKET_PATH;
    match runtime_dir {
        Some((p, true)) if fits(p) => p.to_path_buf(),
        _ if fits(temp_dir) => temp_dir.to_path_buf(),
        _ => PathBuf::from("/tmp"),
    }
}

/// The airlock process a leftover belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub pid: u32,
    pub start: u64,
}

/// The name of a leftover of `owner`'s, told apart from its siblings by
/// `suffix` (lowercase hex or decimal digits).
pub fn name(owner: Owner, suffix: &str) -> String {
    format!("{PREFIX}{}.{}-{suffix}", owner.pid, owner.start)
}

/// The owner a name says, when it is one of [`name`]'s.
pub fn owner(name: &str) -> Option<Owner> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, rest) = rest.split_once('.')?;
    let (start, suffix) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(start) || suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(Owner { pid: pid.parse().ok()?, start: start.parse().ok()? })
}

/// A socket directory of airlock before leftovers were named by owner:
/// `airlock-` and 16 hex digits. Its owner is unknown; it is stale when
/// its socket refuses a connection (no one listens).
pub fn is_unowned_socket_dir(name: &str) -> bool {
    name.strip_prefix(PREFIX).is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `owner`'s leftover is stale: the pid runs no process, or one
/// started at another time (`running` is the start time of the process
/// that has the pid now, if any).
pub fn is_stale(owner: Owner, running: Option<u64>) -> bool {
    running != Some(owner.start)
}

/// The start time in a `/proc/<pid>/stat` line (field 22); the command
/// name in parentheses may hold spaces and parentheses of its own.
pub fn start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The suffix of a session's hold ledger (a file beside the socket
/// directories, named by [`name`]): the placeholders it made in writable
/// trees (`super::guarded::Cover::Hold`), for a later airlock to remove
/// when the session died without doing so.
pub const LEDGER_SUFFIX: &str = "401d";

/// Entries a ledger is read for at most (a view holds no more covers).
pub const MAX_LEDGER_ENTRIES: usize = super::guarded::MAX_COVERS;

/// A placeholder a session made: where, what, and the device and inode it
/// had then, so that only that one is ever removed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placeholder {
    pub path: PathBuf,
    pub dir: bool,
    pub dev: u64,
    pub ino: u64,
}

/// A ledger's text: a line per placeholder, `DEV INO d|f HEXPATH`.
pub fn ledger(entries: &[Placeholder]) -> Vec<u8> {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for e in entries {
        let _ = write!(out, "{} {} {} ", e.dev, e.ino, if e.dir { 'd' } else { 'f' });
        for b in e.path.as_os_str().as_bytes() {
            let _ = write!(out, "{b:02x}");
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// The placeholders a ledger names: its well-formed lines of absolute
/// paths, at most [`MAX_LEDGER_ENTRIES`]; anything else is skipped.
pub fn parse_ledger(text: &[u8]) -> Vec<Placeholder> {
    use std::os::unix::ffi::OsStrExt;
    let line = |l: &[u8]| -> Option<Placeholder> {
        let l = std::str::from_utf8(l).ok()?;
        let mut f = l.split(' ');
        let (dev, ino, kind, hex) = (f.next()?, f.next()?, f.next()?, f.next()?);
        if f.next().is_some() || hex.len() % 2 != 0 {
            return None;
        }
        let dir = match kind {
            "d" => true,
            "f" => false,
            _ => return None,
        };
        let bytes: Option<Vec<u8>> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect();
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes?));
        if !path.is_absolute() {
            return None;
        }
        Some(Placeholder { path, dir, dev: dev.parse().ok()?, ino: ino.parse().ok()? })
    };
    text.split(|b| *b == b'\n').filter_map(line).take(MAX_LEDGER_ENTRIES).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_ledger_reads_back_what_it_wrote_and_nothing_malformed() {
        let entries = vec![
            Placeholder { path: "/p/.vscode".into(), dir: true, dev: 2049, ino: 77 },
            Placeholder { path: "/p/a b\nc".into(), dir: false, dev: 1, ino: 2 },
        ];
        assert_eq!(parse_ledger(&ledger(&entries)), entries);
        assert_eq!(
            parse_ledger(b"1 2 d 2f70\n1 2 x 2f70\n1 2 d 7\n1 2 d 7070\nx 2 d 2f70\n1 2 f 2f70 9"),
            [Placeholder { path: "/p".into(), dir: true, dev: 1, ino: 2 }]
        );
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_ledger(&bytes);
        }
    }

    #[test]
    fn a_stat_line_gives_its_start_time_whatever_the_name() {
        let line = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(start_time(line), Some(987_654));
        assert_eq!(start_time("garbage"), None);
        assert_eq!(start_time("1 (x) S 1"), None);
    }

    #[test]
    fn only_names_of_the_form_are_owned() {
        assert_eq!(owner("airlock-12.34-ab"), Some(Owner { pid: 12, start: 34 }));
        for bad in [
            "airlock-12.34-",
            "airlock-12-34-ab",
            "airlock-x.34-ab",
            "airlock-12.34-zz",
            "other-1.2-a",
            "airlock-.1-a",
        ] {
            assert_eq!(owner(bad), None, "{bad}");
        }
        assert!(is_unowned_socket_dir("airlock-0123456789abcdef"));
        assert!(!is_unowned_socket_dir("airlock-0123456789abcde"));
        assert!(!is_unowned_socket_dir("airlock-12.34-ab"));
    }

    #[test]
    fn the_runtime_dir_is_used_only_when_private_and_short_enough() {
        let (run, tmp) = (Path::new("/run/user/1000"), Path::new("/var/tmp"));
        assert_eq!(socket_base(Some((run, true)), tmp, 40), run);
        assert_eq!(socket_base(Some((run, false)), tmp, 40), tmp);
        assert_eq!(socket_base(None, tmp, 40), tmp);
        assert_eq!(socket_base(Some((Path::new("run"), true)), tmp, 40), tmp);
        let long = PathBuf::from(format!("/{}", "x".repeat(90)));
        assert_eq!(socket_base(Some((&long, true)), &long, 40), Path::new("/tmp"));
    }

    #[test]
    fn a_live_owner_keeps_its_leftovers_and_a_reused_pid_does_not() {
        let o = Owner { pid: 7, start: 100 };
        assert!(!is_stale(o, Some(100)));
        assert!(is_stale(o, Some(101)));
        assert!(is_stale(o, None));
    }

    proptest! {
        #[test]
        fn names_round_trip(pid in any::<u32>(), start in any::<u64>(), suffix in "[0-9a-f]{1,16}") {
            let o = Owner { pid, start };
            let n = name(o, &suffix);
            prop_assert_eq!(owner(&n), Some(o));
            prop_assert!(!is_unowned_socket_dir(&n));
        }

        #[test]
        fn any_name_parses_without_panicking(n in ".{0,64}") {
            let _ = owner(&n);
            let _ = is_unowned_socket_dir(&n);
        }
    }
}
