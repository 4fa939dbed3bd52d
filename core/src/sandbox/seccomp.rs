//! The seccomp policy: system calls no confined program needs, refused
//! with an error (never SIGSYS, so a program that probes for a feature
//! carries on without it). Calls are named here and numbered by the shell,
//! which refuses a name it cannot number.
//!
//! Always refused: keyrings, `ptrace`, `process_vm_*`, `pidfd_getfd`,
//! `kexec`, `bpf`, `perf_event_open`, `userfaultfd`, `io_uring`, every
//! mount call, namespace creation and entry, extended-attribute writes,
//! limits/priority/affinity/scheduling of any process but the caller,
//! socket families other than unix/IPv4/IPv6, raw and packet sockets,
//! MPTCP, the kernel log, the host's names, clocks, modules, swap, quotas,
//! accounting and reboot. `clone3` answers ENOSYS, so the C library falls
//! back to `clone`, whose flags a filter can read.
//!
//! Refused only where no namespace closes the class (the fallback): SysV
//! and POSIX message-queue IPC (host-wide without an IPC namespace), UDP
//! sockets unless the network is allowed (Landlock before ABI 10 cannot
//! stop them), and datagram socketpairs (whose `sendto` reaches a named
//! host socket before Landlock ABI 9).

use serde::Serialize;

/// The error a refused call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Errno {
    Perm,
    Acces,
    Nosys,
}

/// How an argument is compared (the argument is read as 64 bits unless
/// `dword`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Eq,
    Ne,
    /// `(arg & mask) == value`.
    MaskedEq(u64),
}

/// One comparison of argument `arg` (0-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Cond {
    pub arg: u8,
    pub dword: bool,
    pub op: Op,
    pub value: u64,
}

impl Cond {
    fn dword(arg: u8, op: Op, value: u64) -> Cond {
        Cond { arg, dword: true, op, value }
    }
    fn qword(arg: u8, op: Op, value: u64) -> Cond {
        Cond { arg, dword: false, op, value }
    }
}

/// A call refused with `errno` when any of `when` holds (each a list of
/// conditions that must all hold); always when `when` is empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SyscallRule {
    pub call: &'static str,
    pub when: Vec<Vec<Cond>>,
    pub errno: Errno,
}

/// What the policy depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeccompInputs {
    /// An IPC namespace is in force.
    pub ipc_ns: bool,
    /// A private network namespace is in force.
    pub net_ns: bool,
    /// A mount namespace with the minimal view is in force (no host unix
    /// socket is in it).
    pub mount_ns: bool,
    /// The network is allowed (`--sandbox-net`, a tool with network).
    pub net_allowed: bool,
    /// Landlock cannot refuse a connect to a named unix socket (before ABI
    /// 9): `socket(AF_UNIX)` is refused instead.
    pub deny_unix_socket_create: bool,
}

/// Calls refused outright.
pub const ALWAYS_DENIED: &[&str] = &[
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "removexattrat",
    "syslog",
    "sethostname",
    "setdomainname",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "quotactl",
    "quotactl_fd",
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
    "iopl",
    "ioperm",
    "uselib",
];

/// SysV and POSIX message-queue IPC: host-wide without an IPC namespace.
pub const HOST_IPC: &[&str] = &[
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
];

/// Namespace flags of `clone` and `unshare`.
pub const NAMESPACE_FLAGS: &[u64] = &[
    0x0002_0000, // CLONE_NEWNS
    0x0200_0000, // CLONE_NEWCGROUP
    0x0400_0000, // CLONE_NEWUTS
    0x0800_0000, // CLONE_NEWIPC
    0x1000_0000, // CLONE_NEWUSER
    0x2000_0000, // CLONE_NEWPID
    0x4000_0000, // CLONE_NEWNET
    0x0000_0080, // CLONE_NEWTIME
];

pub const AF_UNIX: u64 = 1;
pub const AF_INET: u64 = 2;
pub const AF_INET6: u64 = 10;
pub const SOCK_DGRAM: u64 = 2;
pub const SOCK_RAW: u64 = 3;
pub const SOCK_PACKET: u64 = 10;
/// The low bits of a socket type (the rest are SOCK_NONBLOCK, SOCK_CLOEXEC).
pub const SOCK_TYPE_MASK: u64 = 0xf;
pub const IPPROTO_MPTCP: u64 = 262;
pub const PRIO_PROCESS: u64 = 0;
pub const IOPRIO_WHO_PROCESS: u64 = 1;

/// The rules for `inputs`, in a fixed order.
pub fn seccomp_policy(inputs: &SeccompInputs) -> Vec<SyscallRule> {
    use Op::*;
    let always = |call| SyscallRule { call, when: Vec::new(), errno: Errno::Perm };
    let mut rules: Vec<SyscallRule> = ALWAYS_DENIED.iter().map(|c| always(c)).collect();
    rules.push(SyscallRule { call: "clone3", when: Vec::new(), errno: Errno::Nosys });
    let ns_flags: Vec<Vec<Cond>> =
        NAMESPACE_FLAGS.iter().map(|f| vec![Cond::qword(0, MaskedEq(*f), *f)]).collect();
    rules.push(SyscallRule { call: "clone", when: ns_flags.clone(), errno: Errno::Perm });
    rules.push(SyscallRule { call: "unshare", when: ns_flags, errno: Errno::Perm });
    // Another process: a pid other than 0 (the caller).
    let other_pid = |arg| vec![vec![Cond::dword(arg, Ne, 0)]];
    rules.push(SyscallRule { call: "prlimit64", when: other_pid(0), errno: Errno::Perm });
    for call in ["sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr"] {
        rules.push(SyscallRule { call, when: other_pid(0), errno: Errno::Perm });
    }
    // PRIO_PGRP and PRIO_USER with who 0 still reach other processes.
    rules.push(SyscallRule {
        call: "setpriority",
        when: vec![vec![Cond::dword(0, Ne, PRIO_PROCESS)], vec![Cond::dword(1, Ne, 0)]],
        errno: Errno::Perm,
    });
    rules.push(SyscallRule {
        call: "ioprio_set",
        when: vec![vec![Cond::dword(0, Ne, IOPRIO_WHO_PROCESS)], vec![Cond::dword(1, Ne, 0)]],
        errno: Errno::Perm,
    });
    let mut socket = vec![
        // Families outside the policy: netlink, packet, vsock, bluetooth…
        vec![Cond::dword(0, Ne, AF_UNIX), Cond::dword(0, Ne, AF_INET), Cond::dword(0, Ne, AF_INET6)],
        vec![Cond::dword(1, MaskedEq(SOCK_TYPE_MASK), SOCK_RAW)],
        vec![Cond::dword(1, MaskedEq(SOCK_TYPE_MASK), SOCK_PACKET)],
        vec![Cond::dword(2, Eq, IPPROTO_MPTCP)],
    ];
    if inputs.deny_unix_socket_create {
        socket.push(vec![Cond::dword(0, Eq, AF_UNIX)]);
    }
    if !inputs.net_ns && !inputs.net_allowed {
        socket.push(vec![Cond::dword(0, Eq, AF_INET), Cond::dword(1, MaskedEq(SOCK_TYPE_MASK), SOCK_DGRAM)]);
        socket.push(vec![Cond::dword(0, Eq, AF_INET6), Cond::dword(1, MaskedEq(SOCK_TYPE_MASK), SOCK_DGRAM)]);
    }
    // EACCES, as Landlock answers: the filter stands in for it.
    rules.push(SyscallRule { call: "socket", when: socket, errno: Errno::Acces });
    if !inputs.mount_ns && inputs.deny_unix_socket_create {
        rules.push(SyscallRule {
            call: "socketpair",
            when: vec![vec![Cond::dword(1, MaskedEq(SOCK_TYPE_MASK), SOCK_DGRAM)]],
            errno: Errno::Acces,
        });
    }
    if !inputs.ipc_ns {
        rules.extend(HOST_IPC.iter().map(|c| always(c)));
    }
    rules
}
