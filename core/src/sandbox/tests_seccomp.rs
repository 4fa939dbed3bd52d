//! The seccomp rules for what crosses the boundary on purpose: the
//! terminal, file modes, and the fallback's network. Each rule is checked
//! by evaluating the policy the way the kernel's filter does, on the raw
//! 64-bit arguments a hostile caller chooses.

use super::*;
use proptest::prelude::*;

/// Whether `rules` refuse `call` with `args`, as the compiled filter would:
/// a `dword` condition reads the low 32 bits only.
fn refused(rules: &[SyscallRule], call: &str, args: [u64; 6]) -> Option<Errno> {
    let rule = rules.iter().find(|r| r.call == call)?;
    let holds = |c: &Cond| {
        let a = if c.dword { args[c.arg as usize] & 0xffff_ffff } else { args[c.arg as usize] };
        match c.op {
            Op::Eq => a == c.value,
            Op::Ne => a != c.value,
            Op::MaskedEq(m) => a & m == c.value,
        }
    };
    (rule.when.is_empty() || rule.when.iter().any(|all| all.iter().all(holds))).then_some(rule.errno)
}

fn every_input() -> Vec<SeccompInputs> {
    let mut v = Vec::new();
    for bits in 0u8..32 {
        let b = |i: u8| bits & (1 << i) != 0;
        v.push(SeccompInputs {
            ipc_ns: b(0),
            net_ns: b(1),
            mount_ns: b(2),
            net_allowed: b(3),
            deny_unix_socket_create: b(4),
        });
    }
    v
}

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541c;
const TCGETS: u64 = 0x5401;
const TIOCGWINSZ: u64 = 0x5413;
const TIOCSPGRP: u64 = 0x5410;
const KDSKBSENT: u64 = 0x4b49;
const VT_ACTIVATE: u64 = 0x5606;
const FIONREAD: u64 = 0x541b;

#[test]
fn the_terminal_refuses_pushed_input_and_console_keys_whatever_was_applied() {
    for inputs in every_input() {
        let rules = seccomp_policy(&inputs);
        for req in [TIOCSTI, TIOCLINUX, KDSKBSENT, VT_ACTIVATE] {
            for fd in [0, 1, 2, 7] {
                assert_eq!(refused(&rules, "ioctl", [fd, req, 0, 0, 0, 0]), Some(Errno::Perm), "{req:#x}");
            }
        }
        // What a program at a terminal needs stays: its modes, its size,
        // job control, how much input waits.
        for req in [TCGETS, TIOCGWINSZ, TIOCSPGRP, FIONREAD] {
            assert_eq!(refused(&rules, "ioctl", [0, req, 0, 0, 0, 0]), None, "{req:#x}");
        }
    }
}

proptest! {
    /// The kernel's tty code reads the request as 32 bits: whatever the
    /// high half holds, TIOCSTI is TIOCSTI, and the filter says so.
    #[test]
    fn high_bits_do_not_hide_a_terminal_request(high in any::<u32>(), fd in any::<u64>()) {
        let rules = seccomp_policy(&SeccompInputs::default());
        for req in [TIOCSTI, TIOCLINUX, KDSKBSENT] {
            let spelled = (u64::from(high) << 32) | req;
            prop_assert_eq!(refused(&rules, "ioctl", [fd, spelled, 0, 0, 0, 0]), Some(Errno::Perm));
        }
    }

    /// No call that takes a mode sets the setuid or setgid bit, however
    /// the other bits and the high half are spelled; a mode without them
    /// passes.
    #[test]
    fn no_mode_with_setuid_or_setgid_passes(mode in any::<u64>(), flags in any::<u64>()) {
        let rules = seccomp_policy(&SeccompInputs::default());
        let setid = mode & 0o6000 != 0;
        let creates = flags & O_CREAT == O_CREAT || flags & O_TMPFILE == O_TMPFILE;
        let path = 0x1000;
        for (call, args) in [
            ("chmod", [path, mode, 0, 0, 0, 0]),
            ("fchmod", [3, mode, 0, 0, 0, 0]),
            ("fchmodat", [3, path, mode, 0, 0, 0]),
            ("fchmodat2", [3, path, mode, 0, 0, 0]),
            ("mknod", [path, mode, 0, 0, 0, 0]),
            ("mknodat", [3, path, mode, 0, 0, 0]),
            ("creat", [path, mode, 0, 0, 0, 0]),
        ] {
            prop_assert_eq!(refused(&rules, call, args).is_some(), setid, "{} {:o}", call, mode);
        }
        for (call, args) in [("open", [path, flags, mode, 0, 0, 0]), ("openat", [3, path, flags, mode, 0, 0])] {
            prop_assert_eq!(refused(&rules, call, args).is_some(), setid && creates, "{} {:o} {:o}", call, flags, mode);
        }
        // openat2's mode is in a structure: the call is answered ENOSYS
        // and the C library uses openat.
        prop_assert_eq!(refused(&rules, "openat2", [3, path, 0x2000, 24, 0, 0]), Some(Errno::Nosys));
    }

    /// Without a network namespace and without the network granted, no
    /// IPv4 or IPv6 socket of any type or protocol is created; with
    /// either, TCP and UDP are (the rest of the socket rules stand).
    #[test]
    fn the_fallback_creates_no_internet_socket(ty in any::<u64>(), proto in 0u64..300, six in any::<bool>()) {
        let family = if six { AF_INET6 } else { AF_INET };
        for inputs in every_input() {
            let rules = seccomp_policy(&inputs);
            let got = refused(&rules, "socket", [family, ty, proto, 0, 0, 0]);
            if !inputs.net_ns && !inputs.net_allowed {
                prop_assert_eq!(got, Some(Errno::Acces));
            }
            let plain = refused(&rules, "socket", [family, 1, 0, 0, 0, 0]);
            prop_assert_eq!(plain.is_none(), inputs.net_ns || inputs.net_allowed);
        }
    }
}
