//! `--listen` addresses: loopback TCP (others only with `--allow-remote`)
//! and unix sockets (0600, a stale one replaced, removed at exit).

use anyhow::{bail, Context};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

pub enum Listener {
    Tcp(TcpListener, SocketAddr),
    Unix(UnixListener, PathBuf),
}

pub struct Stream {
    io: Io,
}

enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Listener {
    pub async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(l, _) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(Stream { io: Io::Tcp(s) })
            }
            Listener::Unix(l, _) => Ok(Stream { io: Io::Unix(l.accept().await?.0) }),
        }
    }

    /// The value of the ready line.
    pub fn url(&self) -> String {
        match self {
            Listener::Tcp(_, addr) => format!("http://{addr}/exec"),
            Listener::Unix(_, path) => format!("unix://{}", path.display()),
        }
    }
}

/// The bound listeners; unix socket files are removed on drop.
pub struct Listeners {
    list: Vec<Listener>,
    unix_paths: Vec<PathBuf>,
}

impl Listeners {
    pub async fn bind(specs: &[String], allow_remote: bool) -> anyhow::Result<Listeners> {
        let mut out = Listeners { list: Vec::new(), unix_paths: Vec::new() };
        for spec in specs {
            if let Some(path) = spec.strip_prefix("unix://").or_else(|| spec.strip_prefix("unix:")) {
                let path = std::path::absolute(path).with_context(|| format!("--listen {spec}"))?;
                let l = bind_unix(&path).with_context(|| format!("--listen {spec}"))?;
                out.unix_paths.push(path.clone());
                out.list.push(Listener::Unix(l, path));
            } else {
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host(spec.as_str())
                    .await
                    .with_context(|| format!("--listen {spec}: not HOST:PORT or unix:PATH"))?
                    .collect();
                let Some(addr) = addrs.first().copied() else { bail!("--listen {spec}: no address") };
                if !addr.ip().is_loopback() && !allow_remote {
                    bail!(
                        "--listen {spec}: {} is not a loopback address; pass --allow-remote to listen on it",
                        addr.ip()
                    );
                }
                let l = TcpListener::bind(addr).await.with_context(|| format!("--listen {spec}"))?;
                let local = l.local_addr()?;
                out.list.push(Listener::Tcp(l, local));
            }
        }
        Ok(out)
    }

    pub fn urls(&self) -> Vec<String> {
        self.list.iter().map(Listener::url).collect()
    }

    pub fn take(&mut self) -> Vec<Listener> {
        std::mem::take(&mut self.list)
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for p in &self.unix_paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn bind_unix(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is in use by a running server", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| path.display().to_string()),
    }
    // No window in which the socket exists with wider permissions.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let l = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
