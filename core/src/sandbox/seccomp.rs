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
//! The terminal a process inherits is the user's: `ioctl` requests that
//! push input into it (`TIOCSTI`, `TIOCLINUX`) or redefine what the
//! console's keys type (the `KD*` and `VT_*` ranges) are refused, the
//! request compared as the 32 bits the kernel's tty code reads, so a
//! request with high bits set is the same request here (flatpak's
//! CVE-2019-10063). Setting the setuid or setgid bit is refused wherever a
//! call takes a mode: `chmod` and its family, creating a file (`open`,
//! `openat`, `creat` with `O_CREAT` or `O_TMPFILE`, `mknod`); `openat2`,
//! whose mode lies in a structure a filter cannot read, answers ENOSYS so
//! the C library uses `openat`.
//!
//! Refused only where no namespace closes the class (the fallback): SysV
//! and POSIX message-queue IPC (host-wide without an IPC namespace),
//! every IPv4 and IPv6 socket unless the network is allowed (Landlock
//! cannot stop UDP before ABI 10, nor a TCP Fast Open `sendto` or a
//! `listen` that binds on its own, at any ABI), and datagram socketpairs
//! (whose `sendto` reaches a named host socket before Landlock ABI 9).

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
/// `ioctl` requests that push bytes into a terminal's input: `TIOCSTI`
/// (a character, as if typed) and `TIOCLINUX` (a console's selection
/// pasted, among others).
pub const TTY_INJECT: &[u64] = &[0x5412, 0x541c];
/// The console's keyboard (`KD*`, 0x4Bxx: what a key or a function key
/// types) and virtual-terminal (`VT_*`, 0x56xx) requests, matched on the
/// bits above the low byte: a process whose controlling terminal is the
/// console may redefine a key to type a command the user then presses.
pub const CONSOLE_RANGES: &[u64] = &[0x4b00, 0x5600];
/// The mask that leaves a request's range.
pub const REQUEST_RANGE_MASK: u64 = 0xffff_ff00;
/// The setuid and setgid bits of a mode.
pub const S_ISUID: u64 = 0o4000;
pub const S_ISGID: u64 = 0o2000;
/// `open` flags that create a file with the given mode.
pub const O_CREAT: u64 = 0o100;
pub const O_TMPFILE: u64 = 0o20_200_000;
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
        // No internet socket at all: Landlock refuses `bind` and `connect`,
        // but not a `sendto` with MSG_FASTOPEN (a TCP connect with data)
        // nor a `listen` that binds 0.0.0.0 by itself.
        socket.push(vec![Cond::dword(0, Eq, AF_INET)]);
        socket.push(vec![Cond::dword(0, Eq, AF_INET6)]);
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
    rules.extend(terminal_rules());
    rules.extend(setid_rules());
    rules
}

/// The terminal: no input pushed into it, no console key redefined.
fn terminal_rules() -> Vec<SyscallRule> {
    let mut when: Vec<Vec<Cond>> = TTY_INJECT.iter().map(|r| vec![Cond::dword(1, Op::Eq, *r)]).collect();
    when.extend(CONSOLE_RANGES.iter().map(|r| vec![Cond::dword(1, Op::MaskedEq(REQUEST_RANGE_MASK), *r)]));
    vec![SyscallRule { call: "ioctl", when, errno: Errno::Perm }]
}

/// No setuid or setgid bit set on any file: `(call, index of its mode,
/// index of its open flags)` for every call that takes a mode.
pub const MODE_CALLS: &[(&str, u8, Option<u8>)] = &[
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("creat", 1, None),
    ("open", 2, Some(1)),
    ("openat", 3, Some(2)),
];

fn setid_rules() -> Vec<SyscallRule> {
    let mut rules = Vec::new();
    for (call, mode, flags) in MODE_CALLS {
        let mut when = Vec::new();
        for bit in [S_ISUID, S_ISGID] {
            let set = Cond::dword(*mode, Op::MaskedEq(bit), bit);
            match flags {
                // The mode counts only when the call creates a file.
                Some(f) => {
                    when.push(vec![Cond::dword(*f, Op::MaskedEq(O_CREAT), O_CREAT), set]);
                    when.push(vec![Cond::dword(*f, Op::MaskedEq(O_TMPFILE), O_TMPFILE), set]);
                }
                None => when.push(vec![set]),
            }
        }
        rules.push(SyscallRule { call, when, errno: Errno::Perm });
    }
    rules.push(SyscallRule { call: "openat2", when: Vec::new(), errno: Errno::Nosys });
    rules
}
