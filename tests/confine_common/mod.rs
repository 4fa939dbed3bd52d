//! What the confinement attack suites share (`confinement_attacks.rs`,
//! `confinement_unprivileged.rs`): the two modes every attack runs in, the
//! report's gaps, and the host-side helpers that watch for processes that
//! should be gone.

#![allow(dead_code)]

use crate::common::Run;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set on the airlock process: start without namespaces, as on a kernel
/// or container that refuses them.
pub const NO_NAMESPACES: &str = "AIRLOCK_NO_NAMESPACES";

pub const NAMESPACES: [&str; 6] = ["user", "pid", "ipc", "net", "uts", "mount"];

/// How long a process that should be gone may take to disappear.
pub const GONE_WITHIN: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Namespaces,
    Fallback,
}

pub const MODES: [Mode; 2] = [Mode::Namespaces, Mode::Fallback];

pub fn unique() -> u64 {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed) as u64
}

pub fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

pub fn not_enforced(run: &Run) -> Vec<String> {
    run.report["sandbox"]["not_enforced"]
        .as_array()
        .unwrap_or_else(|| panic!("report has no sandbox.not_enforced: {}", run.report))
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// Runs `f` in a loop on a thread until dropped.
pub struct Background {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub fn start(mut f: impl FnMut() + Send + 'static) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                f();
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Background { stop, thread: Some(thread) }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Live (not zombie) processes whose name is `comm`.
pub fn processes_named(comm: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let name = head.split_once('(').map(|(_, n)| n).unwrap_or_default();
        if name == comm && !rest.trim_start().starts_with('Z') {
            found.push(pid);
        }
    }
    found
}

/// Whether a process named `comm` is still alive after `GONE_WITHIN`; any
/// found is killed, so a failing run leaves nothing behind.
pub fn outlives(comm: &str) -> bool {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let left = processes_named(comm);
        if left.is_empty() {
            return false;
        }
        if Instant::now() > deadline {
            for pid in left {
                // SAFETY: kill(2) takes integers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is as long as the size passed.
    let n = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "listxattr: {}", errno());
    names.truncate(n as usize);
    names
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let cn = std::ffi::CString::new(name).unwrap();
            let mut v = vec![0u8; 65536];
            // SAFETY: as above.
            let m = unsafe { libc::getxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            assert!(m >= 0, "getxattr: {}", errno());
            v.truncate(m as usize);
            (String::from_utf8_lossy(name).into_owned(), v)
        })
        .collect()
}
