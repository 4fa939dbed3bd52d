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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
