//! Swarm testing: each seed switches every fault kind on or off and picks
//! its rate, so rare combinations of faults get their turn.

use crate::Scenario;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Rates are in parts per million of their opportunity (a delivery, a
/// request, a step, an open): integers keep swarm descriptions exact.
pub const PPM: u32 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// A delivery cuts the pending bytes at an arbitrary byte.
    SplitDelivery,
    /// A delivery hands over everything pending, several frames at once.
    CoalescedDelivery,
    /// A request frame is replaced by a mangled copy that is not JSON.
    CorruptFrame,
    /// A request frame carries bytes that are not UTF-8.
    NonUtf8Frame,
    /// A length prefix above the machine's maximum (ends the session).
    OversizedFrame,
    /// A client closes its pipe at a random step, possibly mid-frame.
    Eof,
    /// A client process dies at a random step.
    ProcessDeath,
    /// The intermediate proxy dies (nested worlds only).
    MiddleDeath,
    /// Simulated time jumps forward.
    ClockJump,
    /// File effects complete out of order across files.
    EffectReorder,
    /// Host opens that do not truncate fail with an I/O error.
    FsError,
    /// A provider call hangs until cancelled (broker worlds only).
    ProviderHang,
    /// A provider call fails, with or without partial usage.
    ProviderError,
    /// A provider reply that cannot be read (reported as an error).
    ProviderMalformed,
    /// A client fires a burst of CANCELs, for live and unknown tokens.
    CancelStorm,
    /// A client passes a descriptor and asks to `attach` it, forking off a
    /// new client with its own connection; or asks without one (E_ARG).
    /// Drawn after every other knob, and not in broker worlds.
    Attach,
    /// A client floods the broker with `LLMCMD`s, some of them big.
    QueueFlood,
    /// The provider's reply carries the API key, in any shape JSON allows.
    ProviderLeak,
    /// The provider's reply is thousands of small JSON values.
    ProviderHuge,
    /// A client queues a burst of big frames behind a request that waits
    /// (queued bytes per client and per session).
    QueuedFlood,
    /// A client creates virtual files with huge names.
    HugeNames,
    /// A client sends responses back as frames, as a socketpair looped
    /// onto itself would.
    SelfLoop,
    /// A client passes a burst of descriptors and attaches them all.
    AttachFlood,
    /// The top sends the intermediate a frame above its upstream limit
    /// (nested worlds only).
    UpstreamOversize,
    /// A client sends most of a big frame and never the rest.
    PartialFlood,
    /// An attacker outside airlock creates or swaps a symlink inside the
    /// roots between two steps (adversary worlds only; drawn last).
    SymlinkSwap,
    /// The provider answers an attempt `429` or `5xx`, with a
    /// `Retry-After` that may be absent, zero, huge, a date, or garbage
    /// (broker worlds only).
    ProviderRetryable,
    /// A name's later lookups answer a private address where its first
    /// answered a public one (egress worlds only).
    DnsRebind,
    /// A destination refuses the connection or never answers it (egress
    /// worlds only).
    ConnectFail,
    /// A client stops reading its tunnel, or its server never answers, or
    /// its head comes a byte at a time (egress worlds only).
    SlowTunnel,
}

/// The egress world's own faults, drawn for it alone and last.
pub const EGRESS_FAULTS: [FaultKind; 3] =
    [FaultKind::DnsRebind, FaultKind::ConnectFail, FaultKind::SlowTunnel];

/// [`Swarm::rate`] for every kind, indexed by the kind: a world asks for
/// several rates each step, and the map's lookups showed in its profile.
#[derive(Clone, Debug, Default)]
pub struct Rates(Vec<u32>);

impl Rates {
    pub fn get(&self, kind: FaultKind) -> u32 {
        self.0.get(kind as usize).copied().unwrap_or(0)
    }
}

/// The adversary's floods (`world::floods`), drawn after `Attach` so the
/// swarms of seeds that draw none of them are what they were before.
pub const FLOODS: [FaultKind; 4] =
    [FaultKind::QueuedFlood, FaultKind::HugeNames, FaultKind::SelfLoop, FaultKind::AttachFlood];

impl FaultKind {
    pub const ALL: [FaultKind; 19] = [
        FaultKind::SplitDelivery,
        FaultKind::CoalescedDelivery,
        FaultKind::CorruptFrame,
        FaultKind::NonUtf8Frame,
        FaultKind::OversizedFrame,
        FaultKind::Eof,
        FaultKind::ProcessDeath,
        FaultKind::MiddleDeath,
        FaultKind::ClockJump,
        FaultKind::EffectReorder,
        FaultKind::FsError,
        FaultKind::ProviderHang,
        FaultKind::ProviderError,
        FaultKind::ProviderMalformed,
        FaultKind::CancelStorm,
        FaultKind::QueueFlood,
        FaultKind::ProviderLeak,
        FaultKind::ProviderHuge,
        FaultKind::ProviderRetryable,
    ];

    /// Faults of the simulated LLM provider and its clients.
    pub const fn broker_only(self) -> bool {
        matches!(
            self,
            FaultKind::ProviderHang
                | FaultKind::ProviderError
                | FaultKind::ProviderMalformed
                | FaultKind::CancelStorm
                | FaultKind::QueueFlood
                | FaultKind::ProviderLeak
                | FaultKind::ProviderHuge
                | FaultKind::ProviderRetryable
        )
    }

    pub const fn name(self) -> &'static str {
        match self {
            FaultKind::SplitDelivery => "split_delivery",
            FaultKind::CoalescedDelivery => "coalesced_delivery",
            FaultKind::CorruptFrame => "corrupt_frame",
            FaultKind::NonUtf8Frame => "non_utf8_frame",
            FaultKind::OversizedFrame => "oversized_frame",
            FaultKind::Eof => "eof",
            FaultKind::ProcessDeath => "process_death",
            FaultKind::MiddleDeath => "middle_death",
            FaultKind::ClockJump => "clock_jump",
            FaultKind::EffectReorder => "effect_reorder",
            FaultKind::FsError => "fs_error",
            FaultKind::ProviderHang => "provider_hang",
            FaultKind::ProviderError => "provider_error",
            FaultKind::ProviderMalformed => "provider_malformed",
            FaultKind::CancelStorm => "cancel_storm",
            FaultKind::Attach => "attach",
            FaultKind::QueueFlood => "queue_flood",
            FaultKind::ProviderLeak => "provider_leak",
            FaultKind::ProviderHuge => "provider_huge",
            FaultKind::QueuedFlood => "queued_flood",
            FaultKind::HugeNames => "huge_names",
            FaultKind::SelfLoop => "self_loop",
            FaultKind::AttachFlood => "attach_flood",
            FaultKind::UpstreamOversize => "upstream_oversize",
            FaultKind::PartialFlood => "partial_flood",
            FaultKind::SymlinkSwap => "symlink_swap",
            FaultKind::ProviderRetryable => "provider_retryable",
            FaultKind::DnsRebind => "dns_rebind",
            FaultKind::ConnectFail => "connect_fail",
            FaultKind::SlowTunnel => "slow_tunnel",
        }
    }

    /// The rates a seed may pick from, in ppm of the fault's opportunity.
    fn rates(self) -> &'static [u32] {
        match self {
            FaultKind::SplitDelivery | FaultKind::CoalescedDelivery => &[50_000, 300_000, 800_000],
            FaultKind::CorruptFrame | FaultKind::NonUtf8Frame => &[2_000, 10_000, 40_000],
            FaultKind::OversizedFrame => &[300, 2_000],
            FaultKind::Eof | FaultKind::ProcessDeath => &[50, 200, 800],
            FaultKind::MiddleDeath => &[20, 100],
            FaultKind::ClockJump => &[1_000, 20_000],
            FaultKind::EffectReorder => &[300_000, 1_000_000],
            FaultKind::FsError => &[10_000, 100_000],
            FaultKind::ProviderHang => &[20_000, 100_000],
            FaultKind::ProviderError => &[50_000, 200_000],
            FaultKind::ProviderMalformed => &[20_000, 100_000],
            FaultKind::CancelStorm => &[500, 5_000],
            FaultKind::Attach => &[2_000, 10_000, 30_000],
            FaultKind::QueueFlood => &[1_000, 5_000],
            FaultKind::ProviderLeak => &[100_000, 400_000],
            FaultKind::ProviderHuge => &[20_000, 100_000],
            FaultKind::QueuedFlood | FaultKind::HugeNames | FaultKind::AttachFlood => &[2_000, 10_000],
            FaultKind::SelfLoop => &[5_000, 30_000],
            FaultKind::UpstreamOversize => &[1_000, 5_000],
            FaultKind::PartialFlood => &[2_000, 10_000],
            FaultKind::SymlinkSwap => &[20_000, 100_000, 400_000],
            // High enough for chains of failed attempts to reach
            // max_retries.
            FaultKind::ProviderRetryable => &[100_000, 300_000, 600_000],
            FaultKind::DnsRebind => &[300_000, 1_000_000],
            FaultKind::ConnectFail => &[20_000, 100_000],
            FaultKind::SlowTunnel => &[20_000, 100_000, 300_000],
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything a world is built from besides its seed. Every field is a
/// knob the shrinker may turn down while keeping the seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swarm {
    /// Clients of the level clients talk to (the intermediate when nested).
    pub clients: usize,
    /// Clients talking to the top level directly (nested only).
    pub top_clients: usize,
    /// Requests each client issues before it exits.
    pub ops_per_client: usize,
    /// Requests a client keeps outstanding at most.
    pub pipeline: usize,
    /// Invalid requests (bad handles, bad params, escapes), in ppm.
    pub invalid_ppm: u32,
    pub max_frame: usize,
    pub max_queued_requests: usize,
    pub max_open_handles: usize,
    /// Steps before the world winds down (stops issuing and faulting).
    pub max_steps: usize,
    /// Faults switched on, with their rates in ppm.
    pub faults: BTreeMap<FaultKind, u32>,
    /// The resource bounds the machines run with (small ones when floods
    /// are on, so the floods reach them).
    #[serde(default)]
    pub bounds: Bounds,
}

/// Limits of `fsproxy::Config` that the adversary's floods press on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub max_queued_bytes: u64,
    pub max_session_queued_bytes: u64,
    pub max_clients: usize,
    pub max_buffered_bytes: u64,
    pub max_virtual_bytes: u64,
    pub max_virtual_files: usize,
    #[serde(default = "default_max_upstream_frame")]
    pub max_upstream_frame: usize,
    #[serde(default = "default_max_descriptors")]
    pub max_descriptors: usize,
}

fn default_max_descriptors() -> usize {
    airlock_core::fsproxy::DEFAULT_MAX_DESCRIPTORS
}

fn default_max_upstream_frame() -> usize {
    airlock_core::fsproxy::DEFAULT_MAX_UPSTREAM_FRAME
}

impl Default for Bounds {
    fn default() -> Self {
        use airlock_core::fsproxy as f;
        Bounds {
            max_queued_bytes: f::DEFAULT_MAX_QUEUED_BYTES,
            max_session_queued_bytes: f::DEFAULT_MAX_SESSION_QUEUED_BYTES,
            max_clients: f::DEFAULT_MAX_CLIENTS,
            max_buffered_bytes: f::DEFAULT_MAX_BUFFERED_BYTES,
            max_virtual_bytes: f::DEFAULT_MAX_VIRTUAL_BYTES,
            max_virtual_files: f::DEFAULT_MAX_VIRTUAL_FILES,
            max_upstream_frame: f::DEFAULT_MAX_UPSTREAM_FRAME,
            max_descriptors: f::DEFAULT_MAX_DESCRIPTORS,
        }
    }
}

impl Bounds {
    /// Small enough for a flood of a few dozen frames to reach.
    pub const SMALL: Bounds = Bounds {
        max_queued_bytes: 24 << 10,
        max_session_queued_bytes: 40 << 10,
        max_clients: 4,
        max_buffered_bytes: 48 << 10,
        max_virtual_bytes: 48 << 10,
        max_virtual_files: 24,
        max_upstream_frame: airlock_core::fsproxy::DEFAULT_MAX_UPSTREAM_FRAME,
        // With the default reserve of 64 kept from connections.
        max_descriptors: 64 + 12,
    };

    /// An upstream limit above any answer a nested world's top sends (a
    /// read's 4096 bytes in base64), so only the injected frames cross it.
    pub const SMALL_UPSTREAM_FRAME: usize = 16 << 10;
    /// Partial-frame bytes a few partial floods cross.
    pub const SMALL_BUFFERED: u64 = 48 << 10;
}

impl Swarm {
    /// The swarm a seed picks for a scenario.
    pub fn from_seed(seed: u64, scenario: Scenario) -> Self {
        // Its own stream, so the swarm does not shift the world's draws.
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5157_4152_4d00_0000);
        let nested = matches!(scenario, Scenario::Nested | Scenario::Adversary | Scenario::Pager);
        let broker = scenario == Scenario::Broker;
        let mut faults = BTreeMap::new();
        for kind in FaultKind::ALL {
            // Skipped before drawing, so adding kinds for one scenario
            // leaves every other scenario's swarms as they were.
            if kind == FaultKind::MiddleDeath && !nested || kind.broker_only() && !broker {
                continue;
            }
            if rng.gen_bool(0.5) {
                let rates = kind.rates();
                faults.insert(kind, rates[rng.gen_range(0..rates.len())]);
            }
        }
        let small =
            |rng: &mut ChaCha8Rng, big: usize, small: usize| if rng.gen_bool(0.15) { small } else { big };
        let mut swarm = Swarm {
            clients: rng.gen_range(if nested { 1..=4 } else { 2..=5 }),
            top_clients: if nested { rng.gen_range(0..=2) } else { 0 },
            ops_per_client: rng.gen_range(if nested {
                60..=200
            } else if broker {
                40..=120
            } else {
                100..=300
            }),
            pipeline: [1, 2, 4, 8][rng.gen_range(0..4)],
            invalid_ppm: [20_000, 100_000, 250_000][rng.gen_range(0..3)],
            max_frame: small(&mut rng, airlock_core::codec::frame::DEFAULT_MAX_FRAME, 8192),
            max_queued_requests: small(&mut rng, airlock_core::fsproxy::DEFAULT_MAX_QUEUED_REQUESTS, 3),
            max_open_handles: small(&mut rng, airlock_core::fsproxy::DEFAULT_MAX_OPEN_HANDLES, 6),
            max_steps: 200_000,
            faults,
            bounds: Bounds::default(),
        };
        // Drawn last (and not in `ALL`), so every knob above is what it was
        // before attach was modelled, and so are the worlds of seeds that
        // leave it off.
        if !broker && rng.gen_bool(0.5) {
            let rates = FaultKind::Attach.rates();
            swarm.faults.insert(FaultKind::Attach, rates[rng.gen_range(0..rates.len())]);
        }
        // The floods, last of all: a quarter of the seeds of every scenario
        // but the broker's get some, most of them with small bounds.
        if !broker && rng.gen_bool(0.25) {
            for kind in FLOODS {
                if rng.gen_bool(0.5) {
                    let rates = kind.rates();
                    swarm.faults.insert(kind, rates[rng.gen_range(0..rates.len())]);
                }
            }
            if rng.gen_bool(0.7) {
                swarm.bounds = Bounds::SMALL;
            }
        }
        if nested && rng.gen_bool(0.3) {
            let rates = FaultKind::UpstreamOversize.rates();
            swarm.faults.insert(FaultKind::UpstreamOversize, rates[rng.gen_range(0..rates.len())]);
            swarm.bounds.max_upstream_frame = Bounds::SMALL_UPSTREAM_FRAME;
        }
        if !broker && rng.gen_bool(0.15) {
            let rates = FaultKind::PartialFlood.rates();
            swarm.faults.insert(FaultKind::PartialFlood, rates[rng.gen_range(0..rates.len())]);
            swarm.bounds.max_buffered_bytes = Bounds::SMALL_BUFFERED;
        }
        // Adversary worlds: every top-level effect is the intermediate's, so
        // the checker knows whose policies it must lie in; and symlinks
        // are always swapped.
        if scenario == Scenario::Adversary {
            swarm.top_clients = 0;
            let rates = FaultKind::SymlinkSwap.rates();
            swarm.faults.insert(FaultKind::SymlinkSwap, rates[rng.gen_range(0..rates.len())]);
        }
        // Egress worlds: their own faults, each on for half the seeds.
        if scenario == Scenario::Egress {
            for kind in EGRESS_FAULTS {
                if rng.gen_bool(0.5) {
                    let rates = kind.rates();
                    swarm.faults.insert(kind, rates[rng.gen_range(0..rates.len())]);
                }
            }
        }
        // Tool and fuse worlds: the attacker swaps the project's links.
        if scenario == Scenario::Tool || scenario == Scenario::Fuse {
            let rates = FaultKind::SymlinkSwap.rates();
            swarm.faults.insert(FaultKind::SymlinkSwap, rates[rng.gen_range(0..rates.len())]);
        }
        swarm
    }

    pub fn rate(&self, kind: FaultKind) -> u32 {
        self.faults.get(&kind).copied().unwrap_or(0)
    }

    /// The rates as a table, for a world that draws them every step.
    pub fn rates(&self) -> Rates {
        let mut table = Vec::new();
        for (&kind, &rate) in &self.faults {
            let i = kind as usize;
            if table.len() <= i {
                table.resize(i + 1, 0);
            }
            table[i] = rate;
        }
        Rates(table)
    }

    /// One line a human can read.
    pub fn describe(&self) -> String {
        let faults: Vec<String> = self.faults.iter().map(|(k, r)| format!("{k}={r}")).collect();
        format!(
            "clients={} top_clients={} ops={} pipeline={} invalid={}ppm max_frame={} max_queued={} \
             max_open={} max_steps={} faults[{}]{}",
            self.clients,
            self.top_clients,
            self.ops_per_client,
            self.pipeline,
            self.invalid_ppm,
            self.max_frame,
            self.max_queued_requests,
            self.max_open_handles,
            self.max_steps,
            faults.join(" "),
            if self.bounds == Bounds::default() { "" } else { " small_bounds" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind a swarm can hold: `ALL`, and the ones drawn after it.
    fn every() -> Vec<FaultKind> {
        let later =
            [FaultKind::Attach, FaultKind::UpstreamOversize, FaultKind::PartialFlood, FaultKind::SymlinkSwap];
        FaultKind::ALL.into_iter().chain(FLOODS).chain(later).chain(EGRESS_FAULTS).collect()
    }

    #[test]
    fn the_rate_table_is_the_map() {
        let scenarios = [
            Scenario::Default,
            Scenario::Nested,
            Scenario::Adversary,
            Scenario::Pager,
            Scenario::Broker,
            Scenario::Egress,
        ];
        let mut nonzero = 0;
        for scenario in scenarios {
            for seed in 0..200 {
                let swarm = Swarm::from_seed(seed, scenario);
                let table = swarm.rates();
                for kind in every() {
                    assert_eq!(table.get(kind), swarm.rate(kind), "{kind:?}, seed {seed}, {scenario}");
                    nonzero += usize::from(table.get(kind) > 0);
                }
            }
        }
        assert!(nonzero > 1000, "the swarms drew too few faults to compare: {nonzero}");
    }
}
