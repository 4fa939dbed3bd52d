//! A benchmark's driver process (a Python child, on the host or under
//! `airlock run`) that reads one command a line and answers one JSON line:
//! its first line says it is ready; it ends at the end of its input.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    /// Start `cmd` with the PATH people have had for years and no airlock
    /// descriptor of the caller's; returns it and its ready line.
    pub fn start(mut cmd: Command) -> (Driver, serde_json::Value) {
        let mut child = cmd
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env_remove("AIRLOCK_FD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the driver starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut d = Driver { child, stdin, stdout };
        let ready = d.answer();
        (d, ready)
    }

    /// Send `line`, and read the answer.
    pub fn ask(&mut self, line: &str) -> serde_json::Value {
        let stdin = self.stdin.as_mut().expect("open");
        writeln!(stdin, "{line}").expect("the driver reads");
        stdin.flush().expect("the driver reads");
        self.answer()
    }

    fn answer(&mut self) -> serde_json::Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the driver's answer");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("driver said {line:?}: {e}"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The driver ends at the end of its input (and airlock with it).
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
