//! `airlock fd ...` inside real `airlock run` sessions: the seed's flow,
//! 100 MB through stdin, nesting and isolation, limits, and a hostile
//! child speaking the wire directly.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

fn config(dir: &Path, text: &str) -> String {
    let path = dir.join("airlock.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const SMALL: &str = "[file_descriptor]\ndefault_page_size = 40\nmax_direct_output_chars = 60\n";

fn xml_text(x: &str, tag: &str) -> String {
    let doc = roxmltree::Document::parse(x).unwrap_or_else(|e| panic!("not XML ({e}): {x:?}"));
    let node = doc.descendants().find(|n| n.has_tag_name(tag)).unwrap_or_else(|| panic!("no <{tag}>: {x}"));
    node.text().unwrap_or_default().to_owned()
}

fn attr(x: &str, tag: &str, name: &str) -> String {
    let doc = roxmltree::Document::parse(x).unwrap_or_else(|e| panic!("not XML ({e}): {x:?}"));
    let node = doc.descendants().find(|n| n.has_tag_name(tag)).unwrap_or_else(|| panic!("no <{tag}>: {x}"));
    node.attribute(name).unwrap_or_else(|| panic!("no {name} in {x}")).to_owned()
}

/// Split a transcript of `---`-separated outputs, each followed by `rc=N`.
fn steps(out: &str) -> Vec<(String, i32)> {
    out.split("\n---\n")
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let (body, rc) = s.rsplit_once("rc=").unwrap_or_else(|| panic!("no rc in {s:?}"));
            (body.to_owned(), rc.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn the_seed_flow_in_a_real_session() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    let nums: String = (1..=30).map(|i| format!("{i}\n")).collect();
    std::fs::write(dir.path().join("nums.txt"), nums).unwrap();
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &sh(r#"
step() { "$@"; echo "rc=$?"; echo ---; }
seq 1 30 | step "$AIRLOCK" fd wrap
step "$AIRLOCK" fd read fd:1 --page 2
step "$AIRLOCK" fd read fd:1 --page 4
step "$AIRLOCK" fd read fd:1 --all
step "$AIRLOCK" fd read fd:1 --lines 29-30
step "$AIRLOCK" fd read fd:1 --lines 30-31
step "$AIRLOCK" fd search fd:1 2
step "$AIRLOCK" fd to-file fd:1 out.txt --lines 2-3
step "$AIRLOCK" fd to-file fd:1 out.txt --mode insert --at-line 2 --page 1
step "$AIRLOCK" fd to-file fd:1 out.txt --page 1 --lines 1-2
step "$AIRLOCK" fd read fd:42
echo short | step "$AIRLOCK" fd wrap
step "$AIRLOCK" fd wrap nums.txt
step "$AIRLOCK" fd read fd:1
step "$AIRLOCK" fd read fd:1 --preview
step "$AIRLOCK" fd read fd:1 --preview --page 2
"#),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let s = steps(&run.stdout());
    let seq: String = (1..=30).map(|i| format!("{i}\n")).collect();
    // wrap: the seed's fd_result, page 1 as its preview.
    assert_eq!(s[0].1, 0);
    assert_eq!(attr(&s[0].0, "fd_result", "fd"), "fd:1");
    assert_eq!(attr(&s[0].0, "fd_result", "pages"), "3");
    assert_eq!(attr(&s[0].0, "fd_result", "total_lines"), "30");
    let p1 = xml_text(&s[0].0, "preview");
    let p2 = xml_text(&s[1].0, "fd_content");
    assert_eq!(attr(&s[1].0, "fd_content", "lines"), "17-29");
    assert_eq!(s[2].1, 1);
    assert!(s[2].0.contains("Valid range: 1-3"), "{}", s[2].0);
    assert_eq!(xml_text(&s[3].0, "fd_content"), seq);
    assert!(seq.starts_with(&format!("{p1}{p2}")));
    assert_eq!(xml_text(&s[4].0, "fd_content"), "29\n30\n");
    assert_eq!((attr(&s[5].0, "fd_error", "type"), s[5].1), ("invalid_range".into(), 1));
    assert_eq!(attr(&s[6].0, "fd_search", "matches"), "12");
    assert_eq!(attr(&s[7].0, "fd_write", "success"), "true");
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap(), format!("2\n{p1}3\n"));
    assert_eq!(attr(&s[9].0, "fd_error", "type"), "invalid_argument");
    assert_eq!((attr(&s[10].0, "fd_error", "type"), s[10].1), ("not_found".into(), 1));
    assert_eq!(s[11], ("short\n".into(), 0), "at or under the threshold: the content itself");
    assert_eq!(attr(&s[12].0, "fd_result", "fd"), "fd:2");
    assert_eq!(
        s[13].0,
        s[1].0
            .replace("page=\"2\"", "page=\"1\"")
            .replace(&p2, &p1)
            .replace("lines=\"17-29\"", "lines=\"1-16\"")
    );
    assert_eq!(s[14], s[0], "--preview: the wrap's answer again");
    assert_eq!(
        (attr(&s[15].0, "fd_error", "type"), s[15].1),
        ("invalid_argument".into(), 1),
        "--preview with --page"
    );
    run.assert_no_leaks();
}

#[test]
fn a_hundred_megabytes_through_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[file_descriptor]\n");
    // Mixed-length lines, generated in the child, wrapped, then the last
    // page read and the whole exported and compared by digest.
    let script = r#"
import hashlib, subprocess, os, sys
A = os.environ["AIRLOCK"]
def gen():
    n = 0
    i = 0
    while n < 100_000_000:
        line = ("%d " % i + "x" * ((i * 7919) % 301) + "\n").encode()
        n += len(line)
        i += 1
        yield line
data = b"".join(gen())
digest = hashlib.sha256(data).hexdigest()
p = subprocess.run([A, "fd", "wrap"], input=data, capture_output=True, pass_fds=(3,))
print(p.returncode, len(data), digest, flush=True)
head = p.stdout.decode()
pages = int(head.split('pages="')[1].split('"')[0])
last = subprocess.run([A, "fd", "read", "fd:1", "--page", str(pages)], capture_output=True, pass_fds=(3,))
print(last.returncode, flush=True)
sys.stdout.write(last.stdout.decode())
w = subprocess.run([A, "fd", "to-file", "fd:1", "copy.txt"], capture_output=True, pass_fds=(3,))
copy = subprocess.run([A, "fs", "cat", "copy.txt"], capture_output=True, pass_fds=(3,)).stdout
print(w.returncode, hashlib.sha256(copy).hexdigest(), flush=True)
"#;
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &["python3".into(), "-c".into(), script.into()],
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let out = run.stdout();
    let mut lines = out.splitn(3, '\n');
    let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
    assert_eq!(first[0], "0");
    let digest = first[2];
    assert_eq!(lines.next().unwrap(), "0");
    let rest = lines.next().unwrap();
    let (last_page, tail) = rest.rsplit_once("</fd_content>\n").unwrap();
    let page = format!("{last_page}</fd_content>");
    assert_eq!(attr(&page, "fd_content", "truncated"), "false");
    assert!(xml_text(&page, "fd_content").ends_with("x\n"));
    assert_eq!(tail.trim(), format!("0 {digest}"));
    run.assert_no_leaks();
}

#[test]
fn a_nested_session_reads_its_parent_s_fds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &sh(r#"
seq 1 30 | "$AIRLOCK" fd wrap > /dev/null
"$AIRLOCK" run -- sh -c '"$AIRLOCK" fd read fd:1 --page 2; echo "rc=$?"; echo ---'
"#),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let s = steps(&run.stdout());
    assert_eq!(attr(&s[0].0, "fd_content", "lines"), "17-29", "{}", s[0].0);
    run.assert_no_leaks();
}

#[test]
fn isolation_narrows_a_nested_session_s_fds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &sh(r#"
seq 1 30 | "$AIRLOCK" fd wrap > /dev/null
seq 100 130 | "$AIRLOCK" fd wrap > /dev/null
"$AIRLOCK" run --isolate-fds --preload-fd fd:1 -- sh -c '
  step() { "$@"; echo "rc=$?"; echo ---; }
  step "$AIRLOCK" fd read fd:1 --lines 1-1
  step "$AIRLOCK" fd read fd:2
  seq 200 240 | step "$AIRLOCK" fd wrap
  step "$AIRLOCK" fd search fd:3 23
'
"#),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let s = steps(&run.stdout());
    assert_eq!(s.len(), 4, "{}\n{}", run.stdout(), run.stderr());
    assert_eq!(xml_text(&s[0].0, "fd_content"), "1\n");
    assert_eq!(
        (attr(&s[1].0, "fd_error", "type"), s[1].1),
        ("not_found".into(), 1),
        "isolated: fd:2 is not in its table"
    );
    assert_eq!(attr(&s[2].0, "fd_result", "fd"), "fd:3", "numbered by the session");
    assert_eq!(attr(&s[3].0, "fd_search", "matches"), "11");
    run.assert_no_leaks();
}

#[test]
fn configuration_is_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |text: &str| {
        let cfg = config(dir.path(), text);
        let out = Command::new(airlock())
            .current_dir(dir.path())
            .args(["run", "--config", &cfg, "--", "true"])
            .env_remove("AIRLOCK_FD")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = bad("[file_descriptor]\npage_size = 10\n");
    assert_eq!(code, Some(125));
    assert!(err.contains("page_size"), "{err}");
    let (code, err) = bad("[file_descriptor]\ndefault_page_size = 0\n");
    assert_eq!(code, Some(125));
    assert!(err.contains("default_page_size"), "{err}");
    let (code, err) = bad("[file_descriptor]\nmax_input_chars = -1\n");
    assert_eq!(code, Some(125));
    assert!(err.contains("max_input_chars"), "{err}");
    let (code, err) = bad("[file_descriptor]\ndefault_page_size = 9000\n");
    assert_eq!(code, Some(0));
    assert!(err.contains("default_page_size (9000) is above max_direct_output_chars"), "{err}");
    let out = Command::new(airlock())
        .current_dir(dir.path())
        .args(["run", "--isolate-fds", "--", "true"])
        .env_remove("AIRLOCK_FD")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--isolate-fds needs a parent"));
}

#[test]
fn without_the_section_the_ops_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_in(dir.path(), &[], &sh(r#"echo hi | "$AIRLOCK" fd wrap"#));
    assert_eq!(run.code(), Some(1));
    assert!(run.stderr().contains("E_UNSUPPORTED"), "{}", run.stderr());
    assert_eq!(run.report["errors_by_code"]["E_UNSUPPORTED"], 1);
}

#[test]
fn hostile_content_long_lines_binary_and_xml_specials() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    std::fs::write(dir.path().join("bin"), [0u8, 159, 146, 150, 0xff, 10, 13, 1].repeat(20)).unwrap();
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &python(
            r#"
import subprocess
A = os.environ["AIRLOCK"]
def fd(*args, data=None):
    p = subprocess.run([A, "fd", *args], input=data, capture_output=True, pass_fds=(3,))
    out([p.returncode, p.stdout.decode("utf-8", "replace")])
# One line of exactly 3 pages and its newline: a last page of "\n".
fd("wrap", data=b"y" * 120 + b"\n")
fd("read", "fd:1", "--page", "4")
# Not UTF-8, and XML-hostile characters: base64.
fd("wrap", "bin")
fd("read", "fd:2", "--page", "2")
fd("to-file", "fd:2", "bin.copy")
# XML specials and CRLF come back exactly.
text = "<a b=\"c\">&amp; 'q'</a>\r\n" * 4
fd("wrap", data=text.encode())
fd("read", "fd:3", "--all")
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let l = run.lines();
    let s = |i: usize| l[i][1].as_str().unwrap().to_owned();
    assert_eq!(attr(&s(0), "fd_result", "pages"), "4");
    assert_eq!(xml_text(&s(1), "fd_content"), "\n");
    assert_eq!(attr(&s(1), "fd_content", "continued"), "true");
    assert_eq!(attr(&s(2), "fd_result", "encoding"), "base64");
    assert_eq!(attr(&s(3), "fd_content", "encoding"), "base64");
    assert_eq!(l[4][0], 0);
    assert_eq!(
        std::fs::read(dir.path().join("bin.copy")).unwrap(),
        std::fs::read(dir.path().join("bin")).unwrap()
    );
    let text = "<a b=\"c\">&amp; 'q'</a>\r\n".repeat(4);
    assert_eq!(xml_text(&s(6), "fd_content"), text);
    run.assert_no_leaks();
}

#[test]
fn to_file_onto_refused_paths_and_symlinks_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(dir.path().join("outside.txt"), "untouched").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.txt"), root.join("link")).unwrap();
    std::fs::write(dir.path().join("ro.txt"), "read-only").unwrap();
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "root", "--allow", "ro.txt"],
        &sh(r#"
step() { "$@"; echo "rc=$?"; echo ---; }
seq 1 30 | "$AIRLOCK" fd wrap > /dev/null
step "$AIRLOCK" fd to-file fd:1 root/link
step "$AIRLOCK" fd to-file fd:1 ro.txt --mode append
step "$AIRLOCK" fd to-file fd:1 /etc/passwd --mode insert --at-line 1
step "$AIRLOCK" fd wrap root/link
step "$AIRLOCK" fd to-file fd:1 root/new.txt --mode insert --at-line 1 --lines 1-2
"#),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let s = steps(&run.stdout());
    for (i, op) in [(0, "write"), (1, "append"), (2, "insert"), (3, "read")] {
        assert_eq!(s[i].1, 1, "{}", s[i].0);
        assert_eq!(attr(&s[i].0, "fd_error", "type"), "file_operation");
        assert!(s[i].0.contains(&format!("Operation: {op}, Path: ")), "{}", s[i].0);
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("outside.txt")).unwrap(), "untouched");
    assert_eq!(std::fs::read_to_string(dir.path().join("ro.txt")).unwrap(), "read-only");
    assert_eq!(std::fs::read_to_string(root.join("new.txt")).unwrap(), "1\n2\n");
    run.assert_no_leaks();
}

#[test]
fn a_hostile_child_cannot_pass_max_total_bytes_or_break_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[file_descriptor]\nmax_total_bytes = 1000000\n");
    let run = run_in(
        dir.path(),
        &["--config", &cfg],
        &python(
            r#"
def call(op, id="x", **params):
    send({"id": id, "op": op, "params": params})
    r = recv()
    assert r["id"] == id, r
    return r
first = call("FD_WRAP", data=b64(b"keep me\n" * 2000))
out(first["result"]["fd"])
# Stream until refused.
n = 0
while True:
    r = call("FD_WRAP", stream="s", data=b64(b"z" * 60000), more=True)
    if not r["ok"]:
        out(n, r["error"]["code"], "type=\"limit\"" in r["error"]["message"])
        break
    n += 1
# A chunk after its stream was dropped is refused, not a new stream.
r = call("FD_WRAP", stream="s", data=b64(b"z"), more=True, offset=60000)
out(code(r))
# Many one-shot wraps until the limit: each refusal stores nothing.
m = 0
while True:
    r = call("FD_WRAP", data=b64(b"q\n" * 50000))
    if not r["ok"]:
        out(m, "limit" in r["error"]["message"])
        break
    m += 1
# Garbage: bad base64, wrong types, huge names, cursor games.
for params in [dict(data="!!"), dict(data=5), dict(stream="x" * 100, data=""), dict(path=7),
               dict(fd="fd:1", page=-1), dict(fd="fd:" + "9" * 40), dict(fd="fd:1", cursor=10**12, all=True)]:
    op = "FD_READ" if "fd" in params else "FD_WRAP"
    out(code(call(op, **params)))
# What was stored is intact.
r = call("FD_READ", fd=first["result"]["fd"], start_line=2000, end_line=2000)
out(r["result"]["xml"])
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let l = run.lines();
    assert_eq!(l[0], "fd:1");
    assert!(l[1][0].as_u64().is_some_and(|n| n >= 10), "{l:?}");
    assert_eq!(l[1][1], "E_RANGE");
    assert_eq!(l[1][2], true);
    assert_eq!(l[2], "E_ARG");
    assert_eq!(l[3][1], true);
    for (i, v) in l.iter().enumerate().take(10).skip(4) {
        assert!(matches!(v.as_str(), Some("E_ARG" | "E_NOENT")), "{i}: {v}");
    }
    assert_eq!(l[10].as_str().unwrap(), "E_ARG");
    assert!(l[11].as_str().unwrap().ends_with(">keep me\n</fd_content>"), "{}", l[11]);
    run.assert_no_leaks();
}

/// Each fd op spelled as the request scanner reads it (a flat object of
/// plain members) and again as only the tree reads it (an escaped key or
/// value): the answers agree but for the id and a wrap's new fd. Numbers the tree alone reads, a repeated key, a
/// nested or negative value: one answer each, and the session goes on.
#[test]
fn the_request_scanner_and_the_tree_answer_fd_ops_alike() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SMALL);
    std::fs::write(dir.path().join("a.txt"), "hello\nworld\n".repeat(500)).unwrap();
    let run = run_in(
        dir.path(),
        &["--config", &cfg, "--allow-rw", "."],
        &python(
            r#"
import re
def ask(n, op, params):
    send_raw(b'{"id":"%s","op":"%s","params":%s}' % (n.encode(), op.encode(), params.encode()))
    r = recv()
    assert r["id"] == n, r
    del r["id"]
    return re.sub(r"fd:[0-9]+", "fd:N", json.dumps(r, sort_keys=True))
pairs = [
    ("FD_WRAP", '{"path":"a.txt"}', '{"p\\u0061th":"a.txt"}'),
    ("FD_WRAP", '{"data":"aGk=","more":false,"offset":0,"source":"tool","stream":"s1"}',
                '{"source":"tool","stream":"s\\u0031","offset":0,"more":false,"data":"aGk="}'),
    ("FD_READ", '{"fd":"fd:1"}', '{"f\\u0064":"fd:1"}'),
    ("FD_READ", '{"fd":"fd:1","page":3}', '{"page":3,"fd":"fd:\\u0031"}'),
    ("FD_READ", '{"fd":"fd:999999"}', '{"fd":"fd:99999\\u0039"}'),
    ("FD_READ", '{"fd":"fd:1","page":18446744073709551615}', '{"f\\u0064":"fd:1","page":18446744073709551615}'),
    ("FD_SEARCH", '{"fd":"fd:1","query":"world","ignore_case":true}', '{"fd":"fd:1","query":"w\\u006frld","ignore_case":true}'),
    ("FD_TO_FILE", '{"fd":"fd:1","path":"/etc/passwd","mode":"write"}', '{"fd":"fd:1","path":"\\/etc\\/passwd","mode":"write"}'),
    ("FD_TO_FILE", '{"fd":"fd:1","path":"out.txt","mode":null}', '{"fd":"fd:1","path":"out\\u002etxt","mode":null}'),
]
for k, (op, plain, tree) in enumerate(pairs):
    a, b = ask("a%d" % k, op, plain), ask("b%d" % k, op, tree)
    out(k, a == b, json.loads(a)["ok"])
for k, (op, params) in enumerate([
    ("FD_READ", '{"fd":"fd:1","page":2.0}'),
    ("FD_READ", '{"fd":"fd:1","page":18446744073709551616}'),
    ("FD_READ", '{"fd":"fd:1","fd":"fd:2"}'),
    ("FD_READ", '{"fd":"fd:1","x":[1]}'),
    ("FD_READ", '{"fd":"fd:1","page":-1}'),
    ("FD_READ", '{"fd":"fd:1","page":007}'),
]):
    send_raw(b'{"id":"c%d","op":"%s","params":%s}' % (k, op.encode(), params.encode()))
    r = recv()
    out(r["id"], code(r))
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    let l = run.lines();
    assert_eq!(l.len(), 15, "{l:?}");
    for (k, v) in l.iter().take(9).enumerate() {
        assert_eq!(v[0], k);
        assert_eq!(v[1], true, "pair {k} answered differently: {l:?}");
    }
    // The pairs that succeed, so the comparison is not only of refusals.
    let succeeded: Vec<bool> = l.iter().take(9).map(|v| v[2] == true).collect();
    assert_eq!(succeeded, [true, true, true, true, false, false, true, false, true], "{l:?}");
    // One answer each, in order; `007` is not JSON, so its frame has no id.
    let odd: Vec<&serde_json::Value> = l.iter().skip(9).collect();
    for (k, v) in odd.iter().enumerate().take(5) {
        assert_eq!(v[0], format!("c{k}"), "{l:?}");
    }
    assert_eq!(*odd[5], serde_json::json!([null, "E_ARG"]), "{l:?}");
    run.assert_no_leaks();
}

#[test]
fn a_page_round_trip_takes_a_few_milliseconds() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "[file_descriptor]\n");
    let run = run_in(
        dir.path(),
        &["--config", &cfg],
        &python(
            r#"
import subprocess, time
A = os.environ["AIRLOCK"]
subprocess.run([A, "fd", "wrap"], input=b"line\n" * 200000, capture_output=True, check=True, pass_fds=(3,))
best = 1e9
for _ in range(5):
    t = time.monotonic()
    subprocess.run([A, "fd", "read", "fd:1", "--page", "100"], capture_output=True, check=True, pass_fds=(3,))
    best = min(best, time.monotonic() - t)
out(best)
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "stderr: {}", run.stderr());
    // A process start and one round trip; generous for a loaded debug build.
    assert!(run.lines()[0].as_f64().unwrap() < 0.5, "{:?}", run.lines());
    let _ = Stdio::null();
}
