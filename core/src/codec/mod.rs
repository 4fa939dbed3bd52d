//! Wire codecs shared by the machines.

pub mod frame;
pub mod json_text;
pub mod jsonrpc;
pub mod plain;
pub mod values;
