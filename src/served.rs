//! The shell's side of the served filesystem: the mounts' descriptors as
//! the confinement stage sends them, and each mount's device, read one
//! request at a time and answered with whole writes. It decides nothing:
//! the bytes go to the FS proxy machine (`Input::Fuse`), its replies come
//! back as `Output::FuseReply`.
//!
//! airlock never touches a mount: it lives in the child's mount namespace
//! only, and airlock reaches the files through its own root descriptors.
//! A reply is a write to the device, which never waits on the child.

use crate::session::Event;
use airlock_core::handles::ClientId;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// Mount `i` (in the plan's order) is served as client `MOUNT_CLIENT_BASE + i`.
pub const MOUNT_CLIENT_BASE: u64 = 1 << 20;

/// The client a mount is served as.
pub fn mount_client(index: u32) -> ClientId {
    ClientId(MOUNT_CLIENT_BASE + u64::from(index))
}

/// Room for the largest request beyond its data (headers, names).
const REQUEST_OVERHEAD: usize = 64 << 10;

/// `struct fuse_backing_map` (linux/fuse.h).
#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// `_IOW(229, 1, struct fuse_backing_map)`.
const FUSE_DEV_IOC_BACKING_OPEN: libc::Ioctl = 0x4010_e501 as libc::Ioctl;
/// `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::Ioctl = 0x4004_e502 as libc::Ioctl;

/// One mount's device, being served.
pub struct Device {
    fd: Arc<AsyncFd<OwnedFd>>,
    reader: JoinHandle<()>,
    /// Told when the machine is ready for the mount's next request.
    pub ready: Arc<Notify>,
}

impl Device {
    /// Serve `fd` (a `/dev/fuse` descriptor) as `client`: read requests of
    /// up to `max_write` bytes of data, one per read, into `events`.
    pub fn serve(
        fd: OwnedFd,
        client: ClientId,
        max_write: usize,
        events: mpsc::Sender<Event>,
    ) -> std::io::Result<Self> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        // SAFETY: `fd` is an open descriptor, owned by the AsyncFd from
        // now on and never replaced while it is.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let fd = Arc::new(fd);
        let ready = Arc::new(Notify::new());
        let (rd, wake) = (fd.clone(), ready.clone());
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; max_write + REQUEST_OVERHEAD];
            loop {
                let Ok(mut guard) = rd.readable().await else { break };
                match guard
                    .try_io(|inner| rustix::io::read(inner.get_ref(), &mut buf[..]).map_err(Into::into))
                {
                    Err(_would_block) => continue,
                    Ok(Ok(0)) => break,
                    Ok(Ok(n)) => {
                        if events.send(Event::Fuse(client, buf[..n].to_vec())).await.is_err() {
                            return;
                        }
                        // One request at a time: the next once the machine
                        // has taken this one and has room.
                        wake.notified().await;
                    }
                    // The request was interrupted before it was read.
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    // ENODEV: unmounted (the child's mount namespace is gone).
                    Ok(Err(_)) => break,
                }
            }
            let _ = events.send(Event::Eof(client)).await;
        });
        Ok(Device { fd, reader, ready })
    }

    /// Write one reply whole. A reply to a request the kernel gave up on
    /// (interrupted, or the mount aborted) fails with `ENOENT`, harmlessly.
    pub fn reply(&self, data: &[u8]) {
        let _ = rustix::io::write(self.fd.get_ref(), data);
    }

    /// The device's descriptor (for registering backing files).
    pub fn raw(&self) -> std::os::fd::RawFd {
        self.fd.get_ref().as_raw_fd()
    }

    /// Register `file` as a backing file of this mount
    /// (`FUSE_DEV_IOC_BACKING_OPEN`): the kernel then reads it itself for
    /// an open answered with its id. Needs `CAP_SYS_ADMIN` in the initial
    /// user namespace.
    pub fn register_backing(&self, file: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u32> {
        let map = BackingMap { fd: file.as_raw_fd(), flags: 0, padding: 0 };
        // SAFETY: the ioctl reads the map we own, whose layout is the
        // kernel's `struct fuse_backing_map`, and returns an id or -1.
        let r = unsafe { libc::ioctl(self.raw(), FUSE_DEV_IOC_BACKING_OPEN, &map) };
        match u32::try_from(r) {
            Ok(id) if id > 0 => Ok(id),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Drop registration `id` (`FUSE_DEV_IOC_BACKING_CLOSE`); the kernel's
    /// open files keep what they use.
    pub fn drop_backing(&self, id: u32) -> std::io::Result<()> {
        // SAFETY: the ioctl reads the id we own.
        let r = unsafe { libc::ioctl(self.raw(), FUSE_DEV_IOC_BACKING_CLOSE, &id) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Receive the mounts' descriptors the stage sends over `socket`: each
/// message is the mount's index (4 bytes, little-endian) with its
/// descriptor. Ends at the socket's end.
pub fn receive(socket: OwnedFd, events: mpsc::Sender<Event>) -> std::io::Result<JoinHandle<()>> {
    let std = std::os::unix::net::UnixStream::from(socket);
    std.set_nonblocking(true)?;
    let sock = tokio::net::UnixStream::from_std(std)?;
    Ok(tokio::spawn(async move {
        let mut buf = [0u8; 4];
        loop {
            if sock.readable().await.is_err() {
                return;
            }
            let got = sock.try_io(Interest::READABLE, || recv_fd(sock.as_fd(), &mut buf));
            match got {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok((4, Some(fd))) => {
                    if events.send(Event::FuseMount(u32::from_le_bytes(buf), fd)).await.is_err() {
                        return;
                    }
                }
                // A message without its descriptor, or a short one: skipped.
                Ok((n, _)) if n > 0 => continue,
                _ => return,
            }
        }
    }))
}

fn recv_fd(fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Option<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let msg =
        rustix::net::recvmsg(fd, &mut iov, &mut ancillary, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)?;
    let mut first = None;
    for m in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = m {
            for fd in passed {
                if first.is_none() {
                    first = Some(fd);
                }
            }
        }
    }
    Ok((msg.bytes, first))
}
