//! A VFS tool written with the `airlock-tool` SDK: it prepends a comment to
//! `src/main.rs` through the host. Run it under airlock:
//!
//! ```text
//! cargo build -p airlock-tool --example vfs_tool
//! airlock tool --allow-rw . -- target/debug/examples/vfs_tool
//! ```

use airlock_tool::{ContentBlock, VfsHost};

fn main() {
    if let Err(e) = run() {
        eprintln!("vfs_tool: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), airlock_tool::Error> {
    let mut host = VfsHost::connect()?;
    let path = "src/main.rs";
    let content = match host.read_text(path) {
        Ok(c) => c,
        Err(e) => return host.error(&format!("cannot read {path}: {e}"), false),
    };
    host.write(path, format!("// edited by vfs_tool\n{content}").as_bytes())?;
    host.result(vec![ContentBlock::text(format!("Modified {path}"))])
}
