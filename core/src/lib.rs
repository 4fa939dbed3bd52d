//! airlock-core: every protocol machine of airlock, sans-I/O.
//!
//! Nothing in this crate reads a clock, touches a file or socket, spawns a
//! thread or draws a random number. Machines take time and I/O results as
//! inputs (`handle(now, input)`) and hand effects back as outputs
//! (`poll_output()`), so the production shell and the simulator drive the
//! very same code.

pub mod broker;
pub mod codec;
pub mod egress;
pub mod environ;
pub mod fsproxy;
pub mod fuse;
/// Test and fuzz harness code: in the crate's own tests, and behind the
/// `fuzzing` feature for its integration tests and the fuzz targets.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod guard;
pub mod handles;
/// A counting global allocator for the harnesses (never the binary's).
#[cfg(any(test, feature = "heapcount"))]
pub mod heapcount;
pub mod pager;
pub mod pathops;
pub mod policy;
pub mod resolve;
pub mod sandbox;
pub mod scope;
pub mod scrub;
pub mod time;
pub mod toolexec;
pub mod trace;
pub mod vfs;

mod b64;
mod ospath;
