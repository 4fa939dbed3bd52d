//! The airlock production shell: real pipes, processes, files and sockets
//! around the sans-I/O machines of `airlock-core`.
//!
//! The library half exists so that the simulator can run the shell's own
//! async loop over turmoil, and so that programs can embed the FS client.

pub mod audit;
pub mod child;
pub mod client;
pub mod commands;
pub mod config;
pub mod confine;
pub mod egress;
pub mod envpolicy;
pub mod fdcli;
pub mod fdconfig;
pub mod fscli;
pub mod guardscan;
pub mod heap;
pub mod holds;
pub mod hostfs;
pub mod llm_cli;
pub mod narrowcli;
pub mod outfile;
pub mod provider;
pub mod proxy;
pub mod record;
pub mod report;
pub mod secrets;
pub mod served;
pub mod session;
pub mod session_socket;
pub mod simulate;
pub mod stdin;
pub mod telemetry;
pub mod tool;
pub mod toolexec;
