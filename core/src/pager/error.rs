//! The pager's errors: the seed's `fd_error` types, each with the
//! protocol code its response carries.

use super::xml::{attr, text};
use crate::fsproxy::wire::ErrorCode;
use std::fmt::Write as _;

/// Longest echo of a peer's string (an fd name) in an error.
pub const MAX_ECHO: usize = 256;

/// `fd_error`'s `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdErrorKind {
    /// No such fd (seed).
    NotFound,
    /// A page outside `1..=pages` (seed).
    InvalidPage,
    /// A line range outside `1 <= A <= B <= total_lines`.
    InvalidRange,
    /// The file policy refused a path, or an I/O error (seed).
    FileOperation,
    /// The session's fds would hold more than `max_total_bytes`.
    Limit,
    /// Parameters that do not make sense together, or are malformed.
    InvalidArgument,
}

impl FdErrorKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            FdErrorKind::NotFound => "not_found",
            FdErrorKind::InvalidPage => "invalid_page",
            FdErrorKind::InvalidRange => "invalid_range",
            FdErrorKind::FileOperation => "file_operation",
            FdErrorKind::Limit => "limit",
            FdErrorKind::InvalidArgument => "invalid_argument",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdError {
    pub kind: FdErrorKind,
    /// The fd as the request named it.
    pub fd: Option<String>,
    pub message: String,
    /// `Operation: …, Path: …` for file operations.
    pub details: Option<String>,
    pub code: ErrorCode,
}

/// Cut a peer's string for echoing, on a character boundary.
pub fn echo(s: &str) -> String {
    if s.len() <= MAX_ECHO {
        return s.to_owned();
    }
    let mut end = MAX_ECHO;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl FdError {
    pub fn new(kind: FdErrorKind, fd: Option<&str>, message: impl Into<String>) -> Self {
        let code = match kind {
            FdErrorKind::NotFound => ErrorCode::NoEnt,
            FdErrorKind::InvalidPage | FdErrorKind::InvalidRange | FdErrorKind::Limit => ErrorCode::Range,
            FdErrorKind::FileOperation => ErrorCode::Io,
            FdErrorKind::InvalidArgument => ErrorCode::Arg,
        };
        FdError { kind, fd: fd.map(echo), message: message.into(), details: None, code }
    }

    pub fn not_found(fd: &str) -> Self {
        let fd = echo(fd);
        FdError::new(FdErrorKind::NotFound, Some(&fd), format!("File descriptor {fd} not found"))
    }

    pub fn arg(fd: Option<&str>, message: impl Into<String>) -> Self {
        FdError::new(FdErrorKind::InvalidArgument, fd, message)
    }

    /// A refused path or failed I/O while doing `operation` on `path`.
    pub fn file(fd: Option<&str>, operation: &str, path: &str, why: &str, denied: bool) -> Self {
        let verb = if operation == "read" { "read from" } else { "write to" };
        let mut e = FdError::new(FdErrorKind::FileOperation, fd, format!("Cannot {verb} file: {why}"));
        e.details = Some(format!("Operation: {operation}, Path: {}", echo(path)));
        if denied {
            e.code = ErrorCode::Perm;
        }
        e
    }

    pub fn to_xml(&self) -> String {
        let mut x = format!("<fd_error type=\"{}\"", self.kind.as_str());
        if let Some(fd) = &self.fd {
            let _ = write!(x, " fd=\"{}\"", attr(fd));
        }
        let _ = write!(x, ">\n  <message>{}</message>\n", text(&self.message));
        if let Some(d) = &self.details {
            let _ = writeln!(x, "  <details>{}</details>", text(d));
        }
        x.push_str("</fd_error>");
        x
    }
}
