//! The served filesystem's confinement side. The stage's part: PID 1, inside
//! the new user and mount namespaces, opens `/dev/fuse` once per root to
//! serve, mounts each at the root's path in the view being built, and
//! sends the descriptors to airlock over the socket the plan names, which
//! serves them from outside.
//!
//! The descriptors must be opened here, not by airlock: the kernel lets a
//! FUSE mount use only a descriptor opened in the user namespace that owns
//! the mount. Nothing here touches a mount once it is made (airlock may
//! not be serving it yet); the first access, the working directory, comes
//! after the view is built, when airlock serves.
//!
//! Nothing fails the confinement: a root that cannot be mounted (no
//! `/dev/fuse`, a refused mount) stays reachable through the proxy, and
//! the stage says why in what it reports.
//!
//! airlock's part: what to mount ([`serve`]), the channel it hands the
//! stage ([`channel`], [`install`]) and whether it may register backing
//! files ([`can_passthrough`]).

use airlock_core::policy::Root;
use airlock_core::sandbox::fuse::{FusePlan, NotServed};
use airlock_core::sandbox::{Confinement, NsMode};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The socket to airlock, taken from the descriptor the plan names.
pub fn take_socket(plan: Option<&FusePlan>) -> Option<OwnedFd> {
    let fd = plan?.socket_fd;
    // SAFETY: the spawner placed the socket here for the stage alone; it
    // is owned from now on (an unopened number fails the fstat below).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if rustix::fs::fstat(&owned).is_err() {
        std::mem::forget(owned);
        return None;
    }
    let _ = rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC);
    Some(owned)
}

/// What PID 1 mounts, and what came of it.
pub struct Setup<'a> {
    plan: &'a FusePlan,
    socket: Option<OwnedFd>,
    /// One `/dev/fuse` descriptor per mount, opened before the view.
    devices: Vec<OwnedFd>,
    pub mounted: Vec<PathBuf>,
    pub error: Option<String>,
}

impl<'a> Setup<'a> {
    /// Open the devices while the host's `/dev` is still in reach.
    pub fn open(plan: &'a FusePlan, socket: Option<OwnedFd>) -> Self {
        let mut s = Setup { plan, socket, devices: Vec::new(), mounted: Vec::new(), error: None };
        if s.socket.is_none() {
            s.error = Some("no channel to airlock".into());
            return s;
        }
        for _ in &plan.mounts {
            match rustix::fs::open(
                "/dev/fuse",
                rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            ) {
                Ok(fd) => s.devices.push(fd),
                Err(e) => {
                    s.error = Some(format!("opening /dev/fuse: {}", std::io::Error::from(e)));
                    s.devices.clear();
                    break;
                }
            }
        }
        s
    }

    /// Mount each root at its path beneath `new_root` (the view being
    /// built) and send its descriptor to airlock.
    pub fn mount_all(&mut self, new_root: &Path) {
        let devices = std::mem::take(&mut self.devices);
        for (index, (m, dev)) in self.plan.mounts.iter().zip(devices).enumerate() {
            let dst = new_root.join(m.path.strip_prefix("/").unwrap_or(&m.path));
            if let Err(e) = self.mount_one(index, &dst, dev) {
                self.error.get_or_insert(format!("{}: {e:#}", m.path.display()));
                continue;
            }
            self.mounted.push(m.path.clone());
        }
        // airlock learns there are no more from the end of the socket.
        self.socket = None;
    }

    /// Make the mount points of the roots beneath `dir` (a path under
    /// `new_root`) before `dir` is made read-only.
    pub fn make_points_beneath(&self, new_root: &Path, dir: &Path) {
        for m in &self.plan.mounts {
            let dst = new_root.join(m.path.strip_prefix("/").unwrap_or(&m.path));
            if dst.starts_with(dir) && std::fs::symlink_metadata(&dst).is_err() {
                // A failure shows at the mount, which names it.
                let _ = std::fs::create_dir_all(&dst);
            }
        }
    }

    fn mount_one(&self, index: usize, dst: &Path, dev: OwnedFd) -> anyhow::Result<()> {
        let Some(socket) = &self.socket else { anyhow::bail!("no channel to airlock") };
        if std::fs::symlink_metadata(dst).is_err() {
            std::fs::create_dir_all(dst)?;
        }
        let data = format!(
            "fd={},rootmode=40000,user_id={},group_id={}",
            dev.as_raw_fd(),
            self.plan.uid,
            self.plan.gid
        );
        let dst_c = CString::new(dst.as_os_str().as_bytes())?;
        let data_c = CString::new(data)?;
        // SAFETY: every pointer is a NUL-terminated string we own.
        let r = unsafe {
            libc::mount(
                c"airlock".as_ptr(),
                dst_c.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data_c.as_ptr().cast(),
            )
        };
        if r != 0 {
            anyhow::bail!("mount: {}", std::io::Error::last_os_error());
        }
        if let Err(e) = send_fd(socket, index as u32, &dev) {
            // Nobody would serve it: take it away again.
            // SAFETY: a NUL-terminated path we own.
            unsafe { libc::umount2(dst_c.as_ptr(), libc::MNT_DETACH) };
            anyhow::bail!("handing the mount to airlock: {e}");
        }
        Ok(())
    }
}

/// Send `fd` with the mount's index.
fn send_fd(socket: &OwnedFd, index: u32, fd: &OwnedFd) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let fds = [fd.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("ancillary buffer too small"));
    }
    let bytes = index.to_le_bytes();
    let sent =
        rustix::net::sendmsg(socket, &[std::io::IoSlice::new(&bytes)], &mut ancillary, SendFlags::empty())?;
    if sent != bytes.len() {
        return Err(std::io::Error::other("short send"));
    }
    Ok(())
}

/// The socket the stage sends the mounts over: airlock's end, and the
/// stage's, placed above the descriptors a spawner places (as the status
/// pipe is) until [`install`] moves it where the plan says.
pub(super) fn channel() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    let theirs = rustix::io::fcntl_dupfd_cloexec(&theirs, 10)?;
    Ok((ours, theirs))
}

/// Place the stage's end at `target` (the plan's `socket_fd`) in the
/// forked child, open across the exec.
pub(super) fn install(cmd: &mut tokio::process::Command, theirs: &OwnedFd, target: i32) {
    let raw = theirs.as_raw_fd();
    // SAFETY: runs in the forked child before exec; dup2 and fcntl only,
    // nothing allocated. `theirs` stays open in airlock until the spawn
    // returns.
    unsafe {
        cmd.pre_exec(move || {
            if raw == target {
                let fd = std::os::fd::BorrowedFd::borrow_raw(raw);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            } else if libc::dup2(raw, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Whether the backing files of a served filesystem can be registered
/// (passthrough): the kernel asks the server for `CAP_SYS_ADMIN` in the
/// initial user namespace, which root has and an ordinary user does not.
pub fn can_passthrough() -> bool {
    rustix::thread::capabilities(None)
        .is_ok_and(|c| c.effective.contains(rustix::thread::CapabilitySet::SYS_ADMIN))
}

/// Ask `confinement` to serve the directory roots among `roots` as
/// filesystems in the payload's view; `Err` says why not (no namespaces,
/// no root the view can hold).
pub(super) fn serve(confinement: &mut Confinement, roots: &[Root]) -> Result<(), NotServed> {
    if confinement.namespaces == NsMode::Off {
        return Err(NotServed::NoMountNamespace);
    }
    let kinds: Vec<(Root, bool)> = roots.iter().map(|r| (r.clone(), r.path.is_dir())).collect();
    let mounts =
        airlock_core::sandbox::fuse::mounts(&kinds, &confinement.view, &confinement.ruleset.direct_read);
    if mounts.is_empty() {
        return Err(NotServed::Failed("no directory root can be mounted at its path".into()));
    }
    // A root not there yet (a file root created on its first write) has
    // nothing for a Landlock rule to hold: the mount's own rule decides
    // its path, and the proxy creates it.
    let grants =
        airlock_core::sandbox::fuse::grants(roots, &mounts).into_iter().filter(|r| r.path.exists()).collect();
    confinement.fuse = Some(FusePlan {
        mounts,
        grants,
        socket_fd: confinement.status_fd + 1,
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
    });
    Ok(())
}
