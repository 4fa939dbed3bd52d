//! The path operations (`stat`, `list`, `mkdir`, `remove`, `rename`) with
//! the real binary under the default sandbox: an agent written against the
//! Python client walking, making, moving and removing files; `airlock fs`
//! from a shell; and the attacks on roots, links and listings, each from a
//! child of its own (and, for the link swaps, a racing process outside).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn client_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python").display().to_string()
}

/// `airlock run --allow-rw . --allow ro ARGS -- python3 -c SCRIPT` in
/// `dir`, with `airlock_client` importable.
fn agent(dir: &Path, args: &[&str], script: &str) -> Run {
    let client = client_dir();
    let mut all = vec!["--sandbox-ro", client.as_str(), "--allow-rw", ".", "--allow", "ro"];
    all.extend_from_slice(args);
    let prelude = format!(
        "import sys, json; sys.path.insert(0, {client:?})\n\
         from airlock_client import Client, AirlockError, AirlockNotFound, AirlockRefused\n\
         def out(v): print(json.dumps(v), flush=True)\n"
    );
    run_in(dir, &all, &["python3".into(), "-c".into(), format!("{prelude}{script}")])
}

fn project() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("proj");
    std::fs::create_dir_all(dir.join("ro/deep")).expect("mkdir");
    std::fs::create_dir_all(dir.join("src/pkg")).expect("mkdir");
    std::fs::write(dir.join("data.txt"), "data").expect("write");
    std::fs::write(dir.join("src/pkg/mod.py"), "x = 1\n").expect("write");
    std::fs::write(dir.join("ro/deep/keep.txt"), "keep").expect("write");
    std::fs::create_dir(tmp.path().join("outside")).expect("mkdir");
    std::fs::write(tmp.path().join("outside/secret.txt"), "outside secret").expect("write");
    (tmp, dir)
}

#[test]
fn an_agent_walks_makes_moves_and_removes_through_the_python_client() {
    let (_tmp, dir) = project();
    let run = agent(
        &dir,
        &["--audit", "audit.jsonl"],
        r#"
with Client.from_env() as c:
    mine = lambda names: sorted(n for n in names if not n.startswith(("report-", "audit")))
    out(["listdir", mine(c.listdir("."))])
    out(["walk", [[d, sorted(ds), sorted(fs)] for d, ds, fs in c.walk("src")]])
    out(["stat", c.stat("data.txt")["kind"], c.stat("data.txt")["size"], c.stat("ro")["kind"]])
    c.makedirs("out/new/deep")
    c.makedirs("out/new/deep")
    c.write_file("out/new/deep/a.txt", b"hello")
    c.write_file("gen/x/y.txt", b"made", parents=True)
    c.rename("out/new/deep/a.txt", "out/b.txt")
    out(["renamed", c.read_file("out/b.txt").decode(), c.exists("out/new/deep/a.txt")])
    c.write_file("out/c.txt", b"c")
    try:
        c.rename("out/c.txt", "out/b.txt", replace=False)
    except AirlockError as e:
        out(["noreplace", e.code])
    c.rename("out/c.txt", "out/b.txt")
    out(["replaced", c.read_file("out/b.txt").decode()])
    for what, f in [
        ("missing", lambda: c.read_file("nope.txt")),
        ("missing-stat", lambda: c.stat("nope/deeper")),
        ("refused", lambda: c.read_file("/etc/passwd")),
        ("refused-stat", lambda: c.stat("/etc/nope")),
        ("refused-write", lambda: c.write_file("ro/new.txt", b"x")),
        ("refused-remove", lambda: c.remove("ro/deep/keep.txt")),
        ("refused-mkdir", lambda: c.mkdir("ro/d")),
        ("refused-rmroot", lambda: c.remove("ro")),
        ("refused-mvroot", lambda: c.rename(".", "elsewhere")),
        ("not-empty", lambda: c.remove("out")),
    ]:
        try:
            f()
            out([what, "ok"])
        except FileNotFoundError as e:
            out([what, "FileNotFoundError", e.code])
        except PermissionError as e:
            out([what, "PermissionError", e.code])
        except AirlockError as e:
            out([what, "AirlockError", e.code])
    c.rmtree("out")
    out(["gone", c.exists("out"), mine(c.listdir("."))])
"#,
    );
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout(), run.stderr());
    let lines = run.lines();
    let find =
        |k: &str| lines.iter().find(|l| l[0] == k).unwrap_or_else(|| panic!("no {k}: {lines:?}")).clone();
    assert_eq!(find("listdir")[1], serde_json::json!(["data.txt", "ro", "src"]));
    assert_eq!(find("walk")[1], serde_json::json!([["src", ["pkg"], []], ["src/pkg", [], ["mod.py"]]]));
    assert_eq!(find("stat"), serde_json::json!(["stat", "file", 4, "dir"]));
    assert_eq!(find("renamed"), serde_json::json!(["renamed", "hello", false]));
    assert_eq!(find("noreplace"), serde_json::json!(["noreplace", "E_ARG"]));
    assert_eq!(find("replaced"), serde_json::json!(["replaced", "c"]));
    for k in ["missing", "missing-stat"] {
        assert_eq!(find(k), serde_json::json!([k, "FileNotFoundError", "E_NOENT"]));
    }
    for k in [
        "refused",
        "refused-stat",
        "refused-write",
        "refused-remove",
        "refused-mkdir",
        "refused-rmroot",
        "refused-mvroot",
    ] {
        assert_eq!(find(k), serde_json::json!([k, "PermissionError", "E_PERM"]));
    }
    assert_eq!(find("not-empty"), serde_json::json!(["not-empty", "AirlockError", "E_ARG"]));
    assert_eq!(find("gone"), serde_json::json!(["gone", false, ["data.txt", "gen", "ro", "src"]]));
    // On the host: what the agent made and removed, and nothing else.
    assert_eq!(std::fs::read(dir.join("gen/x/y.txt")).expect("made"), b"made");
    assert!(!dir.join("out").exists());
    assert_eq!(std::fs::read(dir.join("ro/deep/keep.txt")).expect("kept"), b"keep");
    run.assert_no_leaks();
    let ops = &run.report["path_ops"];
    assert!(ops["list"].as_u64() >= Some(4) && ops["rename"].as_u64() == Some(4), "{}", run.report);
    let audit = std::fs::read_to_string(dir.join("audit.jsonl")).expect("audit");
    assert!(
        audit.lines().any(|l| l.contains(r#""op":"rename""#) && l.contains(r#""to":"out/b.txt""#)),
        "{audit}"
    );
    assert!(audit.lines().any(|l| l.contains(r#""op":"remove""#) && l.contains(r#""allowed":false"#)));
}

#[test]
fn airlock_fs_from_a_shell_and_write_needing_its_directories() {
    let (_tmp, dir) = project();
    let run = run_in(
        &dir,
        &["--allow-rw", ".", "--allow", "ro"],
        &sh(r#"
            echo x | "$AIRLOCK" fs write out/new/deep.txt; echo "plain=$?"
            echo x | "$AIRLOCK" fs write -p out/new/deep.txt; echo "parents=$?"
            "$AIRLOCK" fs list out/new
            "$AIRLOCK" fs list -l .
            "$AIRLOCK" fs stat out/new/deep.txt
            "$AIRLOCK" fs mkdir out/new; echo "exists=$?"
            "$AIRLOCK" fs mkdir -p out/new/a/b; echo "mkdir-p=$?"
            "$AIRLOCK" fs rename out/new/deep.txt out/moved.txt && "$AIRLOCK" fs cat out/moved.txt
            "$AIRLOCK" fs rename --no-replace data.txt out/moved.txt; echo "noreplace=$?"
            "$AIRLOCK" fs remove out/moved.txt; echo "removed=$?"
            "$AIRLOCK" fs stat /etc/passwd; echo "refused=$?"
        "#),
    );
    let out = run.stdout();
    assert_eq!(run.code(), Some(0), "{out}\n{}", run.stderr());
    for want in [
        "plain=1",
        "parents=0",
        "deep.txt\n",
        "file 4 data.txt\n",
        "dir 0 out\n",
        "dir 0 ro\ndir 0 src\n",
        r#""kind":"file""#,
        "exists=1",
        "mkdir-p=0",
        "x\n",
        "noreplace=1",
        "removed=0",
        "refused=1",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    let err = run.stderr();
    assert!(err.contains("airlock fs: out/new/deep.txt: E_NOENT"), "{err}");
    assert!(
        err.contains("airlock fs: out/new: E_ARG: ") && err.contains("/proj/out/new already exists"),
        "{err}"
    );
    assert!(err.contains("airlock fs: /etc/passwd: E_PERM"), "{err}");
    run.assert_no_leaks();
}

#[test]
fn roots_stay_put_and_nothing_moves_into_a_read_only_root_or_out_of_the_roots() {
    let (tmp, dir) = project();
    std::fs::create_dir_all(dir.join("rw2")).expect("mkdir");
    std::fs::create_dir_all(dir.join("hold")).expect("mkdir");
    // A link inside the read-write root into the read-only one: what the
    // text names is writable, where it leads is not.
    std::os::unix::fs::symlink("ro", dir.join("tolink")).expect("symlink");
    let outside = tmp.path().join("outside").display().to_string();
    let run = run_in(
        &dir,
        &["--allow-rw", ".", "--allow", "ro", "--allow-rw", "rw2", "--allow-rw", "hold"],
        &python(&format!(
            r#"
attempts = [
    ("rename a root away", "rename", {{"from": "rw2", "to": "gone"}}),
    ("rename the top root", "rename", {{"from": ".", "to": "../elsewhere"}}),
    ("rename a dir holding the read-only root", "rename", {{"from": ".", "to": "x"}}),
    ("replace a root", "rename", {{"from": "src", "to": "hold"}}),
    ("remove a root", "remove", {{"path": "hold"}}),
    ("remove the read-only root", "remove", {{"path": "ro"}}),
    ("rename into the read-only root", "rename", {{"from": "data.txt", "to": "ro/data.txt"}}),
    ("rename out of the read-only root", "rename", {{"from": "ro/deep/keep.txt", "to": "k.txt"}}),
    ("rename the read-only root's subdir", "rename", {{"from": "ro/deep", "to": "deep"}}),
    ("rename out of every root", "rename", {{"from": "data.txt", "to": {outside:?} + "/data.txt"}}),
    ("mkdir outside", "mkdir", {{"path": {outside:?} + "/made", "parents": True}}),
    ("remove outside", "remove", {{"path": {outside:?} + "/secret.txt"}}),
    ("rename into the read-only root through a link", "rename", {{"from": "data.txt", "to": "tolink/data.txt"}}),
    ("mkdir in the read-only root through a link", "mkdir", {{"path": "tolink/made/deeper", "parents": True}}),
    ("remove in the read-only root through a link", "remove", {{"path": "tolink/deep/keep.txt"}}),
    ("move out of the read-only root through a link", "rename", {{"from": "tolink/deep", "to": "deep"}}),
    ("stat outside", "stat", {{"path": {outside:?} + "/secret.txt"}}),
    ("list outside", "list", {{"path": {outside:?}}}),
]
for what, op, params in attempts:
    r = call(op, **params)
    out([what, code(r)])
# Across two roots: handled (renameat2 between two checked descriptors).
r = call("rename", **{{"from": "data.txt", "to": "rw2/data.txt"}})
out(["across roots", code(r)])
"#
        )),
    );
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout(), run.stderr());
    for line in run.lines() {
        let want = if line[0] == "across roots" { serde_json::Value::Null } else { "E_PERM".into() };
        assert_eq!(line[1], want, "{line}");
    }
    assert!(dir.join("rw2").is_dir() && dir.join("hold").is_dir() && dir.join("ro/deep/keep.txt").is_file());
    assert_eq!(std::fs::read(dir.join("rw2/data.txt")).expect("moved across roots"), b"data");
    assert_eq!(std::fs::read(tmp.path().join("outside/secret.txt")).expect("untouched"), b"outside secret");
    assert!(!tmp.path().join("outside/made").exists());
    assert!(!dir.join("ro/data.txt").exists() && !dir.join("ro/made").exists());
    run.assert_no_leaks();
}

#[test]
fn a_link_swapped_between_list_and_stat_never_shows_what_is_outside() {
    let (tmp, dir) = project();
    // `site` is a directory inside, or a link to the directory outside,
    // swapped as fast as a process outside airlock can.
    std::fs::create_dir(dir.join("inside")).expect("mkdir");
    std::fs::write(dir.join("inside/secret.txt"), "in").expect("write");
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (stop, dir, outside) = (stop.clone(), dir.clone(), tmp.path().join("outside"));
        std::thread::spawn(move || {
            let (site, inside) = (dir.join("site"), dir.join("inside"));
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&site);
                let _ = std::os::unix::fs::symlink(
                    if swaps.is_multiple_of(2) { &outside } else { &inside },
                    &site,
                );
                swaps += 1;
            }
            swaps
        })
    };
    let run = run_in(
        &dir,
        &["--allow-rw", "."],
        &python(
            r#"
seen = set()
for i in range(400):
    l = call("list", path="site")
    if l["ok"]:
        seen.update(e["name"] for e in l["result"]["entries"])
    else:
        seen.add(code(l))
    s = call("stat", path="site/secret.txt")
    seen.add(("size", s["result"]["size"]) if s["ok"] else code(s))
    r = call("open", path="site/secret.txt", mode="r")
    if r["ok"]:
        d = call("read", h=r["result"]["handle"], max=100)
        seen.add(("read", d["result"]["data"]))
        call("close", h=r["result"]["handle"])
out(sorted(map(str, seen)))
"#,
        ),
    );
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().expect("racer");
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout(), run.stderr());
    let seen = run.stdout();
    // Only what is inside ever shows: its name, its 2 bytes; the link to
    // outside is refused, never listed or read.
    assert!(!seen.contains("14") && !seen.contains("b3V0c2lkZ"), "{seen}");
    assert!(seen.contains("E_PERM") && seen.contains("secret.txt"), "{seen} ({swaps} swaps)");
    run.assert_no_leaks();
}

#[test]
fn open_files_renamed_over_or_removed_keep_their_data_and_a_huge_listing_is_paged() {
    let (_tmp, dir) = project();
    std::fs::create_dir(dir.join("big")).expect("mkdir");
    for i in 0..2500 {
        std::fs::write(dir.join(format!("big/f{i:05}")), "").expect("write");
    }
    let run = run_in(
        &dir,
        &["--allow-rw", ".", "--max-list-entries", "1000"],
        &python(
            r#"
h = call("open", path="data.txt", mode="r")["result"]["handle"]
w = call("open", path="scratch.txt", mode="w", id="w")
call("open", path="new.txt", mode="w", id="n")
call("rename", **{"from": "new.txt", "to": "data.txt"})
out(["read after rename over", call("read", h=h, max=100)["result"]["data"]])
hw = call("open", path="kept.txt", mode="w")["result"]["handle"]
out(["removed", code(call("remove", path="kept.txt"))])
out(["write after remove", call("write", h=hw, data=b64(b"late"))["result"]["written"]])
call("close", h=hw)
out(["stat after", code(call("stat", path="kept.txt"))])
first = call("list", path="big")
out(["page", len(first["result"]["entries"]), first["result"].get("next")])
out(["all", len(list_all("big")), len(list_all("big", max=7))])
"#,
        ),
    );
    assert_eq!(run.code(), Some(0), "{}\n{}", run.stdout(), run.stderr());
    let lines = run.lines();
    assert_eq!(lines[0], serde_json::json!(["read after rename over", "ZGF0YQ=="]));
    assert_eq!(lines[1], serde_json::json!(["removed", null]));
    assert_eq!(lines[2], serde_json::json!(["write after remove", 4]));
    assert_eq!(lines[3], serde_json::json!(["stat after", "E_NOENT"]));
    assert_eq!(lines[4], serde_json::json!(["page", 1000, "f00999"]));
    assert_eq!(lines[5], serde_json::json!(["all", 2500, 2500]));
    assert!(!dir.join("kept.txt").exists());
    // Two handles left open by the script are closed when it exits.
    run.assert_no_leaks();
}

#[test]
fn a_nested_airlock_forwards_the_path_ops_under_both_policies() {
    let (_tmp, dir) = project();
    let run = run_in(
        &dir,
        &["--allow-rw", "."],
        &sh(r#"
            "$AIRLOCK" run --allow-rw src -- sh -c '
                "$AIRLOCK" fs mkdir -p src/a/b; echo "inner mkdir=$?"
                "$AIRLOCK" fs list src
                "$AIRLOCK" fs rename src/a src/z; echo "inner rename=$?"
                "$AIRLOCK" fs rename src/z data2; echo "out of the inner root=$?"
                "$AIRLOCK" fs stat data.txt; echo "virtual to the inner level=$?"
                "$AIRLOCK" fs mkdir mine && "$AIRLOCK" fs list .
            '
        "#),
    );
    let out = run.stdout();
    assert_eq!(run.code(), Some(0), "{out}\n{}", run.stderr());
    for want in [
        "inner mkdir=0",
        "a\npkg\n",
        "inner rename=0",
        "out of the inner root=1",
        "virtual to the inner level=1",
        "mine\nsrc\n",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}\n{}", run.stderr());
    }
    assert!(dir.join("src/z/b").is_dir());
    assert!(!dir.join("mine").exists(), "the inner level's directory is its own, in memory");
    run.assert_no_leaks();
}
