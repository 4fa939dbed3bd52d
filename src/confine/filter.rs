//! The core's seccomp policy compiled to BPF with seccompiler: one filter
//! per errno (the kernel runs every filter and the most severe answer
//! wins, so disjoint filters compose), and on x86_64 one more refusing
//! every x32 call (x32 shares the native architecture number, so
//! seccompiler's architecture check lets it through; foreign
//! architectures, the 32-bit entry point included, are killed by that
//! check).

use airlock_core::sandbox::{Cond, Errno, Op, SyscallRule};
use anyhow::Context;
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

/// The number of a call on this architecture; `None` for a call it does
/// not have (`iopl` on aarch64, say), which then needs no rule.
pub fn number(name: &str) -> Option<i64> {
    use libc::*;
    Some(match name {
        "keyctl" => SYS_keyctl,
        "add_key" => SYS_add_key,
        "request_key" => SYS_request_key,
        "ptrace" => SYS_ptrace,
        "process_vm_readv" => SYS_process_vm_readv,
        "process_vm_writev" => SYS_process_vm_writev,
        "pidfd_getfd" => SYS_pidfd_getfd,
        #[cfg(target_arch = "x86_64")]
        "kexec_load" => SYS_kexec_load,
        "kexec_file_load" => SYS_kexec_file_load,
        "bpf" => SYS_bpf,
        "perf_event_open" => SYS_perf_event_open,
        "userfaultfd" => SYS_userfaultfd,
        "io_uring_setup" => SYS_io_uring_setup,
        "io_uring_enter" => SYS_io_uring_enter,
        "io_uring_register" => SYS_io_uring_register,
        "mount" => SYS_mount,
        "umount2" => SYS_umount2,
        "pivot_root" => SYS_pivot_root,
        "move_mount" => SYS_move_mount,
        "open_tree" => SYS_open_tree,
        // Linux 6.13-6.15 calls, numbered alike on every architecture.
        "setxattrat" => 463,
        "removexattrat" => 466,
        "open_tree_attr" => 467,
        "fsopen" => SYS_fsopen,
        "fsmount" => SYS_fsmount,
        "fspick" => SYS_fspick,
        "mount_setattr" => SYS_mount_setattr,
        "setns" => SYS_setns,
        "unshare" => SYS_unshare,
        "clone" => SYS_clone,
        "clone3" => SYS_clone3,
        "setxattr" => SYS_setxattr,
        "lsetxattr" => SYS_lsetxattr,
        "fsetxattr" => SYS_fsetxattr,
        "removexattr" => SYS_removexattr,
        "lremovexattr" => SYS_lremovexattr,
        "fremovexattr" => SYS_fremovexattr,
        "syslog" => SYS_syslog,
        "sethostname" => SYS_sethostname,
        "setdomainname" => SYS_setdomainname,
        "acct" => SYS_acct,
        "swapon" => SYS_swapon,
        "swapoff" => SYS_swapoff,
        "reboot" => SYS_reboot,
        "init_module" => SYS_init_module,
        "finit_module" => SYS_finit_module,
        "delete_module" => SYS_delete_module,
        "settimeofday" => SYS_settimeofday,
        "clock_settime" => SYS_clock_settime,
        "clock_adjtime" => SYS_clock_adjtime,
        "adjtimex" => SYS_adjtimex,
        "quotactl" => SYS_quotactl,
        "quotactl_fd" => SYS_quotactl_fd,
        "name_to_handle_at" => SYS_name_to_handle_at,
        "open_by_handle_at" => SYS_open_by_handle_at,
        "fanotify_init" => SYS_fanotify_init,
        #[cfg(target_arch = "x86_64")]
        "iopl" => SYS_iopl,
        #[cfg(target_arch = "x86_64")]
        "ioperm" => SYS_ioperm,
        #[cfg(target_arch = "x86_64")]
        "uselib" => SYS_uselib,
        "prlimit64" => SYS_prlimit64,
        "sched_setaffinity" => SYS_sched_setaffinity,
        "sched_setscheduler" => SYS_sched_setscheduler,
        "sched_setparam" => SYS_sched_setparam,
        "sched_setattr" => SYS_sched_setattr,
        "setpriority" => SYS_setpriority,
        "ioprio_set" => SYS_ioprio_set,
        "socket" => SYS_socket,
        "socketpair" => SYS_socketpair,
        "shmget" => SYS_shmget,
        "shmat" => SYS_shmat,
        "shmctl" => SYS_shmctl,
        "shmdt" => SYS_shmdt,
        "msgget" => SYS_msgget,
        "msgsnd" => SYS_msgsnd,
        "msgrcv" => SYS_msgrcv,
        "msgctl" => SYS_msgctl,
        "semget" => SYS_semget,
        "semop" => SYS_semop,
        "semtimedop" => SYS_semtimedop,
        "semctl" => SYS_semctl,
        "mq_open" => SYS_mq_open,
        "mq_unlink" => SYS_mq_unlink,
        "mq_timedsend" => SYS_mq_timedsend,
        "mq_timedreceive" => SYS_mq_timedreceive,
        "mq_notify" => SYS_mq_notify,
        "mq_getsetattr" => SYS_mq_getsetattr,
        "ioctl" => SYS_ioctl,
        #[cfg(target_arch = "x86_64")]
        "chmod" => SYS_chmod,
        "fchmod" => SYS_fchmod,
        "fchmodat" => SYS_fchmodat,
        // Linux 6.6, numbered alike on every architecture.
        "fchmodat2" => 452,
        #[cfg(target_arch = "x86_64")]
        "mknod" => SYS_mknod,
        "mknodat" => SYS_mknodat,
        #[cfg(target_arch = "x86_64")]
        "creat" => SYS_creat,
        #[cfg(target_arch = "x86_64")]
        "open" => SYS_open,
        "openat" => SYS_openat,
        "openat2" => SYS_openat2,
        _ => return None,
    })
}

/// Calls this architecture lacks: no rule needed.
#[cfg(target_arch = "x86_64")]
const ABSENT: &[&str] = &[];
#[cfg(not(target_arch = "x86_64"))]
const ABSENT: &[&str] = &["kexec_load", "iopl", "ioperm", "uselib", "chmod", "mknod", "creat", "open"];

fn errno_value(e: Errno) -> u32 {
    (match e {
        Errno::Perm => libc::EPERM,
        Errno::Acces => libc::EACCES,
        Errno::Nosys => libc::ENOSYS,
    }) as u32
}

fn condition(c: &Cond) -> anyhow::Result<SeccompCondition> {
    let len = if c.dword { SeccompCmpArgLen::Dword } else { SeccompCmpArgLen::Qword };
    let op = match c.op {
        Op::Eq => SeccompCmpOp::Eq,
        Op::Ne => SeccompCmpOp::Ne,
        Op::MaskedEq(m) => SeccompCmpOp::MaskedEq(m),
    };
    Ok(SeccompCondition::new(c.arg, len, op, c.value)?)
}

/// The programs for `rules`, to install in order.
pub fn compile(rules: &[SyscallRule]) -> anyhow::Result<Vec<BpfProgram>> {
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| anyhow::anyhow!("seccomp on {}: {e}", std::env::consts::ARCH))?;
    let mut by_errno: BTreeMap<u32, BTreeMap<i64, Vec<SeccompRule>>> = BTreeMap::new();
    for rule in rules {
        let Some(nr) = number(rule.call) else {
            if ABSENT.contains(&rule.call) {
                continue;
            }
            anyhow::bail!("seccomp: no number for {}", rule.call);
        };
        let mut compiled = Vec::new();
        for all in &rule.when {
            let conds = all.iter().map(condition).collect::<anyhow::Result<Vec<_>>>()?;
            compiled.push(SeccompRule::new(conds)?);
        }
        let slot = by_errno.entry(errno_value(rule.errno)).or_default().entry(nr).or_default();
        if compiled.is_empty() || slot.is_empty() && rule.when.is_empty() {
            // Unconditional: an empty list matches every call.
            slot.clear();
        } else {
            slot.extend(compiled);
        }
    }
    let mut programs = Vec::new();
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_filter());
    for (errno, map) in by_errno {
        let filter = SeccompFilter::new(map, SeccompAction::Allow, SeccompAction::Errno(errno), arch)
            .context("building the seccomp filter")?;
        programs.push(filter.try_into().context("compiling the seccomp filter")?);
    }
    Ok(programs)
}

/// Refuse every x32 call (numbers with bit 30 set) with EPERM.
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_BIT: u32 = 0x4000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let i = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        i(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        i(JEQ_K, 0, 2, AUDIT_ARCH_X86_64),
        i(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        i(JGE_K, 1, 0, X32_BIT),
        i(RET_K, 0, 0, RET_ALLOW),
        i(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::sandbox::{seccomp_policy, SeccompInputs};

    #[test]
    fn every_call_the_policy_names_has_a_number_here() {
        for inputs in [
            SeccompInputs::default(),
            SeccompInputs { ipc_ns: true, net_ns: true, mount_ns: true, ..SeccompInputs::default() },
            SeccompInputs { deny_unix_socket_create: true, net_allowed: true, ..SeccompInputs::default() },
        ] {
            for rule in seccomp_policy(&inputs) {
                assert!(number(rule.call).is_some() || ABSENT.contains(&rule.call), "{}", rule.call);
            }
            assert!(compile(&seccomp_policy(&inputs)).is_ok());
        }
    }
}
