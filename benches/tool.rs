//! `fs.read` round trips through the real `airlock tool` binary against
//! reading the same file directly, in the same run.
//!
//! The tool is two `cat`s relaying bytes between FIFOs the bench holds and
//! airlock's pipes, so the bench speaks the protocol itself: each
//! iteration writes one request line and reads one response line. What is
//! measured is airlock's whole path per request (read and parse the line,
//! policy, resolve, open and read through cap-std, base64 or escape,
//! scrub, write) plus two pipe hops, against `std::fs::read`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

struct Session {
    child: Child,
    req: Option<File>,
    resp: BufReader<File>,
    next_id: u64,
    line: String,
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().expect("utf-8 temp path")).expect("no NUL");
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

impl Session {
    fn start(project: &Path, fifos: &Path) -> Session {
        let req = fifos.join("req");
        let resp = fifos.join("resp");
        mkfifo(&req);
        mkfifo(&resp);
        let relay = format!("cat {} & exec cat > {}", req.display(), resp.display());
        let child = Command::new(env!("CARGO_BIN_EXE_airlock"))
            .current_dir(project)
            // The relay's fifos lie outside the project: the confined tool
            // reaches them only where it is granted them.
            .args(["tool", "--timeout", "600", "--sandbox-rw"])
            .arg(fifos)
            .args(["--", "sh", "-c", &relay])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("airlock starts");
        let req = File::options().write(true).open(&req).expect("request fifo");
        let mut resp = BufReader::new(File::open(&resp).expect("response fifo"));
        let mut line = String::new();
        resp.read_line(&mut line).expect("init");
        assert!(line.contains("\"init\""), "{line}");
        Session { child, req: Some(req), resp, next_id: 0, line }
    }

    fn read(&mut self, path: &str) -> usize {
        self.next_id += 1;
        let msg = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"fs.read\",\"params\":{{\"path\":\"{path}\"}}}}\n",
            self.next_id
        );
        let req = self.req.as_mut().expect("open");
        req.write_all(msg.as_bytes()).expect("request");
        self.line.clear();
        self.resp.read_line(&mut self.line).expect("response")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // EOF on the tool's stdout: airlock ends the run and the relay.
        self.req = None;
        let _ = self.child.wait();
    }
}

fn fs_read(c: &mut Criterion) {
    let project = tempfile::tempdir().expect("tempdir");
    let fifos = tempfile::tempdir().expect("tempdir");
    for (name, size) in [("4k.txt", 4096usize), ("256k.txt", 256 * 1024)] {
        std::fs::write(project.path().join(name), "x".repeat(size - 1) + "\n").expect("write");
    }
    let mut s = Session::start(project.path(), fifos.path());
    for (name, size) in [("4k.txt", 4096u64), ("256k.txt", 256 * 1024)] {
        let mut g = c.benchmark_group(format!("fs_read_{name}"));
        g.throughput(Throughput::Bytes(size));
        let direct = project.path().join(name);
        g.bench_function("direct std::fs::read", |b| {
            b.iter(|| std::hint::black_box(std::fs::read(&direct).expect("read").len()))
        });
        g.bench_function("airlock tool round trip", |b| {
            b.iter(|| {
                let n = s.read(name);
                assert!(n as u64 > size, "short answer: {}", &s.line[..s.line.len().min(200)]);
                std::hint::black_box(n)
            })
        });
        g.finish();
    }
}

criterion_group!(benches, fs_read);
criterion_main!(benches);
