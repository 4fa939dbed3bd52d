//! ToolExec costs, each against a baseline measured in the same run.
//!
//! - `decision`: one request from head to the `Spawn` decision in the core
//!   (auth, protocol, form, cwd, allow-list), against decoding the same
//!   form body alone with `form_urlencoded`, the least any server does.
//! - `v2_throughput`: 64 MiB of tool output streamed through the real
//!   `airlock toolexec serve` to curl, against the same tool piped
//!   through `cat` (`sh -c 'head -c N /dev/zero | cat > /dev/null'`).

use airlock_core::time::Instant;
use airlock_core::toolexec::{validate_token, Config, Exchange, Input, Output, RequestHead};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "bench-token";
const BYTES: u64 = 64 << 20;

fn head() -> RequestHead {
    RequestHead {
        method: "POST".into(),
        path: "/exec".into(),
        headers: vec![
            ("authorization".into(), format!("Bearer {TOKEN}").into_bytes()),
            ("x-aifo-proto".into(), b"2".to_vec()),
            ("te".into(), b"trailers".to_vec()),
            ("content-length".into(), BODY.len().to_string().into_bytes()),
        ],
        http11: true,
    }
}

const BODY: &[u8] = b"tool=cargo&cwd=%2Fwork%2Fcrate&arg=build&arg=--release&arg=--features&arg=a+b";

fn decision(c: &mut Criterion) {
    let mut config = Config::new(validate_token(TOKEN.as_bytes()).expect("token"), b"/work".to_vec());
    for t in ["cargo", "rustc", "make", "cc", "python3"] {
        config.add_tool_spec(t).expect("tool");
    }
    let config = Arc::new(config);
    let head = head();
    let mut g = c.benchmark_group("toolexec_decision");
    g.bench_function("core_head_to_spawn", |b| {
        b.iter(|| {
            let mut ex = Exchange::new(config.clone(), Instant::ZERO);
            ex.handle(Instant::ZERO, Input::Head(head.clone()));
            ex.handle(Instant::ZERO, Input::Body(BODY.to_vec()));
            ex.handle(Instant::ZERO, Input::BodyEnd);
            let mut spawned = false;
            while let Some(o) = ex.poll_output() {
                spawned |= matches!(o, Output::Spawn(_));
            }
            assert!(spawned);
        })
    });
    g.bench_function("baseline_form_decode", |b| {
        b.iter(|| form_urlencoded::parse(std::hint::black_box(BODY)).count())
    });
    g.finish();
}

struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the server we spawned.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

fn server() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["toolexec", "serve", "--tool", "head", "--no-sandbox"])
        .current_dir(dir.path())
        .env("AIFO_TOOLEEXEC_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("airlock toolexec serve");
    let out = child.stdout.take().expect("stdout");
    let mut url = None;
    for line in BufReader::new(out).lines() {
        let line = line.expect("a ready line");
        if let Some(u) = line.strip_prefix("AIFO_TOOLEEXEC_URL=") {
            url = Some(u.to_string());
            break;
        }
    }
    Server { child, url: url.expect("the server printed its URL"), _dir: dir }
}

fn v2_throughput(c: &mut Criterion) {
    let s = server();
    let n = BYTES.to_string();
    let mut g = c.benchmark_group("toolexec_v2_64MiB");
    g.throughput(Throughput::Bytes(BYTES));
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("airlock_v2_to_curl", |b| {
        b.iter(|| {
            let out = Command::new("curl")
                .args(["-sS", "--no-buffer", "-o", "/dev/null", "-w", "%{size_download}"])
                .args([
                    "-H",
                    &format!("Authorization: Bearer {TOKEN}"),
                    "-H",
                    "X-Aifo-Proto: 2",
                    "-H",
                    "TE: trailers",
                ])
                .args(["--data-urlencode", "tool=head", "--data-urlencode", "arg=-c", "--data-urlencode"])
                .arg(format!("arg={n}"))
                .arg("--data-urlencode")
                .arg("arg=/dev/zero")
                .arg(&s.url)
                .output()
                .expect("curl is needed for this bench");
            assert_eq!(String::from_utf8_lossy(&out.stdout), n, "short body");
        })
    });
    g.bench_function("baseline_tool_pipe_cat", |b| {
        b.iter(|| {
            let st = Command::new("sh")
                .args(["-c", &format!("head -c {n} /dev/zero | cat > /dev/null")])
                .status()
                .expect("sh");
            assert!(st.success());
        })
    });
    g.finish();
}

criterion_group!(benches, decision, v2_throughput);
criterion_main!(benches);
