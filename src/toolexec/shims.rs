//! `airlock toolexec write-shims DIR --tool NAME...`: the POSIX curl shim of
//! the ToolExec seed's client description, and one link per tool name.
//!
//! The shim is the contract users of aifo-coder-rs already rely on: curl
//! `-sS --no-buffer`, headers and trailers captured with `-D`, `X-Aifo-Proto:
//! 2` and `TE: trailers`, `unix://PATH` through `--unix-socket` with
//! `http://localhost/exec`, the body streamed to stdout, and the exit code
//! taken from the last `X-Exit-Code:` line of the header file (1 if none).
//! It is plain POSIX sh (no bash arrays), so it runs under dash and busybox.

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// The file every link points at; the name aifo-coder-rs users have.
pub const SHIM_NAME: &str = "aifo-shim";

/// The POSIX client. The token travels in a header file (`-H @file`) inside
/// a private temporary directory rather than on curl's command line, where
/// any local user could read it from `/proc/PID/cmdline`.
pub const POSIX_SHIM: &str = r#"#!/bin/sh
# aifo-shim: ToolExec v2 client (POSIX sh + curl), written by
# `airlock toolexec write-shims`. Invoked through a link named after the tool.
# Needs AIFO_TOOLEEXEC_URL (http://HOST:PORT/exec or unix:///path/to.sock)
# and AIFO_TOOLEEXEC_TOKEN.
if [ -z "${AIFO_TOOLEEXEC_URL:-}" ] || [ -z "${AIFO_TOOLEEXEC_TOKEN:-}" ]; then
  echo "aifo-shim: AIFO_TOOLEEXEC_URL and AIFO_TOOLEEXEC_TOKEN must be set" >&2
  exit 86
fi
if ! command -v curl >/dev/null 2>&1; then
  echo "aifo-shim: curl not found on PATH" >&2
  exit 86
fi
tool=$(basename "$0")
cwd=$(pwd)
tmp=$(umask 077 && mktemp -d "${TMPDIR:-/tmp}/aifo-shim.XXXXXX") || {
  echo "aifo-shim: cannot create a temporary directory" >&2
  exit 86
}
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
printf 'Authorization: Bearer %s\n' "$AIFO_TOOLEEXEC_TOKEN" >"$tmp/auth"

# Replace the positional parameters by one --data-urlencode per argument,
# in order: POSIX sh has no arrays.
n=$#
for a in "$@"; do
  set -- "$@" --data-urlencode "arg=$a"
done
shift "$n"

case $AIFO_TOOLEEXEC_URL in
  unix://*)
    set -- --unix-socket "${AIFO_TOOLEEXEC_URL#unix://}" "$@"
    url=http://localhost/exec
    ;;
  *)
    url=$AIFO_TOOLEEXEC_URL
    ;;
esac

curl -sS --no-buffer -D "$tmp/h" -X POST \
  -H @"$tmp/auth" \
  -H "X-Aifo-Proto: 2" \
  -H "TE: trailers" \
  -H "Content-Type: application/x-www-form-urlencoded" \
  --data-urlencode "tool=$tool" \
  --data-urlencode "cwd=$cwd" \
  "$@" "$url"

ec=
if [ -f "$tmp/h" ]; then
  ec=$(awk '/^X-Exit-Code:/{print $2}' "$tmp/h" | tr -d '\r' | tail -n1)
fi
[ -n "$ec" ] || ec=1
exit "$ec"
"#;

/// Which client the links run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Client {
    /// The POSIX curl shim (`aifo-shim`), as aifo-coder-rs ships it.
    Posix,
    /// This airlock binary, which acts as `airlock toolexec shim NAME` when
    /// invoked through a link named NAME.
    Rust,
}

#[derive(Debug, Args)]
pub struct WriteShimsArgs {
    /// The directory to write into (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// A tool to link; repeat for each.
    #[arg(long = "tool", value_name = "NAME", required = true)]
    pub tools: Vec<String>,
    /// Which client the links run.
    #[arg(long, value_enum, default_value = "posix")]
    pub client: Client,
}

/// A tool name becomes a file name in DIR and the shim's `tool` field, so it
/// must be one plain path component that cannot shadow the shim itself.
pub fn check_tool_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name == SHIM_NAME
        || name.contains('/')
        || name.contains('\0')
        || name.chars().any(char::is_whitespace)
    {
        bail!("toolexec: bad tool name {name:?}: it must be one path component, not {SHIM_NAME:?}");
    }
    Ok(())
}

/// Write the shim and the links; an existing link or shim is replaced, any
/// other existing file is left alone and reported.
pub fn write_shims(args: &WriteShimsArgs) -> anyhow::Result<i32> {
    for t in &args.tools {
        check_tool_name(t)?;
    }
    fs::create_dir_all(&args.dir).with_context(|| format!("toolexec: creating {}", args.dir.display()))?;
    let target: PathBuf = match args.client {
        Client::Posix => {
            let shim = args.dir.join(SHIM_NAME);
            write_executable(&shim, POSIX_SHIM)?;
            PathBuf::from(SHIM_NAME)
        }
        Client::Rust => std::env::current_exe()
            .and_then(fs::canonicalize)
            .context("toolexec: locating the airlock binary")?,
    };
    for t in &args.tools {
        let link = args.dir.join(t);
        replace_link(&link, &target)?;
    }
    Ok(0)
}

fn write_executable(path: &Path, text: &str) -> anyhow::Result<()> {
    // Write beside and rename so a shim running right now never sees half a file.
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).with_context(|| format!("toolexec: writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("toolexec: chmod {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("toolexec: installing {}", path.display()))?;
    Ok(())
}

fn replace_link(link: &Path, target: &Path) -> anyhow::Result<()> {
    match fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {
            fs::remove_file(link).with_context(|| format!("toolexec: replacing {}", link.display()))?
        }
        Ok(_) => bail!("toolexec: {} exists and is not a link; not overwriting it", link.display()),
        Err(_) => {}
    }
    symlink(target, link).with_context(|| format!("toolexec: linking {}", link.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "aifo-shim", "a b", "x\0"] {
            assert!(check_tool_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["cargo", "g++", "pkg-config", "python3"] {
            assert!(check_tool_name(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn shim_is_posix_and_follows_the_seed() {
        // The seed's client description, item by item.
        for needle in [
            "curl -sS --no-buffer -D \"$tmp/h\"",
            "-H \"X-Aifo-Proto: 2\"",
            "-H \"TE: trailers\"",
            "--unix-socket \"${AIFO_TOOLEEXEC_URL#unix://}\"",
            "url=http://localhost/exec",
            "awk '/^X-Exit-Code:/{print $2}'",
            "[ -n \"$ec\" ] || ec=1",
        ] {
            assert!(POSIX_SHIM.contains(needle), "shim lacks {needle:?}");
        }
        assert!(!POSIX_SHIM.contains("cmd+=("), "bash arrays are not POSIX");
        assert!(!POSIX_SHIM.contains("-o "), "the body goes to stdout");
    }
}
