//! Files airlock writes for the user (`--report`, `--record`). A nested
//! airlock is confined like any other child, so it writes them through
//! its upstream proxy, under the outer level's policy, instead of
//! directly.

use crate::client::{Client, CHUNK};
use airlock_core::fsproxy::wire::Mode;
use airlock_core::handles::Handle;
use anyhow::Context;
use std::io::{self, Write};
use std::os::fd::BorrowedFd;
use std::path::Path;

pub enum OutFile {
    Host(std::fs::File),
    /// A file opened through the upstream proxy on a connection of its own.
    Proxy {
        client: Client,
        h: Handle,
    },
}

impl OutFile {
    /// Create (or truncate) `path`: on the host, or through the proxy
    /// connection `upstream` when airlock runs under another. A relative
    /// path is made absolute first, so it names the same file at the top.
    pub fn create(path: &Path, upstream: Option<BorrowedFd<'_>>) -> anyhow::Result<Self> {
        match upstream {
            None => Ok(OutFile::Host(std::fs::File::create(path)?)),
            Some(fd) => {
                let full = std::env::current_dir()?.join(path);
                let name = full.to_str().context("the path is not UTF-8")?;
                let mut client = Client::attach_via(fd).context("connecting to the upstream airlock")?;
                let h = client.open(name, Mode::Write).context("through the upstream airlock")?;
                Ok(OutFile::Proxy { client, h })
            }
        }
    }

    /// Close the file, reporting any error.
    pub fn finish(self) -> io::Result<()> {
        match self {
            OutFile::Host(mut f) => f.flush(),
            OutFile::Proxy { mut client, h } => client.close(h).map_err(io::Error::other),
        }
    }
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            OutFile::Host(f) => f.write(buf),
            OutFile::Proxy { client, h } => {
                let n = buf.len().min(CHUNK);
                let written = client.write(*h, &buf[..n]).map_err(io::Error::other)?;
                Ok(usize::try_from(written).unwrap_or(n).min(n))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            OutFile::Host(f) => f.flush(),
            OutFile::Proxy { .. } => Ok(()),
        }
    }
}
