//! Wire codecs shared by the machines.

pub mod frame;
pub mod jsonrpc;
pub mod plain;
