//! The egress proxies' listeners, across the confinement boundary.
//!
//! A socket belongs to the network namespace it was created in. PID 1 of
//! the confinement, inside the child's new network namespace, creates the
//! two listeners on its loopback ([`hand_over`]) and sends them to airlock
//! over a socket the stage inherited; airlock ([`receive`]) then accepts
//! the child's proxy connections from outside the namespace and connects
//! out from the host's. No process forwards anything, and nothing of it
//! reaches the payload: PID 1 closes its copies before it forks.

use airlock_core::sandbox::{Confinement, EgressListen};
use anyhow::{bail, Context};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

/// Connections a listener queues before airlock accepts them.
const BACKLOG: i32 = 128;

fn listener(port: u16) -> anyhow::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(AddressFamily::INET, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .context("socket")?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true).context("SO_REUSEADDR")?;
    let addr = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    rustix::net::bind(&fd, &addr).with_context(|| format!("binding 127.0.0.1:{port}"))?;
    rustix::net::listen(&fd, BACKLOG).context("listen")?;
    Ok(fd)
}

/// In PID 1, once loopback is up: create both listeners and send them to
/// airlock, then close every copy here.
pub fn hand_over(listen: &EgressListen) -> anyhow::Result<()> {
    // SAFETY: the spawner placed this descriptor here for the stage alone;
    // it is owned (and closed) from now on.
    let channel = unsafe { OwnedFd::from_raw_fd(listen.fd) };
    let http = listener(listen.http_port)?;
    let socks = listener(listen.socks_port)?;
    let fds = [http.as_fd(), socks.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = rustix::net::SendAncillaryBuffer::new(&mut space);
    ancillary.push(rustix::net::SendAncillaryMessage::ScmRights(&fds));
    let sent = rustix::net::sendmsg(
        &channel,
        &[std::io::IoSlice::new(b"L")],
        &mut ancillary,
        rustix::net::SendFlags::NOSIGNAL,
    )
    .context("sending the proxy listeners to airlock")?;
    if sent != 1 {
        bail!("sending the proxy listeners to airlock: cut short");
    }
    Ok(())
}

/// In the stage outside the namespaces (or refusing): its copy of the
/// channel goes.
pub fn close_inherited(plan: &Confinement) {
    if let Some(listen) = &plan.egress {
        // SAFETY: the descriptor was placed here for the stage; closing an
        // already-closed number answers EBADF harmlessly.
        unsafe { libc::close(listen.fd) };
    }
}

/// The two listeners, as airlock received them.
pub struct Listeners {
    pub http: std::net::TcpListener,
    pub socks: std::net::TcpListener,
}

/// airlock's side: the listeners PID 1 sent, already queued on `ours` (the
/// stage has reported, so PID 1 is past sending).
pub fn receive(ours: &OwnedFd) -> anyhow::Result<Listeners> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    rustix::net::recvmsg(ours, &mut iov, &mut ancillary, RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT)
        .context("the confinement handed over no proxy listeners")?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(passed) = m {
            fds.extend(passed);
        }
    }
    let mut fds = fds.into_iter();
    let (Some(http), Some(socks), None) = (fds.next(), fds.next(), fds.next()) else {
        bail!("the confinement handed over other than two proxy listeners");
    };
    let http = std::net::TcpListener::from(http);
    let socks = std::net::TcpListener::from(socks);
    http.set_nonblocking(true)?;
    socks.set_nonblocking(true)?;
    Ok(Listeners { http, socks })
}
