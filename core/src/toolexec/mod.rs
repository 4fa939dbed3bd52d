//! ToolExec (seed 001): a sandboxed agent runs allow-listed host tools over
//! HTTP, sans-I/O.
//!
//! One [`Exchange`] per HTTP request makes every decision; the shell (hyper
//! in production, the simulator in tests) moves bytes and processes. A
//! [`Gate`] per server holds the connection cap.
//!
//! # One exchange, step by step
//!
//! 1. The shell feeds [`Input::Head`]. The machine checks, in this order:
//!    404 path ≠ `/exec`, 405 method ≠ `POST`, 401 token (single
//!    `Authorization` header, last whitespace/`=`-separated piece,
//!    constant-time compare), 426 `X-Aifo-Proto` ∉ {1, 2}, 413
//!    `Content-Length` over [`Config::max_body`]. A failure yields
//!    [`Output::Respond`] then [`Output::Done`]; otherwise
//!    [`Output::ReadBody`]: only now may the shell read the body.
//! 2. [`Input::Body`] chunks (413 as soon as their sum passes `max_body`,
//!    never truncating; 408 if the body is not complete within
//!    [`Config::header_timeout`] of the head), then [`Input::BodyEnd`]: the form is decoded
//!    ([`decode_form`]): 400 bad form / `tool` missing or repeated / `cwd`
//!    repeated or outside the working directory, then 403 tool not
//!    allowed. Then [`Output::Spawn`].
//! 3. [`Input::Spawned`]: `Err` answers 400 (`cwd` escapes by a symlink),
//!    409 (not installed) or 500 (other failure). `Ok` starts the run: the
//!    timeout counts from here.
//! 4. Output: the machine hands out read credit, one read at a time
//!    ([`Output::ReadOutput`]); the shell reads at most `max` bytes from the
//!    tool's pipe and reports [`Input::ToolOutput`] or [`Input::ToolEof`].
//!    - Streaming (v2 with `TE: trailers`): the head goes out at the first
//!      output or at exit ([`Output::SendHead`]), every read at once
//!      ([`Output::SendChunk`]). Credit is given only while fewer than
//!      [`Config::stream_window`] bytes wait for the client; the shell
//!      reports bytes the client took with [`Input::ClientTook`].
//!    - Buffered (v1, or v2 without `TE: trailers`): the output is kept;
//!      past [`Config::max_buffered`] the tool is killed and 507 answered.
//! 5. [`Input::ToolExited`] kills the tool's process group
//!    ([`Output::Signal`] `Kill`: leftovers die, the pipe closes). Once the
//!    tool has exited and its pipe is at EOF (or [`Config::kill_grace`]
//!    after exit, if an escaped grandchild keeps the pipe open: then
//!    [`Output::ReadNow`] reads what the pipe holds without waiting, up to
//!    [`Config::final_drain`] bytes), the answer ends: v1 `Respond` 200 with `X-Exit-Code`; v2 [`Output::Finish`] with
//!    the exit code for the trailer. Then `Done`.
//!
//! Timeout ([`Config::timeout`] from spawn): `Signal(Term)` to the group,
//! `Signal(Kill)` [`Config::kill_grace`] later. If nothing was sent yet the
//! answer is 504 with `X-Exit-Code: 124` and the output so far; when
//! streaming, the line `toolexec: timed out after N s` and trailer 124.
//!
//! Client gone ([`Input::ClientGone`]: EOF or failed write, at any stage):
//! the same kill at once; output is still drained (and dropped) so the tool
//! never blocks on its pipe; `Done` without an answer.
//!
//! Shutdown ([`Input::Shutdown`]): a request still arriving gets 503; a
//! running tool is stopped like on a timeout and its answer ends with the
//! exit code its death gives.
//!
//! Exit codes: the tool's, 128+N for signal N, 124 on timeout; every error
//! answer carries `X-Exit-Code: 86`.
//!
//! Timers: [`Exchange::poll_timeout`] gives the next deadline; the shell
//! calls [`Exchange::handle_timeout`] at (or after) it. Deadlines are
//! inclusive. Time never runs backward: an earlier `now` counts as the
//! latest seen.

mod auth;
mod config;
mod form;
mod gate;
mod machine;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_phases;

pub use auth::{token_from_authorization, token_matches, validate_token, Token, TokenError};
pub use config::*;
pub use form::{decode_form, ExecForm, FormError};
pub use gate::{Gate, HEAP_PER_EXCHANGE, HEAP_SLACK};
pub use machine::{
    Exchange, ExitStatus, Input, Mode, Output, RequestHead, Response, Signal, SpawnError, SpawnRequest,
};
