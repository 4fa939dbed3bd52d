//! The session socket: how a process of the session reaches it once the
//! descriptor it inherited is gone. Python's `subprocess` closes every
//! descriptor above 2 unless told otherwise, and so do `exec 3>&-` and many
//! tool runners; the environment survives them.
//!
//! `airlock run` listens on a Unix socket in a directory of its own (mode
//! 0700, in `$XDG_RUNTIME_DIR` when it is private, else the temporary
//! directory; removed when the session ends, whatever a child did to its
//! modes, and by the next airlock of the user when a SIGKILL left it) and
//! tells the child where it is (`AIRLOCK_SOCKET`) and the session's secret
//! (`AIRLOCK_TOKEN`), drawn from the OS RNG and known only to airlock and
//! the processes of the
//! session. A connection first sends a secret: the session's, checked
//! here, or a narrowed scope's (the answer to a `narrow`), which the FS
//! proxy machine looks up; one it does not know, or none in time, gets
//! nothing but the closed connection (and a count in the report). A
//! connection that proves it is then admitted or refused as an attach
//! would be: same limits, same cleanup, and the policy of what its secret
//! stands for (the session's, or the narrowed scope's and nothing wider).

use crate::session::Event;
use airlock_core::sandbox::sweep::{self, socket_base};
use anyhow::Context;
use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

/// The environment variable naming the session socket in a child.
pub const SOCKET_ENV: &str = "AIRLOCK_SOCKET";
/// The environment variable carrying the session's secret in a child.
pub const TOKEN_ENV: &str = "AIRLOCK_TOKEN";
/// Random bytes in a session's secret.
pub const TOKEN_BYTES: usize = 32;
/// The secret as sent on the socket: its bytes in lowercase hex.
pub const TOKEN_LEN: usize = TOKEN_BYTES * 2;
// A narrowed scope's secret is sent in the same place, so has the same form.
const _: () = assert!(TOKEN_LEN == airlock_core::fsproxy::SECRET_LEN);
/// How long a connection has to send the secret before it is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections that may be sending their secret at once; more wait in
/// the kernel's backlog until one is done or timed out.
pub const MAX_PENDING_HANDSHAKES: usize = 16;
/// The socket's name in its directory.
const SOCKET_NAME: &str = "session";
/// The longest name of the socket's directory: `airlock-PID.START-` and
/// 16 hex digits.
const DIR_NAME_MAX: usize = "airlock-".len() + 10 + 1 + 20 + 1 + 16;

/// The session's secret. Never printed: `Debug` shows nothing of it.
#[derive(Clone)]
pub struct Token([u8; TOKEN_LEN]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// A fresh secret for a narrowed scope (`Effect::DrawSecret`), drawn as
/// the session's is.
pub fn draw_secret() -> std::io::Result<airlock_core::fsproxy::Secret> {
    let token = Token::random()?;
    airlock_core::fsproxy::Secret::parse(&token.0)
        .ok_or_else(|| std::io::Error::other("a drawn secret is not hex"))
}

impl Token {
    fn random() -> std::io::Result<Token> {
        let mut raw = [0u8; TOKEN_BYTES];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
        let mut hex = [0u8; TOKEN_LEN];
        for (i, b) in raw.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        Ok(Token(hex))
    }

    fn as_str(&self) -> &str {
        // Hex digits only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// Whether `sent` is this secret, in time independent of where they
    /// differ.
    pub fn matches(&self, sent: &[u8]) -> bool {
        same_secret(&self.0, sent)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Equal in constant time: every byte is compared, whatever differs first.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The socket's directory, its path and the secret; the directory and
/// everything in it go when this is dropped (at the end of the session).
pub struct SessionSocket {
    dir: PathBuf,
    path: PathBuf,
    token: Token,
    listener: Option<std::os::unix::net::UnixListener>,
}

impl SessionSocket {
    /// A fresh directory under the user's runtime directory or the
    /// temporary directory (see `airlock_core::sandbox::sweep::socket_base`),
    /// the socket listening in it. Dead sessions' directories there are
    /// removed first.
    pub fn create() -> anyhow::Result<SessionSocket> {
        let token = Token::random().context("reading the OS random number generator")?;
        let base = base();
        crate::confine::sweep::socket_dirs(&base);
        let dir = private_dir(&base)?;
        let path = dir.join(SOCKET_NAME);
        let listener = match std::os::unix::net::UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                let _ = crate::confine::sweep::remove_tree(&dir);
                return Err(e).with_context(|| format!("listening on {}", path.display()));
            }
        };
        Ok(SessionSocket { dir, path, token, listener: Some(listener) })
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory holding the socket: what a sandbox must let the child
    /// reach for `AIRLOCK_SOCKET` to work.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The variables that lead a child here.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            (SOCKET_ENV.into(), self.path.clone().into_os_string()),
            (TOKEN_ENV.into(), self.token.as_str().into()),
        ]
    }

    /// Accept connections on the socket, checking each one's secret, and
    /// hand those that prove it to the session as `Event::Accepted`. Stops
    /// when the returned task is aborted (the session is ending).
    pub fn serve(&mut self, events: mpsc::Sender<Event>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let listener = self.listener.take().context("the session socket is already served")?;
        listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(listener)?;
        Ok(tokio::spawn(accept_loop(listener, self.token.clone(), events)))
    }
}

impl Drop for SessionSocket {
    fn drop(&mut self) {
        drop(self.listener.take());
        if let Err(e) = crate::confine::sweep::remove_tree(&self.dir) {
            tracing::warn!("removing the session socket's directory {}: {e}", self.dir.display());
        }
    }
}

/// Where session sockets' directories go (and the ledgers of
/// `crate::holds`): see `airlock_core::sandbox::sweep::socket_base`.
pub fn base() -> PathBuf {
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    let private = runtime.as_deref().map(|p| (p, is_private_dir(p)));
    socket_base(private, &std::env::temp_dir(), DIR_NAME_MAX + 1 + SOCKET_NAME.len())
}

/// Whether `p` is a directory of the user's own that nobody else may
/// enter (not a symlink): a place for the socket's directory.
fn is_private_dir(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid takes nothing.
    let me = unsafe { libc::geteuid() };
    std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == me && m.mode() & 0o077 == 0)
}

/// A directory of our own under `base`, named for this process (so a
/// later airlock can tell when it is left over): created, never found, so
/// nobody else's directory (or symlink) of the same name is ever used.
fn private_dir(base: &Path) -> anyhow::Result<PathBuf> {
    let me = crate::confine::sweep::me();
    let mut last = None;
    for _ in 0..8 {
        let mut raw = [0u8; 8];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
        let suffix: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let dir = base.join(sweep::name(me, &suffix));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no free name"), anyhow::Error::from))
        .with_context(|| format!("creating the session socket's directory in {}", base.display()))
}

async fn accept_loop(listener: UnixListener, token: Token, events: mpsc::Sender<Event>) {
    let slots = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    // Aborted with this task: no handshake outlives the session.
    let mut handshakes = JoinSet::new();
    loop {
        // Reap finished handshakes so the set stays small.
        while handshakes.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: try again shortly
                // rather than spin.
                tracing::warn!("session socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (token, events) = (token.clone(), events.clone());
        handshakes.spawn(async move {
            let event = match handshake(stream, &token).await {
                Some((stream, secret)) => Event::Accepted(stream, secret),
                None => Event::Unauthenticated,
            };
            let _ = events.send(event).await;
            drop(slot);
        });
    }
}

/// The stream, once it has sent a secret: the session's (`None`), or one
/// for the machine to look up among its narrowed scopes'. `None` (and the
/// stream closed) when it sent something that is no secret, too little,
/// or took too long.
async fn handshake(
    mut stream: UnixStream,
    token: &Token,
) -> Option<(UnixStream, Option<airlock_core::fsproxy::Secret>)> {
    let mut sent = [0u8; TOKEN_LEN];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut sent)).await {
        Ok(Ok(_)) if token.matches(&sent) => Some((stream, None)),
        Ok(Ok(_)) => airlock_core::fsproxy::Secret::parse(&sent).map(|s| (stream, Some(s))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abcd", b"abcd"));
        assert!(!same_secret(b"abcd", b"abce"));
        assert!(!same_secret(b"abcd", b"xbcd"));
        assert!(!same_secret(b"abcd", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }

    #[test]
    fn a_token_is_hex_and_never_printed() {
        let t = Token::random().expect("urandom");
        assert_eq!(t.as_str().len(), TOKEN_LEN);
        assert!(t.as_str().bytes().all(|b| HEX.contains(&b)));
        assert_ne!(t.as_str(), Token::random().expect("urandom").as_str());
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn the_directory_is_private_and_goes_with_the_socket() {
        use std::os::unix::fs::PermissionsExt;
        let s = SessionSocket::create().expect("socket");
        let dir = s.dir().to_path_buf();
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(s.path.starts_with(&dir) && s.path.exists());
        drop(s);
        assert!(!dir.exists());
    }
}
