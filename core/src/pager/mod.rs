//! The file-descriptor pager (seed 003), sans-I/O: large content becomes
//! `fd:N` with a preview, read back by page, whole or by line range,
//! searched, or exported to a file.
//!
//! - [`store`]: one fd's content and its line and page indexes, built in
//!   one linear pass as bytes stream in;
//! - [`xml`]: escaping and rendering, in parts that each fit a frame;
//! - [`search`]: literal search by line, with simple case folding;
//! - [`wire`]: the `FD_*` ops' params;
//! - [`machine`]: the session's fd table, streamed wraps, and the file
//!   jobs it runs through the embedder's file operations (the FS proxy's
//!   policy and effects).

pub mod check;
pub mod error;
/// The fuzz target's entry point: for the fuzz crate and the core's tests.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod machine;
pub mod search;
pub mod store;
pub mod wire;
pub mod xml;

pub use error::{FdError, FdErrorKind};
pub use machine::{Access, FileOp, FileResult, JobId, Pager, PagerInput, PagerOutput};

use serde::{Deserialize, Serialize};

/// The seed's `max_direct_output_chars`: content above it becomes an fd.
pub const DEFAULT_MAX_DIRECT_OUTPUT_CHARS: u64 = 8000;
/// The seed's `default_page_size`, in characters.
pub const DEFAULT_PAGE_SIZE: u64 = 4000;
/// The seed's `max_input_chars`: the threshold for user input.
pub const DEFAULT_MAX_INPUT_CHARS: u64 = 8000;
/// Bytes the session's fds (content and indexes) may hold in all: 1 GiB.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;

/// `[file_descriptor]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagerConfig {
    pub max_direct_output_chars: u64,
    pub default_page_size: u64,
    pub max_input_chars: u64,
    pub page_user_input: bool,
    pub max_total_bytes: u64,
}

impl Default for PagerConfig {
    fn default() -> Self {
        PagerConfig {
            max_direct_output_chars: DEFAULT_MAX_DIRECT_OUTPUT_CHARS,
            default_page_size: DEFAULT_PAGE_SIZE,
            max_input_chars: DEFAULT_MAX_INPUT_CHARS,
            page_user_input: true,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
        }
    }
}

impl PagerConfig {
    /// Check the sizes against each other and against the largest frame
    /// (content at or under a threshold is answered whole, in one frame).
    /// `Ok` carries warnings.
    pub fn validate(&self, max_frame: usize) -> Result<Vec<String>, String> {
        for (key, v) in [
            ("max_direct_output_chars", self.max_direct_output_chars),
            ("default_page_size", self.default_page_size),
            ("max_input_chars", self.max_input_chars),
            ("max_total_bytes", self.max_total_bytes),
        ] {
            if v == 0 {
                return Err(format!("file_descriptor.{key} = 0: want a positive number"));
            }
        }
        for (key, v) in [
            ("max_direct_output_chars", self.max_direct_output_chars),
            ("max_input_chars", self.max_input_chars),
        ] {
            // Up to 4 bytes a character, then base64 on the wire.
            let frame = v.saturating_mul(4).div_ceil(3).saturating_mul(4).saturating_add(1024);
            if frame > max_frame as u64 {
                return Err(format!(
                    "file_descriptor.{key} = {v}: content that size needs frames of {frame} bytes, over --max-frame {max_frame}"
                ));
            }
        }
        let mut warnings = Vec::new();
        if self.default_page_size > self.max_direct_output_chars {
            warnings.push(format!(
                "file_descriptor.default_page_size ({}) is above max_direct_output_chars ({}): the seed advises a threshold 1.5-2x the page size",
                self.default_page_size, self.max_direct_output_chars
            ));
        }
        Ok(warnings)
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_machine;
#[cfg(test)]
mod tests_parts;
#[cfg(test)]
mod tests_wire;
