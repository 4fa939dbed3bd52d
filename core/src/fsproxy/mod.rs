//! The FS proxy machine (seed 000): serves the file operations of connected
//! clients, sans-I/O.
//!
//! Bytes from each client go in (`Input::Bytes`); framed responses, file
//! effects for the shell to perform, and frames for an upstream proxy come
//! out (`poll_output`). Each client's requests are served one at a time in
//! arrival order, so a client may pipeline freely and still see its writes
//! and reads applied in the order it sent them; different clients proceed
//! independently. The broker's ops are the exception: an `LLMCMD` may
//! wait for the session's provider lock for up to `queue.max_wait_seconds`,
//! so it is handed to the broker (or forwarded upstream) and the client's
//! next requests are served meanwhile; its answer comes whenever the broker
//! gives it, possibly after answers to later requests (still exactly one
//! response per id). `QUOTA` and `CANCEL` are answered in order.
//!
//! The machine plays the seed's three roles:
//! - the upstream server ("vfsd"): [`StdioRole::Reject`], no upstream;
//! - the top-level parent-side mux: [`StdioRole::Local`], no upstream;
//! - the intermediate proxy: [`StdioRole::Local`] with `upstream: true`,
//!   forwarding every non-stdio operation, after applying its own policy,
//!   and closing upstream whatever a departed client still held.
//!
//! With a broker configured (`Config::broker`, never on a level that
//! forwards upstream) the machine also runs the session's LLM broker:
//! `StartProvider`/`CancelProvider`/`Telemetry` come out, `ProviderDone`
//! and `Tick` go in, and `poll_timeout` is the broker's.

pub mod audit;
pub mod bounds;
mod fd;
mod fuse;
mod paths;
mod read_batch;
pub mod scope_secrets;
mod virtual_fs;
pub mod wire;

pub use bounds::{
    Usage, DEFAULT_DESCRIPTOR_RESERVE, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_DESCRIPTORS, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_SESSION_QUEUED_BYTES,
    DEFAULT_MAX_UPSTREAM_FRAME,
};
pub use read_batch::{DEFAULT_MAX_READ_BATCH, MAX_BATCHED_FRAME};
pub use scope_secrets::{Secret, MAX_SCOPE_SECRETS, SECRET_LEN};
pub use virtual_fs::{VirtualFs, DEFAULT_MAX_VIRTUAL_BYTES, DEFAULT_MAX_VIRTUAL_FILES};

use crate::b64;
use crate::broker::{
    self, Broker, BrokerInput, BrokerOutput, BrokerSetup, CallId, ProviderRequest, ProviderResult,
    TelemetryRecord,
};
use crate::codec::frame::{self, FrameDecoder, FrameError, DEFAULT_MAX_FRAME};
use crate::handles::{ClientId, Handle, HandleTable, Missing};
use crate::pager::{JobId, Pager, PagerConfig};
use crate::pathops::{FileStat, Page, PathDone, PathOp};
use crate::policy::{Denied, Policy, Resolved, RootId};
use crate::scope::Scope;
use crate::time::Instant;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use wire::{ErrorCode, Failure, Limits, Mode, Op, OpKind, Rejection, Request, Response, Success};

/// Open handles the whole machine may hold by default.
pub const DEFAULT_MAX_OPEN_HANDLES: usize = 1024;
/// Requests one client may have waiting behind the one being served.
pub const DEFAULT_MAX_QUEUED_REQUESTS: usize = 256;
/// Clients attached through `attach` get ids from here up; ids given with
/// `Input::Connected` must stay below it.
pub const ATTACHED_CLIENT_BASE: u64 = 1 << 32;

/// How handles 0, 1 and 2 are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdioRole {
    /// The parent-side mux: served from the process's own stdio.
    Local,
    /// The upstream server: refused with E_PERM.
    Reject,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub policy: Policy,
    pub stdio: StdioRole,
    /// Forward non-stdio operations to an upstream proxy.
    pub upstream: bool,
    pub max_frame: usize,
    pub limits: Limits,
    pub max_open_handles: usize,
    pub max_queued_requests: usize,
    pub max_virtual_bytes: u64,
    /// Virtual files the namespace may hold.
    #[serde(default = "bounds::default_max_virtual_files")]
    pub max_virtual_files: usize,
    /// Bytes of requests one client may have queued.
    #[serde(default = "bounds::default_max_queued_bytes")]
    pub max_queued_bytes: u64,
    /// Bytes of requests all clients together may have queued.
    #[serde(default = "bounds::default_max_session_queued_bytes")]
    pub max_session_queued_bytes: u64,
    /// Clients served at once, attached ones included.
    #[serde(default = "bounds::default_max_clients")]
    pub max_clients: usize,
    /// Bytes of partial frames all connections together may hold.
    #[serde(default = "bounds::default_max_buffered_bytes")]
    pub max_buffered_bytes: u64,
    /// Largest frame accepted from upstream; larger ones are skipped.
    #[serde(default = "bounds::default_max_upstream_frame")]
    pub max_upstream_frame: usize,
    /// Descriptors the session may hold (the shell derives it from
    /// `RLIMIT_NOFILE`).
    #[serde(default = "bounds::default_max_descriptors")]
    pub max_descriptors: usize,
    /// Of `max_descriptors`, those connections must leave free for host
    /// files and provider calls.
    #[serde(default = "bounds::default_descriptor_reserve")]
    pub descriptor_reserve: usize,
    /// The session's LLM broker, serving `LLMCMD`, `QUOTA` and `CANCEL`.
    /// `None`: those ops answer `E_UNSUPPORTED` (or are forwarded, when
    /// `upstream` is set). Ignored when `upstream` is set: serialization
    /// happens at the top, so a forwarding level never runs a broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerSetup>,
    /// The session's fd pager (`[file_descriptor]`), serving the `FD_*`
    /// ops. `None`: they answer `E_UNSUPPORTED`. A level that forwards
    /// upstream forwards them whatever this says: fds live at the top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pager: Option<PagerConfig>,
    /// A forwarding level's children see only these fds, and those they
    /// wrap themselves (`--isolate-fds`, `--preload-fd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_fds: Option<Vec<String>>,
    /// A deliberate bug, switched on only by the simulator's own tests to
    /// prove its checkers can fail. Never set in production; absent from
    /// serialized configs unless set, so a trace records it when it was on.
    #[doc(hidden)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planted_bug: Option<PlantedBug>,
    /// Yield an `Output::Audit` record for every file operation
    /// (`--audit FILE`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub audit: bool,
    /// Bytes one host read may ask for on behalf of reads of one handle
    /// queued back to back (see `read_batch`); 0: every read on its own.
    /// Absent from a config (a trace recorded before batches) means 0.
    #[serde(default)]
    pub max_read_batch: u32,
    /// Entries one `list` answer holds at most (`--max-list-entries`).
    #[serde(default = "default_max_list_entries")]
    pub max_list_entries: u32,
    /// Bytes of names one `list` answer holds at most, past its first
    /// entry (`--max-list-bytes`).
    #[serde(default = "default_max_list_bytes")]
    pub max_list_bytes: u32,
    /// The served filesystem's settings (`Input::FuseMounted`).
    #[serde(default, skip_serializing_if = "crate::fuse::FuseConfig::is_default")]
    pub fuse: crate::fuse::FuseConfig,
}

fn default_max_list_entries() -> u32 {
    crate::pathops::DEFAULT_MAX_LIST_ENTRIES
}

fn default_max_list_bytes() -> u32 {
    crate::pathops::DEFAULT_MAX_LIST_BYTES
}

/// Bugs the simulator's tests plant on purpose (see [`Config::planted_bug`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlantedBug {
    /// Cleanup after a departed client leaves its highest handle open.
    CleanupForgetsLastHandle,
    /// An `LLMCMD` is answered twice when its provider call succeeds.
    BrokerReplyTwice,
    /// The broker queue counts calls but not the bytes they hold.
    BrokerNoPendingByteBound,
    /// Secrets are scrubbed from the raw reply text only, as written,
    /// never from what JSON decoding makes of it.
    BrokerScrubBeforeDecodeOnly,
    /// `enforce_budget` is ignored.
    BrokerIgnoresEnforceBudget,
    /// The broker hands the lock on while the call holding it backs off
    /// before a retry.
    BrokerReleasesLockDuringBackoff,
    /// Under `enforce_budget`, a call given up on (cancelled, timed out)
    /// whose usage never comes releases its reserve unpaid.
    BrokerReleasesReserveOnCancel,
    /// Queued requests are bounded by count only, not by bytes.
    NoQueuedByteBound,
    /// Attaches are not capped by `max_clients`.
    NoClientCap,
    /// A frame that is a response is answered like a request.
    AnswerResponses,
    /// A frame is taken for a response on its top-level members alone,
    /// their contents skipped unchecked: one that is not JSON is dropped
    /// unanswered.
    UncheckedResponseShape,
    /// Virtual names cost nothing against `max_virtual_bytes`.
    VirtualNamesFree,
    /// An oversized frame from upstream ends the link (as a child's does).
    UpstreamOversizeCutsLink,
    /// Partial frames are bounded per connection only, not in total.
    NoBufferedBound,
    /// Read-only is decided on the path text: an open's scope is only the
    /// root the path names, so a symlink into a read-only root inside it
    /// is writable.
    LexicalReadOnly,
    /// A single-file root is checked on its name alone: opening the root
    /// itself follows whatever it links to.
    LexicalFileRoot,
    /// A nested level forwards relative names (its virtual namespace)
    /// upstream, where the top resolves them against its own roots.
    ForwardVirtualUpstream,
    /// A nested level never narrows its upstream, so the top resolves its
    /// requests under the top's policy alone.
    NestedSkipsNarrow,
    /// The guard a nested level narrows to replaces this level's instead
    /// of meeting it: the nested level's `--allow-protected` and
    /// `--allow-secret` grants lift the rule here.
    GuardNestedReplaces,
    /// The pager forgets the session's `max_total_bytes`.
    PagerIgnoresLimit,
    /// A connection holding a partial frame reserves room for a whole
    /// `max_frame` for it, while only the bytes received are counted.
    UncountedBuffer,
    /// VFS host: the result of an effect that timed out or was cancelled
    /// is still answered (a second response for its id).
    ToolAnswersLateResult,
    /// Served filesystem: a released file's handle leaves the table, but
    /// its host file is never closed.
    FuseReleaseKeepsFile,
    /// Served filesystem: a node's backing registration is never dropped
    /// when its last passthrough open is released.
    FuseBackingKept,
    /// VFS host: file decisions on the path as written only; the resolved
    /// path is never checked.
    ToolLexicalOnly,
    /// VFS host: payloads that are not UTF-8 go out base64 unscrubbed.
    ToolScrubTextOnly,
    /// VFS host: SIGKILL never follows SIGTERM.
    ToolNoKill,
    /// VFS host: `--op-timeout` never fires.
    ToolNoOpTimeout,
    /// VFS host: reading goes on past `max_pending` unanswered requests.
    ToolReadsPastPending,
    /// VFS host: the end of the tool's stdout never begins the finish, so
    /// a tool that closed both pipes runs on until its silence times out.
    ToolStdoutEndIgnored,
    /// VFS host: a file operation decides on the path it resolved, then
    /// reaches it again by that path from the project root, following
    /// whatever symlinks are there by then.
    ToolReopenByPath,
    /// VFS host: `fs.rename` decides its source and destination without
    /// the guard, so a protected path is renamed away or onto.
    ToolGuardSkipsRename,
    /// VFS host: the first file read reserves a reply buffer of
    /// `--max-file` that it keeps and counts nowhere.
    ToolUncountedBuffer,
}

impl PlantedBug {
    /// Whether a redactor made for a machine with this bug should match
    /// raw text only (the simulator's provider codec uses it too).
    pub fn scrubs_before_decode_only(bug: Option<PlantedBug>) -> bool {
        bug == Some(PlantedBug::BrokerScrubBeforeDecodeOnly)
    }
}

impl Config {
    pub fn new(policy: Policy, stdio: StdioRole) -> Self {
        Config {
            policy,
            stdio,
            upstream: false,
            max_frame: DEFAULT_MAX_FRAME,
            limits: Limits::default(),
            max_open_handles: DEFAULT_MAX_OPEN_HANDLES,
            max_queued_requests: DEFAULT_MAX_QUEUED_REQUESTS,
            max_virtual_bytes: DEFAULT_MAX_VIRTUAL_BYTES,
            max_virtual_files: DEFAULT_MAX_VIRTUAL_FILES,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            max_session_queued_bytes: DEFAULT_MAX_SESSION_QUEUED_BYTES,
            max_clients: DEFAULT_MAX_CLIENTS,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_upstream_frame: DEFAULT_MAX_UPSTREAM_FRAME,
            max_descriptors: DEFAULT_MAX_DESCRIPTORS,
            descriptor_reserve: DEFAULT_DESCRIPTOR_RESERVE,
            broker: None,
            pager: None,
            isolate_fds: None,
            planted_bug: None,
            audit: false,
            max_read_batch: DEFAULT_MAX_READ_BATCH,
            max_list_entries: crate::pathops::DEFAULT_MAX_LIST_ENTRIES,
            max_list_bytes: crate::pathops::DEFAULT_MAX_LIST_BYTES,
            fuse: crate::fuse::FuseConfig::default(),
        }
    }
}

/// A host file the shell holds open on the machine's behalf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FileId(pub u64);

/// Names one effect so its completion can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EffectId(pub u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdStream {
    Stdout,
    Stderr,
}

// Not `Eq`: provider requests and results carry `f64`s (temperature).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "input")]
pub enum Input {
    Connected {
        client: ClientId,
    },
    Bytes {
        client: ClientId,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// A descriptor arrived on the client's connection (SCM_RIGHTS) and
    /// the shell holds it, oldest first, for an `attach` to claim.
    Descriptor {
        client: ClientId,
    },
    /// The client's end is closed (every copy of it).
    Eof {
        client: ClientId,
    },
    /// The client's process is gone, whoever still holds the pipe.
    Died {
        client: ClientId,
    },
    EffectDone {
        id: EffectId,
        result: EffectResult,
    },
    UpstreamBytes {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    UpstreamEof,
    /// The provider call `call` (from `Output::StartProvider`) ended, or
    /// was dropped after `Output::CancelProvider`. Report it once.
    ProviderDone {
        call: CallId,
        result: ProviderResult,
    },
    /// The time `poll_timeout` named has come.
    Tick,
    /// A connection on the session socket sent a secret: the session's
    /// (`secret: None`, checked by the shell, which drew it) or another,
    /// which the machine looks up among its narrowed scopes' (see
    /// `scope_secrets`). The shell holds the connection until
    /// `Output::Admit`, `Output::Refuse` or `Output::Dismiss` answers,
    /// within this same `handle`.
    Accepted {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<Secret>,
    },
    /// A connection on the session socket sent no secret, or none in
    /// time; the shell has closed it.
    Unauthenticated,
    /// The walk of effect `id` met a protected path, a secret file or a
    /// `--deny` glob (refused, or lifted by a grant): for the report and
    /// the audit log. Fed before the effect's `EffectDone`.
    Guarded {
        id: EffectId,
        hit: crate::guard::Hit,
    },
    /// `client` is the served filesystem of root `root` (a mount in the
    /// child's view, owned by `uid`/`gid`), whose requests come as
    /// `Fuse`; `passthrough`: the shell can register backing files.
    FuseMounted {
        client: ClientId,
        root: RootId,
        uid: u32,
        gid: u32,
        #[serde(default)]
        passthrough: bool,
    },
    /// One request of mount `client`: the bytes of one read of its
    /// device. The end of the mount is `Eof`.
    Fuse {
        client: ClientId,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "output")]
pub enum Output {
    /// Framed bytes for a client.
    Send {
        client: ClientId,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Stop serving the client and drop the machine's end of its pipe
    /// (and any descriptor it passed that no `attach` claimed).
    Close {
        client: ClientId,
    },
    /// Serve the oldest descriptor `from` passed as the new client
    /// `client`; what is sent to `client` next goes over it.
    Attach {
        from: ClientId,
        client: ClientId,
    },
    /// Serve the connection of `Input::Accepted` as the new client
    /// `client`; what is sent to `client` next goes over it.
    Admit {
        client: ClientId,
    },
    /// Send `data` (the framed refusal) on the connection of
    /// `Input::Accepted`, then close it: a limit left no room for it.
    Refuse {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Close the connection of `Input::Accepted` unanswered: its secret is
    /// no live scope's.
    Dismiss,
    /// Close a descriptor `client` passed: the oldest (an attach that
    /// would have claimed it was refused by a limit), or the newest, just
    /// handed in (holding it would eat into the descriptor reserve).
    DropDescriptor {
        client: ClientId,
        newest: bool,
    },
    Effect {
        id: EffectId,
        effect: Effect,
    },
    /// Framed bytes for the upstream proxy.
    SendUpstream {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Make the provider call; report it with `Input::ProviderDone`. The
    /// broker gives up on it at `deadline` (and then asks to cancel it).
    StartProvider {
        call: CallId,
        request: ProviderRequest,
        deadline: Instant,
    },
    /// Drop the provider request of `call`, then report `ProviderDone`
    /// for it (with whatever usage it had).
    CancelProvider {
        call: CallId,
    },
    /// One line for the telemetry file.
    Telemetry {
        record: TelemetryRecord,
    },
    /// The broker's charges passed its budget in advisory mode (no
    /// `enforce_budget`): the shell says so, once.
    BudgetPassed {
        initial: broker::Money,
        charged: broker::Money,
    },
    /// One line for the audit file (with `Config::audit`).
    Audit {
        record: audit::AuditRecord,
    },
    /// One reply for mount `client`: write it to its device whole.
    FuseReply {
        client: ClientId,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "effect")]
pub enum Effect {
    /// Open `rel` beneath root `root`, resolving symlinks under a
    /// capability and refusing unless `scope` permits the resolved path in
    /// `mode` (see [`crate::resolve`]).
    Open {
        file: FileId,
        root: RootId,
        #[serde(with = "crate::ospath")]
        rel: PathBuf,
        mode: Mode,
        scope: Scope,
        /// A served filesystem's open: whether it may create, must
        /// create, truncates, and with which permission bits. `None`:
        /// as `mode` says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        how: Option<crate::resolve::OpenHow>,
    },
    /// Read up to `max` bytes at `offset`, the file's position untouched.
    ReadAt {
        file: FileId,
        offset: u64,
        max: u32,
    },
    /// Write `data` at `offset`.
    WriteAt {
        file: FileId,
        offset: u64,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// What the open file is now (`Stat`).
    Fstat {
        file: FileId,
    },
    /// Cut or extend the open file to `size` (`Stat`).
    Truncate {
        file: FileId,
        size: u64,
    },
    /// The target of the symlink at `path` (absolute, lexically normal),
    /// resolved and decided for reading under `scope` as a path
    /// operation is (`Target`).
    Readlink {
        #[serde(with = "crate::ospath")]
        path: PathBuf,
        scope: Scope,
    },
    Read {
        file: FileId,
        max: u32,
    },
    Write {
        file: FileId,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    Close {
        file: FileId,
    },
    ReadStdin {
        max: u32,
    },
    WriteStdio {
        stream: StdStream,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Draw a fresh secret from the OS's random number generator, for a
    /// narrowed scope (see `scope_secrets`): answered with `Secret`, or
    /// `Failed`.
    DrawSecret,
    /// A path operation on host files, resolving symlinks under a
    /// capability and deciding on what it resolves to under `scope` (see
    /// [`crate::pathops`]). Answered with `Stat`, `Listed`, `Done` or
    /// `Failed`.
    Path {
        op: PathOp,
        scope: Scope,
    },
    /// Register the open `file` as a backing file with the kernel of
    /// served mount `client` (passthrough): answered with `Backing`, or
    /// `Failed` (the open is then served).
    Backing {
        client: ClientId,
        file: FileId,
    },
    /// Drop the registration `id` of mount `client` (the kernel's open
    /// file keeps the backing file): answered with `Done` or `Failed`.
    Unback {
        client: ClientId,
        id: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsErrorKind {
    NotFound,
    /// Permission denied, or a path that led out of its root.
    Denied,
    /// What is there does not fit the request: a name that already
    /// exists, a directory not empty, a directory where a file was meant
    /// (`E_ARG`).
    Conflict,
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum EffectResult {
    Opened,
    Data {
        #[serde(with = "b64")]
        data: Vec<u8>,
        eof: bool,
    },
    Written {
        written: u64,
    },
    Closed,
    Failed {
        kind: FsErrorKind,
        message: String,
    },
    /// A `PathOp::Stat` or `SetAttr`.
    Stat {
        stat: FileStat,
    },
    /// A `PathOp::List`: one page.
    Listed {
        page: Page,
    },
    /// A `PathOp::Mkdir`, `Remove` or `Rename`.
    Done,
    /// A symlink's target (`Effect::Readlink`).
    Target {
        #[serde(with = "b64")]
        target: Vec<u8>,
    },
    /// A fresh secret (`Effect::DrawSecret`).
    Secret {
        secret: Secret,
    },
    /// A backing file's registration (`Effect::Backing`).
    Backing {
        id: u32,
    },
}

impl EffectResult {
    /// A path operation's outcome as the effect's result.
    pub fn of_path(outcome: Result<PathDone, crate::resolve::Refusal>) -> Self {
        match outcome {
            Ok(PathDone::Stat(stat)) => EffectResult::Stat { stat },
            Ok(PathDone::Listed(page)) => EffectResult::Listed { page },
            Ok(PathDone::Done) => EffectResult::Done,
            Err(r) => EffectResult::Failed { kind: r.kind(), message: r.to_string() },
        }
    }
}

/// Counters for `--report` and for the simulator's checkers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub requests: u64,
    pub responses: u64,
    pub errors_by_code: BTreeMap<ErrorCode, u64>,
    pub handles_opened: u64,
    pub handles_closed: u64,
    /// Of `handles_closed`, those closed because their client left.
    pub handles_cleaned_up: u64,
    pub clients: u64,
    /// Frames that ended a session: oversized length prefixes.
    pub frames_rejected: u64,
    /// Sessions that hit EOF in the middle of a frame.
    pub truncated_frames: u64,
    /// Upstream responses that could not be matched or decoded.
    pub upstream_errors: u64,
    /// Frames from clients that were responses, not requests: dropped
    /// unanswered (a peer looping answers back).
    #[serde(default)]
    pub responses_ignored: u64,
    /// Upstream frames above `max_upstream_frame`, skipped (each failed
    /// the request it answered, when it could be told).
    #[serde(default)]
    pub upstream_oversized: u64,
    /// Requests refused by a byte or count bound, attaches refused by
    /// `max_clients` or the descriptor reserve, connections ended for
    /// holding too many partial-frame bytes.
    #[serde(default)]
    pub bounds_refused: u64,
    /// Clients admitted through the session socket (also in `clients`).
    #[serde(default)]
    pub socket_clients: u64,
    /// Connections on the session socket closed for a wrong or missing
    /// secret.
    #[serde(default)]
    pub socket_unauthenticated: u64,
    /// Every protected path, secret file and `--deny`ed path a request
    /// resolved to, with its rule and how often it was refused and
    /// granted (at most [`MAX_GUARDED_PATHS`] paths; more are counted in
    /// `guarded_unlisted`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub guarded: BTreeMap<PathBuf, GuardedPath>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub guarded_unlisted: u64,
    /// Path operations asked for, by op (`stat`, `list`, `mkdir`,
    /// `remove`, `rename`), refused ones included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub path_ops: BTreeMap<String, u64>,
    /// The served filesystem's counts.
    #[serde(default, skip_serializing_if = "FuseStats::is_empty")]
    pub fuse: FuseStats,
}

/// What the served filesystem's mounts asked and were answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseStats {
    pub mounts: u64,
    pub requests: u64,
    pub replies: u64,
    /// Requests the codec could not read.
    pub rejected: u64,
    pub interrupts: u64,
    /// Opens whose reads the kernel makes from the host file itself
    /// (passthrough), unseen by airlock after the open.
    #[serde(default)]
    pub passthrough: u64,
    /// Replies that were errors, by errno.
    pub errors: BTreeMap<i32, u64>,
}

impl FuseStats {
    pub fn is_empty(&self) -> bool {
        self == &FuseStats::default()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Paths the report lists in `guarded`.
pub const MAX_GUARDED_PATHS: usize = 1024;

/// One guarded path in [`Stats::guarded`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardedPath {
    pub rule: crate::guard::Rule,
    pub class: crate::guard::Class,
    pub refused: u64,
    pub granted: u64,
}

#[derive(Debug)]
enum Target {
    Host(FileId),
    Virtual { node: virtual_fs::NodeId, pos: u64 },
    Upstream(Handle),
}

#[derive(Debug)]
struct Slot {
    mode: Mode,
    target: Target,
}

/// What a pending effect or upstream request is for.
#[derive(Debug)]
enum Waiting {
    Open {
        file: FileId,
        mode: Mode,
    },
    UpstreamOpen {
        mode: Mode,
    },
    Read,
    /// Reads of one host file served by one host read (`read_batch`),
    /// the first being the request this answers.
    ReadBatch {
        file: FileId,
        reads: Vec<read_batch::Batched>,
    },
    /// A read forwarded upstream, asking for at most `max` bytes: an
    /// answer with more is refused.
    UpstreamRead {
        max: u32,
    },
    Write,
    Close,
    /// Closing for a client that left; nobody to answer.
    Cleanup,
    Stdio,
    /// A forwarded `LLMCMD`, under `up_token` upstream; `token` is the
    /// client's own cancel token, if it gave one. Does not make the
    /// client busy.
    UpstreamLlm {
        token: Option<String>,
        up_token: String,
    },
    /// A forwarded `QUOTA` or `CANCEL`. Does not make the client busy.
    UpstreamBroker,
    /// This level's own `narrow` of its upstream.
    Narrow,
    /// A client's `narrow`, waiting for the secret it is answered with;
    /// `scope` is what the client will be narrowed to once it comes.
    ScopeSecret {
        scope: Box<Scope>,
    },
    /// A file operation of one of the pager's jobs.
    Pager {
        job: JobId,
    },
    /// A forwarded `FD_*` op.
    UpstreamFd(fd::Forwarded),
    /// A path operation on host files (`Effect::Path`).
    Path,
    /// A path operation forwarded upstream.
    UpstreamPath,
    /// A request of a served filesystem's mount.
    Fuse(fuse::FuseWait),
}

impl Waiting {
    /// Broker ops never hold up the client's other requests.
    fn holds_client(&self) -> bool {
        !matches!(self, Waiting::UpstreamLlm { .. } | Waiting::UpstreamBroker | Waiting::Narrow)
    }
}

#[derive(Debug)]
struct Pending {
    client: ClientId,
    /// The request this answers; `None` for cleanup.
    req: Option<String>,
    waiting: Waiting,
}

#[derive(Debug)]
struct Client {
    decoder: FrameDecoder,
    /// Requests in arrival order, as the frames they came in (their
    /// parsed form may be many times larger); undecodable ones keep their
    /// place so their errors are answered in order too.
    queue: VecDeque<Queued>,
    /// Bytes of `queue`'s frames, and of the reads waiting in a batch.
    queued_bytes: u64,
    /// Reads taken from `queue` into a batch, not yet answered nor being
    /// served: they still count against `max_queued_requests`.
    batched: usize,
    /// Serving a request whose answer waits on an effect or upstream.
    busy: bool,
    /// Waiting on an effect on a host file: cleanup must wait for it, so
    /// a close never overtakes an operation on the same file.
    busy_on_file: bool,
    alive: bool,
    /// Descriptors passed and not yet claimed by an `attach`, oldest
    /// first: `true` for one the shell holds, `false` for one dropped on
    /// arrival (the reserve), whose attach is refused with E_RANGE. Kept
    /// in order, so each attach claims the socket sent with it.
    passed: VecDeque<bool>,
    /// What the client narrowed itself to (`narrow`), inherited by the
    /// clients attached from it.
    scope: Option<Scope>,
    /// This level's own scope intersected with `scope`, computed once per
    /// `narrow` rather than per open.
    effective: Option<Scope>,
    /// The narrowed scope whose secret this client holds alive (see
    /// `scope_secrets`): set with `scope`, inherited with it.
    key: Option<scope_secrets::ScopeKey>,
    /// Room reserved ahead of a partial frame: only with
    /// `PlantedBug::UncountedBuffer`.
    read_ahead: Vec<u8>,
}

/// A nested level narrows its upstream before forwarding anything.
#[derive(Debug)]
enum UpNarrow {
    NotSent,
    /// Sent; frames forwarded meanwhile wait here for its answer, so none
    /// reaches an upstream that has not narrowed.
    Waiting(Vec<Vec<u8>>),
    Done,
}

/// A request waiting its turn: what its frame held, the frame's length
/// (what the byte bounds charge for it), and whether it closes a handle
/// (which the queue admits past its bounds, see `enqueue`).
#[derive(Debug)]
struct Queued {
    len: u64,
    held: Held,
    closes: Option<Handle>,
}

/// A queued request as it is held until served.
#[derive(Debug)]
enum Held {
    /// Parsed on arrival, so that serving it (or looking at it to batch
    /// it) does not parse it again. Only what holds no more than its frame
    /// held (a handle, bytes, a path, a refusal), so that the bounds,
    /// charged by frame length, stay bounds of memory.
    Parsed(Result<Request, Rejection>),
    /// The frame, for what a parse may make bigger than its text (a scope,
    /// a JSON tree), parsed when served.
    Frame(Vec<u8>),
}

impl Held {
    fn new(payload: &[u8], req: Result<Request, Rejection>) -> Self {
        let small = match &req {
            Err(_) => true,
            Ok(Request { op, .. }) => matches!(
                op,
                Op::Read { .. }
                    | Op::Write { .. }
                    | Op::Close { .. }
                    | Op::Attach
                    | Op::Open { scope: None, .. }
                    | Op::Path { scope: None, .. }
            ),
        };
        if small {
            Held::Parsed(req)
        } else {
            Held::Frame(payload.to_vec())
        }
    }

    fn request(self, limits: wire::Limits) -> Result<Request, Rejection> {
        match self {
            Held::Parsed(req) => req,
            Held::Frame(payload) => wire::parse_request(&payload, limits),
        }
    }
}

#[derive(Debug)]
pub struct FsProxy {
    config: Config,
    clients: BTreeMap<ClientId, Client>,
    table: HandleTable<Slot>,
    virt: VirtualFs,
    pending: BTreeMap<EffectId, Pending>,
    next_effect: u64,
    next_file: u64,
    /// Host opens under way, counted against the handle limit.
    opening: usize,
    upstream_decoder: FrameDecoder,
    /// Bytes queued by all clients (`Client::queued_bytes` summed).
    queued_total: u64,
    /// Partial-frame bytes of all clients' decoders.
    buffered_total: u64,
    /// Host files open or being opened or closed: descriptors the shell
    /// holds for them.
    host_fds: usize,
    upstream_pending: BTreeMap<String, Pending>,
    upstream_alive: bool,
    next_upstream_id: u64,
    next_attached: u64,
    outputs: VecDeque<Output>,
    stats: Stats,
    broker: Option<Broker>,
    /// With `Config::audit`: what the records need.
    audit: Option<audit::Audit>,
    /// The first file written in the virtual namespace (its name, cut to
    /// [`NOTICE_NAME_BYTES`]), until the shell takes it to say so once.
    virtual_notice: Option<String>,
    virtual_noticed: bool,
    /// The served filesystem's mounts, by the client each is served as.
    fuse: BTreeMap<ClientId, crate::fuse::mount::Mount>,
    /// The `now` of the input being handled.
    now: Instant,
    /// Broker call ids, for `LLMCMD` and `CANCEL` requests alike.
    next_call: u64,
    /// Requests the broker will answer: its call id → (client, request id).
    calls: BTreeMap<CallId, (ClientId, String)>,
    /// Forwarding: a client's cancel token → the token used upstream for
    /// its live `LLMCMD`. Upstream tokens are the machine's own (`t0`,
    /// `t1`, …), so children's tokens can never collide at the top, and
    /// every forwarded call has one, so a departed child's calls can be
    /// cancelled there.
    up_tokens: BTreeMap<(ClientId, String), (String, ClientId)>,
    /// Attached clients' cancel-token scope: the connection their chain of
    /// attaches started from (see `BrokerInput::Submit::scope`).
    scopes: BTreeMap<ClientId, ClientId>,
    next_up_token: u64,
    /// This level's own policy as a scope.
    own_scope: Scope,
    up_narrow: UpNarrow,
    /// The secrets of the narrowed scopes its clients hold.
    scope_secrets: scope_secrets::ScopeSecrets,
    /// The session's fds (top level with `[file_descriptor]` only).
    pager: Option<Pager>,
    fd: fd::FdState,
    /// Host reads served during the input being handled, asked of the host
    /// once it is handled (see `read_batch`).
    starting_reads: Vec<read_batch::Starting>,
}

/// A nested level's narrowing refuses `abs` before anything is resolved
/// (the decision on the resolved file follows, at the level that holds
/// it).
fn narrowed_permit(narrowing: Option<&Scope>, abs: &std::path::Path, write: bool) -> Result<(), Failure> {
    use crate::scope::Denial;
    let Some(n) = narrowing else { return Ok(()) };
    let act = if write { crate::guard::Act::Write } else { crate::guard::Act::Read };
    let canonical = crate::policy::bytes::canonical(crate::policy::bytes::bytes(abs));
    let msg = match n.decide(&canonical, act, false) {
        Ok(_) => return Ok(()),
        Err(Denial::Guarded(hit)) => hit.to_string(),
        Err(Denial::ReadOnly { rule }) => {
            format!("path is under {}, which a nested level narrowed to read-only", rule.path.display())
        }
        Err(Denial::Outside { rule: Some(r) }) => {
            format!("path is under {}, which a nested level denies", r.path.display())
        }
        Err(Denial::Outside { rule: None }) => {
            "path is outside the roots a nested level narrowed this connection to".to_owned()
        }
    };
    Err(Failure::new(ErrorCode::Perm, msg))
}

fn missing_failure(h: Handle, m: Missing) -> Failure {
    match m {
        Missing::NoEntry => Failure::new(ErrorCode::NoEnt, format!("no such handle: {h}")),
        Missing::Closed => Failure::new(ErrorCode::Closed, format!("handle {h} is closed")),
    }
}

fn denied_failure(d: Denied) -> Failure {
    let code = if d == Denied::Empty { ErrorCode::Arg } else { ErrorCode::Perm };
    Failure::new(code, d.to_string())
}

fn fs_failure(kind: FsErrorKind, message: String) -> Failure {
    let code = match kind {
        FsErrorKind::NotFound => ErrorCode::NoEnt,
        FsErrorKind::Denied => ErrorCode::Perm,
        FsErrorKind::Conflict => ErrorCode::Arg,
        FsErrorKind::Other => ErrorCode::Io,
    };
    Failure { code, message }
}

fn unexpected(result: &EffectResult) -> Failure {
    Failure::new(ErrorCode::Io, format!("unexpected effect result: {result:?}"))
}

impl FsProxy {
    /// A machine for `config`. A broker that `config` describes but that
    /// does not validate is left out (its ops then answer
    /// `E_UNSUPPORTED`): use [`FsProxy::try_new`] to hear why instead.
    /// Used by replay and tests, whose configs were valid when written.
    pub fn new(config: Config) -> Self {
        let broker = Self::broker_for(&config).ok().flatten();
        Self::build(config, broker)
    }

    /// A machine for `config`, refusing a broker setup [`Broker::new`]
    /// refuses. What the production shell calls.
    pub fn try_new(config: Config) -> Result<Self, broker::ConfigError> {
        let broker = Self::broker_for(&config)?;
        Ok(Self::build(config, broker))
    }

    fn broker_for(config: &Config) -> Result<Option<Broker>, broker::ConfigError> {
        match &config.broker {
            // Validated all the same, so a bad setup is reported wherever
            // it sits in a tree of proxies.
            Some(setup) if config.upstream => setup.validate().map(|_| None),
            Some(setup) => setup.build().map(Some),
            None => Ok(None),
        }
    }

    fn build(config: Config, mut broker: Option<Broker>) -> Self {
        if let Some(b) = broker.as_mut() {
            match config.planted_bug {
                Some(PlantedBug::BrokerNoPendingByteBound) => {
                    b.plant_bug(broker::BrokerBug::NoPendingByteBound)
                }
                Some(PlantedBug::BrokerIgnoresEnforceBudget) => {
                    b.plant_bug(broker::BrokerBug::IgnoreEnforceBudget)
                }
                Some(PlantedBug::BrokerReleasesLockDuringBackoff) => {
                    b.plant_bug(broker::BrokerBug::ReleaseLockDuringBackoff)
                }
                Some(PlantedBug::BrokerReleasesReserveOnCancel) => {
                    b.plant_bug(broker::BrokerBug::ReleaseReserveOnCancel)
                }
                _ => {}
            }
        }
        FsProxy {
            starting_reads: Vec::new(),
            pager: fd::pager_for(&config),
            fd: fd::FdState::new(&config),
            broker,
            now: Instant::ZERO,
            next_call: 0,
            calls: BTreeMap::new(),
            up_tokens: BTreeMap::new(),
            scopes: BTreeMap::new(),
            next_up_token: 0,
            clients: BTreeMap::new(),
            table: HandleTable::new(),
            virt: {
                let mut v = VirtualFs::new(config.max_virtual_bytes, config.max_virtual_files);
                if config.planted_bug == Some(PlantedBug::VirtualNamesFree) {
                    v.plant_names_free();
                }
                v
            },
            queued_total: 0,
            buffered_total: 0,
            host_fds: 0,
            pending: BTreeMap::new(),
            next_effect: 0,
            next_file: 0,
            opening: 0,
            upstream_decoder: if config.planted_bug == Some(PlantedBug::UpstreamOversizeCutsLink) {
                FrameDecoder::new(config.max_frame)
            } else {
                FrameDecoder::skipping(config.max_upstream_frame)
            },
            upstream_pending: BTreeMap::new(),
            upstream_alive: config.upstream,
            next_upstream_id: 0,
            next_attached: ATTACHED_CLIENT_BASE,
            own_scope: config.policy.scope(),
            up_narrow: UpNarrow::NotSent,
            scope_secrets: scope_secrets::ScopeSecrets::default(),
            outputs: VecDeque::new(),
            audit: config.audit.then(audit::Audit::default),
            virtual_notice: None,
            virtual_noticed: false,
            fuse: BTreeMap::new(),
            stats: Stats::default(),
            config,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The session's broker, when this machine runs one (for reports:
    /// quota, stats).
    pub fn broker(&self) -> Option<&Broker> {
        self.broker.as_ref()
    }

    /// Hand the broker the secrets no child may see (the provider's API
    /// key): every provider result is scrubbed with `redactor` before it is
    /// answered. Given at run time and never serialized, so no config or
    /// trace holds a key.
    pub fn set_redactor(&mut self, redactor: broker::Redactor) {
        let redactor = if PlantedBug::scrubs_before_decode_only(self.config.planted_bug) {
            redactor.planted_raw_only()
        } else {
            redactor
        };
        if let Some(b) = self.broker.as_mut() {
            b.set_redactor(redactor);
        }
    }

    /// Requests waiting on the broker or on a forwarded broker op.
    pub fn broker_requests_pending(&self) -> usize {
        self.calls.len()
            + self.upstream_pending.values().filter(|p| p.req.is_some() && !p.waiting.holds_client()).count()
    }

    /// Live handles on this level.
    pub fn open_handles(&self) -> usize {
        self.table.len()
    }

    /// Live handles `client` owns.
    pub fn handles_of(&self, client: ClientId) -> usize {
        self.table.owned_by(client)
    }

    /// Clients the machine still tracks (connected, or gone with an effect
    /// still to finish).
    pub fn tracked_clients(&self) -> usize {
        self.clients.len()
    }

    /// Host files open on the machine's behalf, or being opened, are all
    /// accounted for: no file effect is outstanding. Stdio effects are not
    /// counted: a read of stdin may never finish and holds nothing.
    pub fn quiescent(&self) -> bool {
        self.pending.values().all(|p| matches!(p.waiting, Waiting::Stdio))
            && self.upstream_pending.values().all(|p| p.req.is_none())
    }

    /// The first file a client opened for writing in the virtual
    /// namespace (a relative path outside every root), once per session:
    /// the shell says on stderr that it is kept in memory only.
    pub fn take_virtual_notice(&mut self) -> Option<String> {
        self.virtual_notice.take()
    }

    /// Contents of a virtual file (for tests and checkers).
    pub fn virtual_file(&self, name: &str) -> Option<&[u8]> {
        self.virt.contents(name)
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The broker's next deadline (a waiter's queue timeout or the running
    /// call's provider timeout); feed `Input::Tick` then. The FS proxy's
    /// own waits all end with an input.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.broker.as_ref().and_then(Broker::poll_timeout)
    }

    pub fn handle(&mut self, now: Instant, input: Input) {
        // Time never runs backward, as for the broker.
        self.now = self.now.max(now);
        match input {
            Input::Connected { client } => self.connect(client),
            Input::Descriptor { client } => self.on_descriptor(client),
            Input::Bytes { client, data } => self.on_bytes(client, &data),
            Input::Eof { client } | Input::Died { client } if self.fuse.contains_key(&client) => {
                self.fuse_depart(client)
            }
            Input::Eof { client } => {
                if let Some(c) = self.clients.get(&client) {
                    if c.alive && c.decoder.has_partial() {
                        self.stats.truncated_frames += 1;
                    }
                }
                self.depart(client);
            }
            Input::Died { client } => self.depart(client),
            Input::EffectDone { id, result } => self.on_effect_done(id, result),
            Input::UpstreamBytes { data } => self.on_upstream_bytes(&data),
            Input::UpstreamEof => self.upstream_lost("upstream closed"),
            Input::ProviderDone { call, result } => {
                self.feed_broker(BrokerInput::ProviderDone { call, result })
            }
            Input::Tick => self.feed_broker(BrokerInput::Tick),
            Input::Accepted { secret } => self.accept(secret),
            Input::Unauthenticated => self.stats.socket_unauthenticated += 1,
            Input::Guarded { id, hit } => self.guarded(id, hit),
            Input::FuseMounted { client, root, uid, gid, passthrough } => {
                self.fuse_mounted(client, root, uid, gid, passthrough)
            }
            Input::Fuse { client, data } => self.on_fuse(client, &data),
        }
        self.flush_reads();
    }

    /// Hand `input` to the broker (if any) and carry out what it answers.
    fn feed_broker(&mut self, input: BrokerInput) {
        let Some(b) = self.broker.as_mut() else { return };
        b.handle(self.now, input);
        while let Some(out) = self.broker.as_mut().and_then(Broker::poll_output) {
            match out {
                BrokerOutput::StartProvider { call, request, deadline } => {
                    self.outputs.push_back(Output::StartProvider { call, request, deadline });
                }
                BrokerOutput::CancelProvider { call } => {
                    self.outputs.push_back(Output::CancelProvider { call })
                }
                BrokerOutput::Telemetry(record) => self.outputs.push_back(Output::Telemetry { record }),
                BrokerOutput::BudgetPassed { initial, charged } => {
                    self.outputs.push_back(Output::BudgetPassed { initial, charged })
                }
                BrokerOutput::Reply { call, outcome, .. } => {
                    let Some((client, id)) = self.calls.remove(&call) else { continue };
                    let outcome = match outcome {
                        Ok(r) => Ok(Success::Json(r.to_wire())),
                        Err(e) => Err(Failure::new(e.code.into(), e.message)),
                    };
                    if self.config.planted_bug == Some(PlantedBug::BrokerReplyTwice) && outcome.is_ok() {
                        self.respond(client, Some(id.clone()), outcome.clone());
                    }
                    self.respond(client, Some(id), outcome);
                }
                BrokerOutput::CancelResult { request, outcome, .. } => {
                    let Some((client, id)) = self.calls.remove(&request) else { continue };
                    self.respond(client, Some(id), Ok(Success::Value(outcome.to_wire())));
                }
            }
        }
    }

    fn new_call(&mut self, client: ClientId, id: String) -> CallId {
        let call = CallId(self.next_call);
        self.next_call += 1;
        self.calls.insert(call, (client, id));
        call
    }

    /// `LLMCMD`, `QUOTA` or `CANCEL`: served by the broker, forwarded, or
    /// refused. Never leaves the client busy.
    fn serve_broker_op(&mut self, client: ClientId, id: String, op: Op) {
        let arg = |e: broker::ParamError| Failure::new(ErrorCode::Arg, e.0);
        if self.config.upstream {
            return self.forward_broker_op(client, id, op);
        }
        if self.broker.is_none() {
            let msg = format!("{} is reserved and no broker is configured", op.name());
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Unsupported, msg)));
        }
        match op {
            Op::LlmCmd { params } => match broker::wire::parse_llmcmd(&params) {
                Ok(p) => {
                    let call = self.new_call(client, id);
                    let submit = BrokerInput::Submit {
                        call,
                        owner: client,
                        scope: self.scope(client),
                        request: p.request,
                        cancel_token: p.cancel_token,
                    };
                    self.feed_broker(submit);
                }
                Err(e) => self.respond(client, Some(id), Err(arg(e))),
            },
            Op::Cancel { params } => match broker::wire::parse_cancel(&params) {
                Ok(token) => {
                    let request = self.new_call(client, id);
                    let owner = self.scope(client);
                    self.feed_broker(BrokerInput::Cancel { request, owner, token });
                }
                Err(e) => self.respond(client, Some(id), Err(arg(e))),
            },
            Op::Quota { params } => {
                let outcome = match (broker::wire::parse_quota(&params), &self.broker) {
                    (Err(e), _) => Err(arg(e)),
                    (Ok(model), Some(b)) => b
                        .quota_for(model.as_deref())
                        .map(|q| Success::Value(q.to_wire()))
                        .map_err(|e| Failure::new(e.code.into(), e.message)),
                    (Ok(_), None) => Err(Failure::new(ErrorCode::Unsupported, "no broker is configured")),
                };
                self.respond(client, Some(id), outcome);
            }
            other => {
                let msg = format!("{} is not a broker op", other.name());
                self.respond(client, Some(id), Err(Failure::new(ErrorCode::Arg, msg)));
            }
        }
    }

    /// An intermediate passes broker ops to the top, where the session's
    /// one broker runs. Cancel tokens are replaced by the machine's own
    /// (see `up_tokens`).
    fn forward_broker_op(&mut self, client: ClientId, id: String, op: Op) {
        if !self.upstream_alive {
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Io, "upstream closed")));
        }
        let arg = |e: broker::ParamError| Failure::new(ErrorCode::Arg, e.0);
        match op {
            Op::LlmCmd { mut params } => {
                // Checked here too, so a token is known good before it is
                // mapped, and a bad request costs no round trip.
                let token = match broker::wire::parse_llmcmd(&params) {
                    Ok(p) => p.cancel_token,
                    Err(e) => return self.respond(client, Some(id), Err(arg(e))),
                };
                if let Some(t) = &token {
                    if self.up_tokens.contains_key(&(self.scope(client), t.clone())) {
                        let msg = "cancel_token is already in use by another live call of this client or its process tree";
                        return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Arg, msg)));
                    }
                }
                let up_token = format!("t{}", self.next_up_token);
                self.next_up_token += 1;
                if let Some(t) = &token {
                    self.up_tokens.insert((self.scope(client), t.clone()), (up_token.clone(), client));
                }
                params.insert("cancel_token".into(), up_token.clone().into());
                self.forward(
                    client,
                    Some(id),
                    Waiting::UpstreamLlm { token, up_token },
                    Op::LlmCmd { params },
                );
            }
            Op::Cancel { params } => {
                let token = match broker::wire::parse_cancel(&params) {
                    Ok(t) => t,
                    Err(e) => return self.respond(client, Some(id), Err(arg(e))),
                };
                match self.up_tokens.get(&(self.scope(client), token)).cloned() {
                    Some((up, _)) => {
                        let mut params = serde_json::Map::new();
                        params.insert("cancel_token".into(), up.into());
                        self.forward(client, Some(id), Waiting::UpstreamBroker, Op::Cancel { params });
                    }
                    // No live call of this client carries the token: the
                    // answer the top would give, without asking it.
                    None => {
                        let result = broker::CancelOutcome::NotFound.to_wire();
                        self.respond(client, Some(id), Ok(Success::Value(result)));
                    }
                }
            }
            op @ Op::Quota { .. } => self.forward(client, Some(id), Waiting::UpstreamBroker, op),
            other => {
                let msg = format!("{} is not a broker op", other.name());
                self.respond(client, Some(id), Err(Failure::new(ErrorCode::Arg, msg)));
            }
        }
    }

    /// The cancel-token scope of `client`.
    fn scope(&self, client: ClientId) -> ClientId {
        self.scopes.get(&client).copied().unwrap_or(client)
    }

    fn connect(&mut self, client: ClientId) {
        if self.clients.contains_key(&client) {
            return;
        }
        self.stats.clients += 1;
        self.clients.insert(
            client,
            Client {
                decoder: FrameDecoder::new(self.config.max_frame),
                queue: VecDeque::new(),
                queued_bytes: 0,
                batched: 0,
                busy: false,
                busy_on_file: false,
                alive: true,
                passed: VecDeque::new(),
                scope: None,
                effective: None,
                key: None,
                read_ahead: Vec::new(),
            },
        );
    }

    fn on_bytes(&mut self, client: ClientId, data: &[u8]) {
        // Frames wholly in `data` are read where they lie; only a frame
        // not yet complete is copied into the decoder (and counted in
        // `buffered_total`).
        let mut rest = data;
        loop {
            let Some(c) = self.clients.get_mut(&client) else { return };
            if !c.alive {
                // Departed (perhaps answering a frame of this very
                // chunk): what is left of it is dropped with its decoder.
                return;
            }
            let before = c.decoder.buffered() as u64;
            let next = c.decoder.next_from(&mut rest);
            self.buffered_total = self.buffered_total - before + c.decoder.buffered() as u64;
            if self.config.planted_bug == Some(PlantedBug::UncountedBuffer)
                && c.decoder.buffered() > 0
                && c.read_ahead.capacity() == 0
            {
                c.read_ahead.reserve(self.config.max_frame);
            }
            match next {
                Ok(Some(payload)) => {
                    let (req, response) = wire::parse_request_or_response(&payload, self.config.limits);
                    // A request that parses has an `op`, so it is no
                    // response: only a refused frame needs the second look,
                    // which the parse's tree gives (`bounds::is_response`
                    // would say the same).
                    let checked = self.config.planted_bug != Some(PlantedBug::UncheckedResponseShape);
                    if req.is_err()
                        && (if checked { response } else { bounds::shape(&payload, false) })
                        && self.config.planted_bug != Some(PlantedBug::AnswerResponses)
                    {
                        // Answering would loop: count it, drop it.
                        self.stats.responses_ignored += 1;
                        continue;
                    }
                    self.stats.requests += 1;
                    self.enqueue(client, &payload, req);
                    // Serve as each frame arrives, so what a client may have
                    // queued, and what it hears before a framing error, does
                    // not depend on how its bytes were chunked.
                    self.pump(client);
                }
                Ok(None) => return self.check_buffered(client),
                Err(e) => {
                    self.stats.frames_rejected += 1;
                    self.respond(client, None, Err(Failure::new(ErrorCode::Range, e.to_string())));
                    self.depart(client);
                    return;
                }
            }
        }
    }

    fn enqueue(&mut self, client: ClientId, payload: &[u8], req: Result<Request, Rejection>) {
        let limit = self.config.max_queued_requests;
        // Closing a handle the client owns only ever releases resources, and
        // an intermediate proxy may send many at once (cleaning up after a
        // departed child) over its one connection: refusing one would leak
        // the handle here for good. Admitting one per owned handle keeps the
        // queue bounded.
        let closing = match &req {
            Ok(Request { op: Op::Close { h }, .. }) => Some(*h),
            _ => None,
        };
        let owned_close = closing.is_some_and(|h| self.table.get_mut(client, h).is_ok());
        let Some(c) = self.clients.get(&client) else { return };
        let queued = |q: &Queued| q.closes.is_some() && q.closes == closing;
        let releases = owned_close && !c.queue.iter().any(queued);
        let len = payload.len() as u64;
        // A request served at once is never queued; one that waits is held
        // as its frame, within its client's and the session's byte bounds.
        let waits = c.busy || !c.queue.is_empty();
        let refusal = if c.queue.len() + c.batched >= limit && !releases {
            Some(format!("more than {limit} requests waiting; read responses before sending more"))
        } else if waits && !releases {
            self.queued_bytes_refusal(c, len)
        } else {
            None
        };
        if let Some(msg) = refusal {
            self.stats.bounds_refused += 1;
            let id = match req {
                Ok(r) => Some(r.id),
                Err(r) => r.id,
            };
            self.respond(client, id, Err(Failure::new(ErrorCode::Range, msg)));
            return;
        }
        if !waits {
            // Served right away (`pump` finds it first): no second parse.
            return self.serve_parsed(client, req);
        }
        let Some(c) = self.clients.get_mut(&client) else { return };
        c.queued_bytes += len;
        self.queued_total += len;
        c.queue.push_back(Queued { len, held: Held::new(payload, req), closes: closing });
    }

    fn serve_parsed(&mut self, client: ClientId, req: Result<Request, Rejection>) {
        match req {
            Ok(req) => self.serve(client, req),
            Err(Rejection { id, code, message }) => {
                self.respond(client, id, Err(Failure { code, message }));
            }
        }
    }

    /// Serve `client`'s queued requests until one has to wait.
    fn pump(&mut self, client: ClientId) {
        loop {
            let Some(c) = self.clients.get_mut(&client) else { return };
            if !c.alive || c.busy {
                return;
            }
            let Some(q) = c.queue.pop_front() else { return };
            c.queued_bytes -= q.len;
            self.queued_total -= q.len;
            let req = q.held.request(self.config.limits);
            self.serve_parsed(client, req);
        }
    }

    fn respond(&mut self, client: ClientId, id: Option<String>, outcome: Result<Success, Failure>) {
        let Some(c) = self.clients.get(&client) else { return };
        if !c.alive {
            return;
        }
        if let Err(f) = &outcome {
            *self.stats.errors_by_code.entry(f.code).or_default() += 1;
        }
        self.stats.responses += 1;
        if let (Some(a), Some(id)) = (&mut self.audit, &id) {
            if let Some(record) = a.answered(client, id, &outcome) {
                self.outputs.push_back(Output::Audit { record });
            }
        }
        let resp = Response { id, outcome };
        let data = frame::encode_with(|out| wire::encode_response_into(&resp, out));
        self.outputs.push_back(Output::Send { client, data });
    }

    fn effect(&mut self, pending: Pending, effect: Effect) {
        let id = EffectId(self.next_effect);
        self.next_effect += 1;
        if matches!(pending.waiting, Waiting::Open { .. }) {
            self.opening += 1;
            self.host_fds += 1;
        }
        if pending.req.is_some() {
            if let Some(c) = self.clients.get_mut(&pending.client) {
                c.busy = true;
                c.busy_on_file = !matches!(pending.waiting, Waiting::Stdio | Waiting::ScopeSecret { .. });
            }
        }
        self.pending.insert(id, pending);
        self.outputs.push_back(Output::Effect { id, effect });
    }

    fn forward(&mut self, client: ClientId, req: Option<String>, waiting: Waiting, op: Op) {
        if matches!(self.up_narrow, UpNarrow::NotSent)
            && self.config.planted_bug != Some(PlantedBug::NestedSkipsNarrow)
        {
            self.narrow_upstream();
        }
        let id = format!("u{}", self.next_upstream_id);
        self.next_upstream_id += 1;
        let closing = matches!(op, Op::Close { .. });
        let payload = wire::encode_request(&Request { id: id.clone(), op });
        // A request grows on its way up (a longer id, a path made
        // absolute), and the level above takes frames up to the same
        // limit: one that no longer fits fails alone here, rather than
        // making the level above drop the connection every client of this
        // level shares. Closes are small and always go: refusing one would
        // leave the handle open above.
        if payload.len() > self.config.max_frame && req.is_some() && !closing {
            if let Waiting::UpstreamLlm { token: Some(t), .. } = &waiting {
                self.up_tokens.remove(&(client, t.clone()));
            }
            let msg = format!(
                "the request is {} bytes once forwarded upstream, over the {}-byte frame limit",
                payload.len(),
                self.config.max_frame
            );
            return self.respond(client, req, Err(Failure::new(ErrorCode::Range, msg)));
        }
        if req.is_some() && waiting.holds_client() {
            if let Some(c) = self.clients.get_mut(&client) {
                c.busy = true;
            }
        }
        self.upstream_pending.insert(id, Pending { client, req, waiting });
        let data = frame::encode(&payload);
        match &mut self.up_narrow {
            UpNarrow::Waiting(held) => held.push(data),
            _ => self.outputs.push_back(Output::SendUpstream { data }),
        }
    }

    /// Before its first forwarded request, a nested level narrows its
    /// upstream connection to its own policy, so the level that owns the
    /// files resolves everything from here under the intersection.
    fn narrow_upstream(&mut self) {
        let id = format!("u{}", self.next_upstream_id);
        self.next_upstream_id += 1;
        let op = Op::Narrow { scope: self.own_scope.clone() };
        let payload = wire::encode_request(&Request { id: id.clone(), op });
        let nobody = Pending { client: ClientId(u64::MAX), req: None, waiting: Waiting::Narrow };
        self.upstream_pending.insert(id, nobody);
        self.outputs.push_back(Output::SendUpstream { data: frame::encode(&payload) });
        self.up_narrow = UpNarrow::Waiting(Vec::new());
    }

    /// The upstream answered this level's `narrow`: send what waited, or,
    /// if it refused (an upstream that does not know `narrow` would apply
    /// none of this level's policy), forward nothing ever.
    fn upstream_narrowed(&mut self, outcome: Result<Success, Failure>) {
        let held = match std::mem::replace(&mut self.up_narrow, UpNarrow::Done) {
            UpNarrow::Waiting(held) => held,
            _ => Vec::new(),
        };
        match outcome {
            Ok(_) => {
                for data in held {
                    self.outputs.push_back(Output::SendUpstream { data });
                }
            }
            Err(f) => {
                self.stats.upstream_errors += 1;
                self.upstream_lost(&format!(
                    "the upstream proxy cannot narrow to this level's policy ({}: {}); nothing is forwarded",
                    f.code, f.message
                ));
            }
        }
    }

    /// `narrow`: the client (a nested level, or a process about to start
    /// one it trusts less) may reach only what `scope` also allows, from
    /// now on; it can never widen. Answered, once the shell drew it, with
    /// the secret of the narrowed scope (see `scope_secrets`); nothing
    /// changes until then, nor when it is refused.
    fn narrow(&mut self, client: ClientId, id: String, scope: Scope) {
        let Some(c) = self.clients.get(&client) else { return };
        let narrowed = match &c.scope {
            Some(s) => s.intersect(&scope),
            None => scope,
        };
        if !self.scope_secrets.reserve() {
            self.stats.bounds_refused += 1;
            let msg = format!(
                "narrow refused: at most {MAX_SCOPE_SECRETS} narrowed scopes may be live in a session; \
                 end a narrowed connection first"
            );
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Range, msg)));
        }
        let waiting = Waiting::ScopeSecret { scope: Box::new(narrowed) };
        self.effect(Pending { client, req: Some(id), waiting }, Effect::DrawSecret);
    }

    /// The shell drew the secret of a `narrow`: the client is narrowed
    /// and told it, or, if it could not be bound, left as it was.
    fn scope_secret_drawn(
        &mut self,
        client: ClientId,
        scope: Scope,
        result: EffectResult,
    ) -> Result<Success, Failure> {
        let secret = match result {
            EffectResult::Secret { secret } => secret,
            EffectResult::Failed { kind, message } => {
                self.scope_secrets.unreserve();
                return Err(fs_failure(kind, format!("drawing the narrowed scope's secret: {message}")));
            }
            other => {
                self.scope_secrets.unreserve();
                return Err(unexpected(&other));
            }
        };
        if !self.clients.get(&client).is_some_and(|c| c.alive) {
            self.scope_secrets.unreserve();
            return Err(Failure::new(ErrorCode::Io, "client left"));
        }
        let effective = self.own_scope.intersect(&scope);
        let key = match self.scope_secrets.bind(secret.clone(), scope.clone(), effective.clone()) {
            Ok(key) => key,
            Err(e) => {
                return Err(Failure::new(
                    ErrorCode::Io,
                    format!("binding the narrowed scope's secret: {e:?}"),
                ))
            }
        };
        let Some(c) = self.clients.get_mut(&client) else {
            return Err(Failure::new(ErrorCode::Io, "client left"));
        };
        let old = c.key.replace(key);
        c.scope = Some(scope);
        c.effective = Some(effective);
        if let Some(old) = old {
            self.scope_secrets.release(old);
        }
        let mut answer = serde_json::Map::new();
        answer.insert("secret".into(), secret.as_str().into());
        Ok(Success::Value(answer))
    }

    fn serve(&mut self, client: ClientId, req: Request) {
        let Request { id, op } = req;
        if let Some(a) = &mut self.audit {
            a.request(client, &id, &op);
        }
        let immediate = match op {
            Op::Quota { .. } | Op::LlmCmd { .. } | Op::Cancel { .. } => {
                self.serve_broker_op(client, id, op);
                return;
            }
            Op::Attach => {
                self.attach(client, id);
                return;
            }
            Op::Narrow { scope } => {
                self.narrow(client, id, scope);
                return;
            }
            Op::Fd { op, params } => {
                self.serve_fd(client, id, op, params);
                return;
            }
            Op::Read { h, .. } | Op::Write { h, .. } | Op::Close { h } if h.is_stdio() => {
                self.serve_stdio(client, id, op);
                return;
            }
            Op::Path { req, scope } => {
                self.serve_path(client, id, req, scope);
                return;
            }
            Op::Open { path, mode, scope } => match self.open(client, &id, &path, mode, scope) {
                Ok(Some(s)) => Ok(s),
                Ok(None) => return,
                Err(f) => Err(f),
            },
            Op::Read { h, max } => match self.read(client, &id, h, max) {
                Ok(Some(s)) => Ok(s),
                Ok(None) => return,
                Err(f) => Err(f),
            },
            Op::Write { h, data } => match self.write(client, &id, h, data) {
                Ok(Some(s)) => Ok(s),
                Ok(None) => return,
                Err(f) => Err(f),
            },
            Op::Close { h } => match self.close(client, &id, h) {
                Ok(Some(s)) => Ok(s),
                Ok(None) => return,
                Err(f) => Err(f),
            },
        };
        self.respond(client, Some(id), immediate);
    }

    /// A process sharing its parent's connection asks for one of its own:
    /// its requests and answers can then never interleave with another
    /// process's, and its handles are cleaned up when it, not the whole
    /// tree, goes away.
    fn attach(&mut self, client: ClientId, id: String) {
        let live = self.live_clients();
        let max = self.config.max_clients;
        let capped = self.config.planted_bug != Some(PlantedBug::NoClientCap);
        let Some(c) = self.clients.get_mut(&client) else { return };
        let Some(held) = c.passed.pop_front() else {
            let msg = "attach needs a socket passed with the request (SCM_RIGHTS)";
            self.respond(client, Some(id), Err(Failure::new(ErrorCode::Arg, msg)));
            return;
        };
        if !held {
            self.stats.bounds_refused += 1;
            let msg = format!(
                "attach refused: its socket would eat into the {} descriptors kept for files \
                 and provider calls (--max-descriptors {})",
                self.config.descriptor_reserve, self.config.max_descriptors
            );
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Range, msg)));
        }
        if capped && live >= max {
            self.stats.bounds_refused += 1;
            self.outputs.push_back(Output::DropDescriptor { client, newest: false });
            let msg = format!("attach refused: the session serves at most {max} clients (--max-clients)");
            return self.respond(client, Some(id), Err(Failure::new(ErrorCode::Range, msg)));
        }
        let (scope, effective, key) = (c.scope.clone(), c.effective.clone(), c.key);
        let new = ClientId(self.next_attached);
        self.next_attached += 1;
        self.scopes.insert(new, self.scope(client));
        self.outputs.push_back(Output::Attach { from: client, client: new });
        self.connect(new);
        // A process attached from a narrowed connection is just as narrow,
        // and keeps its scope's secret alive as that connection does.
        if let Some(c) = self.clients.get_mut(&new) {
            c.scope = scope;
            c.effective = effective;
            c.key = key;
        }
        if let Some(key) = key {
            self.scope_secrets.hold(key);
        }
        self.respond(new, Some(id), Ok(Success::Attached));
    }

    /// A process of the session that reached it through the session socket
    /// (its descriptor closed on the way) gets a client of its own, under
    /// the same limits as an attached one: counted against `max_clients`
    /// and the descriptor reserve, cleaned up on EOF. Its policy is the
    /// session's when it sent the session's secret (`secret: None`), the
    /// narrowed scope's when it sent that scope's; a secret no live scope
    /// has gets the connection closed unanswered, as a wrong session
    /// secret does. Its first answer, to the id
    /// [`wire::SOCKET_GREETING_ID`], says whether it was admitted.
    fn accept(&mut self, secret: Option<Secret>) {
        let key = match secret {
            None => None,
            Some(s) => match self.scope_secrets.find(&s) {
                Some(key) => Some(key),
                None => {
                    self.stats.socket_unauthenticated += 1;
                    self.outputs.push_back(Output::Dismiss);
                    return;
                }
            },
        };
        let max = self.config.max_clients;
        let capped = self.config.planted_bug != Some(PlantedBug::NoClientCap);
        let refusal = if self.connections_full() {
            Some(format!(
                "connection refused: it would eat into the {} descriptors kept for files and \
                 provider calls (--max-descriptors {})",
                self.config.descriptor_reserve, self.config.max_descriptors
            ))
        } else if capped && self.live_clients() >= max {
            Some(format!("connection refused: the session serves at most {max} clients (--max-clients)"))
        } else {
            None
        };
        let id = Some(wire::SOCKET_GREETING_ID.to_owned());
        if let Some(msg) = refusal {
            self.stats.bounds_refused += 1;
            *self.stats.errors_by_code.entry(ErrorCode::Range).or_default() += 1;
            self.stats.responses += 1;
            let resp = Response { id, outcome: Err(Failure::new(ErrorCode::Range, msg)) };
            let data = frame::encode_with(|out| wire::encode_response_into(&resp, out));
            self.outputs.push_back(Output::Refuse { data });
            return;
        }
        let new = ClientId(self.next_attached);
        self.next_attached += 1;
        self.stats.socket_clients += 1;
        self.outputs.push_back(Output::Admit { client: new });
        self.connect(new);
        if let Some(key) = key {
            let scopes = self.scope_secrets.scopes(key).map(|(s, e)| (s.clone(), e.clone()));
            if let (Some(c), Some((scope, effective))) = (self.clients.get_mut(&new), scopes) {
                c.scope = Some(scope);
                c.effective = Some(effective);
                c.key = Some(key);
                self.scope_secrets.hold(key);
            }
        }
        self.respond(new, id, Ok(Success::Attached));
    }

    fn serve_stdio(&mut self, client: ClientId, id: String, op: Op) {
        if self.config.stdio == StdioRole::Reject {
            let msg = "handles 0..2 are stdio, served by the parent-side mux";
            self.respond(client, Some(id), Err(Failure::new(ErrorCode::Perm, msg)));
            return;
        }
        let pending = |id| Pending { client, req: Some(id), waiting: Waiting::Stdio };
        match op {
            Op::Close { .. } => self.respond(client, Some(id), Ok(Success::Closed)),
            Op::Read { h, max } if h.get() == 0 => self.effect(pending(id), Effect::ReadStdin { max }),
            Op::Write { h, data } if h.get() != 0 => {
                let stream = if h.get() == 1 { StdStream::Stdout } else { StdStream::Stderr };
                self.effect(pending(id), Effect::WriteStdio { stream, data });
            }
            _ => {
                let msg = "stdin is read-only; stdout and stderr are write-only";
                self.respond(client, Some(id), Err(Failure::new(ErrorCode::Perm, msg)));
            }
        }
    }

    fn open(
        &mut self,
        client: ClientId,
        id: &str,
        path: &str,
        mode: Mode,
        scope: Option<Scope>,
    ) -> Result<Option<Success>, Failure> {
        let resolved = self.config.policy.resolve(path, mode.writable()).map_err(denied_failure)?;
        if self.table.len() + self.opening >= self.config.max_open_handles {
            return Err(Failure::new(
                ErrorCode::Range,
                format!("too many open handles (limit {})", self.config.max_open_handles),
            ));
        }
        // What the client (a nested level) and the request narrowed to.
        let request_scoped = scope.is_some();
        let narrowing = match (self.clients.get(&client).and_then(|c| c.scope.clone()), scope) {
            (Some(a), Some(b)) => Some(a.intersect(&b)),
            (a, b) => a.or(b),
        };
        let req = Some(id.to_owned());
        let bug = self.config.planted_bug;
        let (root, rel) = match resolved {
            Resolved::Virtual { name }
                if self.config.upstream && bug == Some(PlantedBug::ForwardVirtualUpstream) =>
            {
                if !self.upstream_alive {
                    return Err(Failure::new(ErrorCode::Io, "upstream closed"));
                }
                let op = Op::Open { path: name, mode, scope: None };
                self.forward(client, req, Waiting::UpstreamOpen { mode }, op);
                return Ok(None);
            }
            // A level's virtual namespace is its own: a relative name under
            // none of its roots never reaches a level above.
            Resolved::Virtual { name } => {
                self.virtual_open_check(&name, mode)?;
                let node = self.virt.open(&name, mode)?;
                if let Some(a) = &mut self.audit {
                    a.opened_virtual(client, id);
                }
                if mode.writable() && !self.virtual_noticed {
                    self.virtual_noticed = true;
                    self.virtual_notice = Some(notice_name(&name));
                }
                let handle =
                    self.table.insert(client, Slot { mode, target: Target::Virtual { node, pos: 0 } });
                self.stats.handles_opened += 1;
                return Ok(Some(Success::Opened { handle }));
            }
            Resolved::Host { root, rel } => (root, rel),
        };
        let Some(r) = self.config.policy.root(root) else {
            return Err(Failure::new(ErrorCode::Io, "unknown root"));
        };
        let effective = self.clients.get(&client).and_then(|c| c.effective.clone());
        let abs = r.path.join(&rel);
        narrowed_permit(narrowing.as_ref(), &abs, mode.writable())?;
        if self.config.upstream {
            if !self.upstream_alive {
                return Err(Failure::new(ErrorCode::Io, "upstream closed"));
            }
            let path = abs.to_string_lossy().into_owned();
            let scope = narrowing.filter(|_| bug != Some(PlantedBug::NestedSkipsNarrow));
            self.forward(client, req, Waiting::UpstreamOpen { mode }, Op::Open { path, mode, scope });
            return Ok(None);
        }
        let scope = self.host_scope(root, &rel, narrowing.as_ref(), effective, request_scoped);
        if self.descriptors_held() + 1 + bounds::PROVIDER_DESCRIPTOR_RESERVE > self.config.max_descriptors {
            self.stats.bounds_refused += 1;
            return Err(Failure::new(
                ErrorCode::Range,
                format!(
                    "too many descriptors in use to open a file (--max-descriptors {})",
                    self.config.max_descriptors
                ),
            ));
        }
        let file = FileId(self.next_file);
        self.next_file += 1;
        self.effect(
            Pending { client, req, waiting: Waiting::Open { file, mode } },
            Effect::Open { file, root, rel, mode, scope, how: None },
        );
        Ok(None)
    }

    /// The scope a host open at this level is decided under, on the
    /// resolved file: this level's own policy, intersected with what the
    /// client (a nested level) and the request narrowed to.
    fn host_scope(
        &self,
        root: RootId,
        rel: &std::path::Path,
        narrowing: Option<&Scope>,
        effective: Option<Scope>,
        request_scoped: bool,
    ) -> Scope {
        let bug = self.config.planted_bug;
        let own = match (bug, self.config.policy.root(root)) {
            (Some(PlantedBug::LexicalReadOnly), Some(r)) => {
                Scope::from_roots(&[crate::policy::Root { path: r.path.clone(), access: r.access }])
            }
            (Some(PlantedBug::LexicalFileRoot), _) if rel.as_os_str().is_empty() => Scope::everything(),
            _ => self.own_scope.clone(),
        };
        match (narrowing, effective, request_scoped) {
            // The usual case: no request scope, and the client's
            // intersection with this level was computed at its `narrow`.
            (Some(_), Some(eff), false) if bug.is_none() => eff,
            (Some(n), _, _) if bug == Some(PlantedBug::GuardNestedReplaces) => {
                own.intersect(n).with_guard(n.guard().clone())
            }
            (Some(n), _, _) => own.intersect(n),
            (None, _, _) => own,
        }
    }

    fn read(&mut self, client: ClientId, id: &str, h: Handle, max: u32) -> Result<Option<Success>, Failure> {
        let slot = self.table.get_mut(client, h).map_err(|m| missing_failure(h, m))?;
        if !slot.mode.readable() {
            return Err(Failure::new(ErrorCode::Perm, format!("handle {h} was not opened for reading")));
        }
        let req = Some(id.to_owned());
        match &mut slot.target {
            Target::Virtual { node, pos } => {
                let data = self.virt.read(*node, pos, max);
                let eof = data.is_empty();
                Ok(Some(Success::Data { data, eof }))
            }
            Target::Host(file) => {
                let file = *file;
                self.start_read(client, file, h, read_batch::Batched { id: id.to_owned(), max, held: 0 });
                Ok(None)
            }
            Target::Upstream(up) => {
                let up = *up;
                if !self.upstream_alive {
                    return Err(Failure::new(ErrorCode::Io, "upstream closed"));
                }
                self.forward(client, req, Waiting::UpstreamRead { max }, Op::Read { h: up, max });
                Ok(None)
            }
        }
    }

    fn write(
        &mut self,
        client: ClientId,
        id: &str,
        h: Handle,
        data: Vec<u8>,
    ) -> Result<Option<Success>, Failure> {
        let slot = self.table.get_mut(client, h).map_err(|m| missing_failure(h, m))?;
        if !slot.mode.writable() {
            return Err(Failure::new(ErrorCode::Perm, format!("handle {h} was not opened for writing")));
        }
        let append = slot.mode == Mode::Append;
        let req = Some(id.to_owned());
        match &mut slot.target {
            Target::Virtual { node, pos } => {
                let written = self.virt.write(*node, pos, append, &data)?;
                Ok(Some(Success::Written { written }))
            }
            Target::Host(file) => {
                let file = *file;
                self.effect(Pending { client, req, waiting: Waiting::Write }, Effect::Write { file, data });
                Ok(None)
            }
            Target::Upstream(up) => {
                let up = *up;
                if !self.upstream_alive {
                    return Err(Failure::new(ErrorCode::Io, "upstream closed"));
                }
                self.forward(client, req, Waiting::Write, Op::Write { h: up, data });
                Ok(None)
            }
        }
    }

    fn close(&mut self, client: ClientId, id: &str, h: Handle) -> Result<Option<Success>, Failure> {
        let slot = self.table.remove(client, h).map_err(|m| missing_failure(h, m))?;
        self.stats.handles_closed += 1;
        let req = Some(id.to_owned());
        match slot.target {
            Target::Virtual { node, .. } => {
                self.virt.release(node);
                Ok(Some(Success::Closed))
            }
            Target::Host(file) => {
                self.effect(Pending { client, req, waiting: Waiting::Close }, Effect::Close { file });
                Ok(None)
            }
            Target::Upstream(up) => {
                if !self.upstream_alive {
                    // The upstream closed everything when its pipe closed.
                    return Ok(Some(Success::Closed));
                }
                self.forward(client, req, Waiting::Close, Op::Close { h: up });
                Ok(None)
            }
        }
    }

    fn on_effect_done(&mut self, id: EffectId, result: EffectResult) {
        let Some(Pending { client, req, waiting }) = self.pending.remove(&id) else { return };
        if let Waiting::Fuse(wait) = waiting {
            return self.fuse_effect_done(client, wait, result);
        }
        if let Waiting::Pager { job } = waiting {
            return self.pager_effect_done(client, job, result);
        }
        if let Waiting::ReadBatch { file, reads } = waiting {
            return self.read_batch_done(client, file, reads, result);
        }
        if let Waiting::Path = waiting {
            return self.path_effect_done(client, req, result);
        }
        if let Waiting::ScopeSecret { scope } = waiting {
            let outcome = self.scope_secret_drawn(client, *scope, result);
            if let Some(c) = self.clients.get_mut(&client) {
                c.busy = false;
            }
            if self.clients.get(&client).is_some_and(|c| c.alive) {
                self.respond(client, req, outcome);
                self.pump(client);
            } else {
                self.cleanup(client);
            }
            return;
        }
        if matches!(waiting, Waiting::Open { .. }) {
            self.opening -= 1;
        }
        // The shell's descriptor for a file is gone once a close completes
        // (whatever it reports) or an open fails.
        let released = match (&waiting, &result) {
            (Waiting::Close | Waiting::Cleanup, _) => true,
            (Waiting::Open { .. }, r) => !matches!(r, EffectResult::Opened),
            _ => false,
        };
        if released {
            self.host_fds = self.host_fds.saturating_sub(1);
        }
        let alive = self.clients.get(&client).is_some_and(|c| c.alive);
        let outcome = match (waiting, result) {
            (Waiting::Open { file, mode }, EffectResult::Opened) => {
                if alive {
                    let handle = self.table.insert(client, Slot { mode, target: Target::Host(file) });
                    self.stats.handles_opened += 1;
                    Ok(Success::Opened { handle })
                } else {
                    // Opened for a client that has left: close it at once.
                    let cleanup = Pending { client, req: None, waiting: Waiting::Cleanup };
                    self.effect(cleanup, Effect::Close { file });
                    Err(Failure::new(ErrorCode::Io, "client left"))
                }
            }
            (Waiting::Read | Waiting::Stdio, EffectResult::Data { data, eof }) => {
                Ok(Success::Data { data, eof })
            }
            (Waiting::Write | Waiting::Stdio, EffectResult::Written { written }) => {
                Ok(Success::Written { written })
            }
            (Waiting::Close, EffectResult::Closed) => Ok(Success::Closed),
            (Waiting::Cleanup, _) => return,
            (_, EffectResult::Failed { kind, message }) => Err(fs_failure(kind, message)),
            (_, other) => Err(unexpected(&other)),
        };
        if req.is_none() {
            return;
        }
        self.settle(client, req, outcome, alive);
    }

    /// A file or path effect's request is answered: the client is free
    /// again, and answered if it is still there, cleaned up if not.
    fn settle(
        &mut self,
        client: ClientId,
        req: Option<String>,
        outcome: Result<Success, Failure>,
        alive: bool,
    ) {
        if let Some(c) = self.clients.get_mut(&client) {
            c.busy = false;
            c.busy_on_file = false;
        }
        if alive {
            self.respond(client, req, outcome);
            self.pump(client);
        } else {
            self.cleanup(client);
        }
    }

    /// The walk of effect `id` met a guarded path: counted, and audited
    /// for the client the effect is for.
    fn guarded(&mut self, id: EffectId, hit: crate::guard::Hit) {
        let known =
            self.stats.guarded.len() < MAX_GUARDED_PATHS || self.stats.guarded.contains_key(&hit.path);
        if known {
            let entry = self.stats.guarded.entry(hit.path.clone()).or_insert(GuardedPath {
                rule: hit.rule,
                class: hit.class,
                refused: 0,
                granted: 0,
            });
            if hit.granted {
                entry.granted += 1;
            } else {
                entry.refused += 1;
            }
        } else {
            self.stats.guarded_unlisted += 1;
        }
        if self.audit.is_some() {
            let client = self.pending.get(&id).map_or(ClientId(0), |p| p.client);
            self.outputs.push_back(Output::Audit { record: audit::AuditRecord::guarded(client, &hit) });
        }
    }

    /// The client closed its end or died: stop serving it, and once no
    /// effect on its files is under way, close everything it holds.
    fn depart(&mut self, client: ClientId) {
        // A read already served goes to the host before the client's
        // files are closed behind it.
        self.flush_reads();
        let Some(c) = self.clients.get_mut(&client) else { return };
        if !c.alive {
            return;
        }
        c.alive = false;
        c.read_ahead = Vec::new();
        self.queued_total -= c.queued_bytes;
        self.buffered_total -= c.decoder.buffered() as u64;
        c.queued_bytes = 0;
        c.batched = 0;
        c.queue.clear();
        c.decoder = FrameDecoder::new(0);
        self.outputs.push_back(Output::Close { client });
        if let Some(a) = &mut self.audit {
            a.departed(client);
        }
        self.broker_owner_gone(client);
        self.fd_owner_gone(client);
        self.cleanup(client);
    }

    /// A departed client's broker requests: its waiting calls leave the
    /// queue, its running one is not answered; forwarded calls are
    /// cancelled upstream, since the top cannot tell which of this
    /// machine's calls belonged to it.
    fn broker_owner_gone(&mut self, client: ClientId) {
        self.calls.retain(|_, (c, _)| *c != client);
        if self.broker.is_some() {
            self.feed_broker(BrokerInput::OwnerGone { owner: client });
        }
        self.up_tokens.retain(|_, (_, owner)| *owner != client);
        self.scopes.remove(&client);
        let mut cancels = Vec::new();
        for p in self.upstream_pending.values_mut() {
            if p.client != client || p.waiting.holds_client() || p.req.is_none() {
                continue;
            }
            // Nobody to answer now; the response is dropped on arrival.
            p.req = None;
            if let Waiting::UpstreamLlm { up_token, .. } = &p.waiting {
                cancels.push(up_token.clone());
            }
        }
        if !self.upstream_alive {
            return;
        }
        for up in cancels {
            let mut params = serde_json::Map::new();
            params.insert("cancel_token".into(), up.into());
            self.forward(client, None, Waiting::Cleanup, Op::Cancel { params });
        }
    }

    fn cleanup(&mut self, client: ClientId) {
        let Some(c) = self.clients.get(&client) else { return };
        if c.alive || (c.busy && c.busy_on_file) {
            return;
        }
        for (_, slot) in self.drain_for_cleanup(client) {
            self.stats.handles_closed += 1;
            self.stats.handles_cleaned_up += 1;
            match slot.target {
                Target::Virtual { node, .. } => self.virt.release(node),
                Target::Host(file) => {
                    self.effect(
                        Pending { client, req: None, waiting: Waiting::Cleanup },
                        Effect::Close { file },
                    );
                }
                Target::Upstream(up) => {
                    if self.upstream_alive {
                        self.forward(client, None, Waiting::Cleanup, Op::Close { h: up });
                    }
                }
            }
        }
        // Its narrowed scope's secret stops working with the last client
        // under that scope.
        if let Some(key) = self.clients.remove(&client).and_then(|c| c.key) {
            self.scope_secrets.release(key);
        }
    }

    fn drain_for_cleanup(&mut self, client: ClientId) -> Vec<(Handle, Slot)> {
        let mut drained = self.table.drain_owner(client);
        if self.config.planted_bug == Some(PlantedBug::CleanupForgetsLastHandle) {
            if let Some((_, slot)) = drained.pop() {
                // Re-filed under a fresh number: the client's handle stays
                // in the table for good, which is the leak being planted.
                self.table.insert(client, slot);
            }
        }
        drained
    }

    fn on_upstream_bytes(&mut self, data: &[u8]) {
        if !self.upstream_alive {
            return;
        }
        self.upstream_decoder.push(data);
        loop {
            match self.upstream_decoder.next_frame() {
                Ok(Some(payload)) => self.on_upstream_frame(payload),
                Ok(None) => return,
                Err(FrameError::Skipped { len, max, head }) => {
                    // One oversized answer fails the one request it
                    // answered; the link goes on.
                    self.stats.upstream_oversized += 1;
                    let pending =
                        bounds::id_from_head(&head).and_then(|id| self.upstream_pending.remove(&id));
                    let Some(pending) = pending else {
                        self.stats.upstream_errors += 1;
                        continue;
                    };
                    let msg = format!(
                        "the upstream answer of {len} bytes exceeds {max} bytes (--max-upstream-frame) \
                         and was dropped"
                    );
                    self.on_upstream_answer(pending, Err(Failure::new(ErrorCode::Range, msg)));
                }
                Err(e) => {
                    self.stats.upstream_errors += 1;
                    self.upstream_lost(&format!("upstream sent a bad frame: {e}"));
                    return;
                }
            }
        }
    }

    fn on_upstream_frame(&mut self, payload: Vec<u8>) {
        // The hot answer, a forwarded read's: read in one pass, its id
        // included, and its data passed on as the base64 text it came in,
        // not decoded here and encoded again. Anything else, or a read
        // answer with more data than was asked for, takes the general
        // path below, which decides it.
        if let Some(read) = wire::ReadAnswer::parse(&payload) {
            let max = read.id().and_then(|id| match self.upstream_pending.get(id) {
                Some(Pending { waiting: Waiting::UpstreamRead { max }, .. }) => Some(*max),
                _ => None,
            });
            let pending = max
                .filter(|&max| read.within(max))
                .and_then(|_| read.id().and_then(|id| self.upstream_pending.remove(id)));
            if let Some(pending) = pending {
                return self.on_upstream_answer(pending, read.into_response(payload).outcome);
            }
        }
        #[derive(Deserialize)]
        struct IdOnly {
            id: Option<String>,
        }
        let id = serde_json::from_slice::<IdOnly>(&payload).ok().and_then(|r| r.id);
        let Some(pending) = id.and_then(|id| self.upstream_pending.remove(&id)) else {
            self.stats.upstream_errors += 1;
            return;
        };
        let mut max_read = self.config.limits.max_read;
        let kind = match pending.waiting {
            Waiting::UpstreamOpen { .. } => OpKind::Open,
            Waiting::UpstreamRead { max } => {
                max_read = max;
                OpKind::Read
            }
            Waiting::Read | Waiting::ReadBatch { .. } => OpKind::Read,
            Waiting::Write => OpKind::Write,
            Waiting::Close | Waiting::Cleanup => OpKind::Close,
            Waiting::Open { .. }
            | Waiting::Stdio
            | Waiting::UpstreamLlm { .. }
            | Waiting::UpstreamBroker
            | Waiting::Narrow
            | Waiting::ScopeSecret { .. }
            | Waiting::Pager { .. }
            | Waiting::UpstreamFd(_)
            | Waiting::Path
            | Waiting::UpstreamPath
            | Waiting::Fuse(_) => OpKind::Other,
        };
        let outcome = match wire::parse_upstream_response(payload, kind, max_read) {
            Ok(r) => r.outcome,
            Err(e) => {
                self.stats.upstream_errors += 1;
                Err(Failure::new(ErrorCode::Io, format!("bad upstream response: {e}")))
            }
        };
        self.on_upstream_answer(pending, outcome);
    }

    /// The upstream answered `pending` with `outcome`.
    fn on_upstream_answer(&mut self, pending: Pending, outcome: Result<Success, Failure>) {
        let Pending { client, req, waiting } = pending;
        let alive = self.clients.get(&client).is_some_and(|c| c.alive);
        let outcome = match (waiting, outcome) {
            (Waiting::Cleanup, _) => return,
            (Waiting::Narrow, outcome) => return self.upstream_narrowed(outcome),
            (Waiting::UpstreamLlm { token, .. }, outcome) => {
                // The call is over at the top: its token is free again.
                if let Some(t) = token.filter(|_| req.is_some()) {
                    let scope = self.scope(client);
                    self.up_tokens.remove(&(scope, t));
                }
                return self.finish_upstream(client, req, false, outcome);
            }
            (Waiting::UpstreamBroker, outcome) => return self.finish_upstream(client, req, false, outcome),
            (Waiting::UpstreamFd(f), outcome) => return self.upstream_fd_done(client, req, f, outcome),
            (Waiting::UpstreamOpen { mode }, Ok(Success::Opened { handle: up })) => {
                if alive {
                    let handle = self.table.insert(client, Slot { mode, target: Target::Upstream(up) });
                    self.stats.handles_opened += 1;
                    Ok(Success::Opened { handle })
                } else {
                    self.forward(client, None, Waiting::Cleanup, Op::Close { h: up });
                    return;
                }
            }
            (_, outcome) => outcome,
        };
        self.finish_upstream(client, req, true, outcome);
    }

    /// Answer a forwarded request; `held`: it was the one the client was
    /// busy with.
    fn finish_upstream(
        &mut self,
        client: ClientId,
        req: Option<String>,
        held: bool,
        outcome: Result<Success, Failure>,
    ) {
        if req.is_none() {
            return;
        }
        if let Some(c) = self.clients.get_mut(&client).filter(|_| held) {
            c.busy = false;
        }
        self.respond(client, req, outcome);
        self.pump(client);
    }

    fn upstream_lost(&mut self, why: &str) {
        if !self.upstream_alive {
            return;
        }
        self.upstream_alive = false;
        self.upstream_decoder = FrameDecoder::new(0);
        self.up_tokens.clear();
        for (_, Pending { client, req, waiting }) in std::mem::take(&mut self.upstream_pending) {
            let held = waiting.holds_client();
            self.finish_upstream(client, req, held, Err(Failure::new(ErrorCode::Io, why)));
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_paths;

/// Bytes of a virtual file's name kept for the notice.
const NOTICE_NAME_BYTES: usize = 256;

/// `name`, cut to [`NOTICE_NAME_BYTES`] on a character boundary.
fn notice_name(name: &str) -> String {
    let mut end = name.len().min(NOTICE_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    if end < name.len() {
        format!("{}…", &name[..end])
    } else {
        name.to_owned()
    }
}
