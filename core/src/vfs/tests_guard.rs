//! The tool host's `fs.*` under the guard (`crate::guard`): secret files
//! unread, unlisted and unsearched by any name or symlink; protected paths
//! read but never written, created, removed or renamed, the rest of `.git`
//! writable; grants lifting one path each.

use crate::vfs::memfs::{MemFiles, MemNode};
use crate::vfs::{
    DirEntry, EntryKind, FsOp, FsReply, Gate, GrepQuery, PolicyConfig, ProjectPath, ToolPolicy,
};

fn gate_with(allow_protected: &[&str], allow_secret: &[&str]) -> Gate {
    ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow_rw: vec![".".into()],
        allow_protected: allow_protected.iter().map(|s| s.to_string()).collect(),
        allow_secret: allow_secret.iter().map(|s| s.to_string()).collect(),
        ..PolicyConfig::default()
    })
    .unwrap()
    .gate()
    .clone()
}

fn p(s: &str) -> ProjectPath {
    ProjectPath::parse(s).unwrap()
}

const SECRETS: &[&str] = &[
    ".env",
    ".ENV",
    "prod.env",
    ".envrc",
    "#.env#",
    ".env~",
    "..env.swp",
    ".env_local",
    "sub/.env.local",
    ".npmrc",
];

fn tree() -> MemFiles {
    let mut f = MemFiles::new();
    for s in SECRETS {
        f.put(s, MemNode::File(b"TOKEN=hunter2\n".to_vec()));
    }
    for (path, content) in [
        (".git/config", "[core]\n"),
        (".git/hooks/pre-commit", "#!/bin/sh\n"),
        (".git/index", "idx"),
        (".vscode/tasks.json", "{}"),
        ("notes.txt", "hunter2 is not here\n"),
        ("sub/main.rs", "fn main() {}\n"),
    ] {
        f.put(path, MemNode::File(content.as_bytes().to_vec()));
    }
    f.put("cfg", MemNode::Symlink(".git/config".into()));
    f.put("hooks", MemNode::Symlink(".git/hooks".into()));
    f.put("envlink", MemNode::Symlink(".env".into()));
    f
}

fn run(op: FsOp, gate: &Gate, f: &mut MemFiles) -> Result<FsReply, String> {
    op.run(f, gate).map_err(|e| e.message)
}

#[test]
fn secret_files_are_never_read_listed_or_searched() {
    let g = gate_with(&[], &[]);
    let mut f = tree();
    for s in SECRETS.iter().chain(&["envlink"]) {
        let e = run(FsOp::Read { path: p(s) }, &g, &mut f).unwrap_err();
        assert!(e.contains("secret file") || e.contains(".env file"), "{s}: {e}");
        assert!(run(FsOp::Metadata { path: p(s) }, &g, &mut f).is_err(), "{s}");
        assert!(run(FsOp::Write { path: p(s), content: b"x".to_vec() }, &g, &mut f).is_err(), "{s}");
    }
    let Ok(FsReply::ListDir(entries)) = run(FsOp::ListDir { path: p(".") }, &g, &mut f) else { panic!() };
    let names: Vec<&str> = entries.iter().map(|e: &DirEntry| e.path.as_str()).collect();
    assert_eq!(names, [".git", ".vscode", "cfg", "envlink", "hooks", "notes.txt", "sub"]);
    let Ok(FsReply::ListDir(sub)) = run(FsOp::ListDir { path: p("sub") }, &g, &mut f) else { panic!() };
    assert_eq!(sub, [DirEntry { path: p("main.rs"), kind: EntryKind::File }]);
    let q = GrepQuery {
        pattern: "hunter2".into(),
        paths: vec![p(".")],
        extensions: vec![],
        context: 0,
        max_lines: 100,
    };
    let Ok(FsReply::Grep(found)) = run(FsOp::Grep(q), &g, &mut f) else { panic!() };
    let paths: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["notes.txt"]);
}

#[test]
fn protected_paths_are_read_but_never_changed_and_the_rest_of_git_is_writable() {
    let g = gate_with(&[], &[]);
    let mut f = tree();
    assert_eq!(run(FsOp::Read { path: p("cfg") }, &g, &mut f), Ok(FsReply::Read(b"[core]\n".to_vec())));
    let refused = [
        FsOp::Write { path: p(".git/config"), content: b"[core]\n\tfsmonitor = x\n".to_vec() },
        FsOp::Write { path: p("cfg"), content: b"x".to_vec() },
        FsOp::Write { path: p(".git/config.worktree"), content: b"x".to_vec() },
        FsOp::Write { path: p("hooks/post-checkout"), content: b"x".to_vec() },
        FsOp::Write { path: p(".GIT/config"), content: b"x".to_vec() },
        FsOp::Write { path: p("sub/.git"), content: b"gitdir: /elsewhere\n".to_vec() },
        FsOp::Write { path: p(".mcp.json"), content: b"{}".to_vec() },
        FsOp::Write { path: p(".vscode/tasks.json"), content: b"x".to_vec() },
        FsOp::Delete { path: p(".git/hooks/pre-commit") },
        FsOp::Delete { path: p(".git/config") },
        FsOp::Rename { from: p(".git/config"), to: p("old-config") },
        FsOp::Rename { from: p("notes.txt"), to: p(".git/hooks/pre-push") },
        FsOp::Rename { from: p("notes.txt"), to: p(".vscode/settings.json") },
        FsOp::Rename { from: p("notes.txt"), to: p("sub/.git") },
    ];
    for op in refused {
        let e = run(op.clone(), &g, &mut f).unwrap_err();
        assert!(e.contains("protected path"), "{op:?}: {e}");
        assert_eq!(f, tree(), "{op:?} changed the tree");
    }
    // What `git add` and `git commit` write is not protected.
    assert_eq!(
        run(FsOp::Write { path: p(".git/index"), content: b"new".to_vec() }, &g, &mut f),
        Ok(FsReply::Done)
    );
    assert_eq!(
        run(FsOp::Write { path: p(".git/index.lock"), content: b"x".to_vec() }, &g, &mut f),
        Ok(FsReply::Done)
    );
    assert_eq!(
        run(FsOp::Rename { from: p(".git/index.lock"), to: p(".git/ORIG_HEAD") }, &g, &mut f),
        Ok(FsReply::Done)
    );
}

#[test]
fn a_grant_lifts_its_one_path() {
    let g = gate_with(&[".git/hooks"], &[".env"]);
    let mut f = tree();
    assert_eq!(
        run(FsOp::Write { path: p(".git/hooks/pre-push"), content: b"x".to_vec() }, &g, &mut f),
        Ok(FsReply::Done)
    );
    assert!(run(FsOp::Write { path: p(".git/config"), content: b"x".to_vec() }, &g, &mut f).is_err());
    assert_eq!(
        run(FsOp::Read { path: p(".env") }, &g, &mut f),
        Ok(FsReply::Read(b"TOKEN=hunter2\n".to_vec()))
    );
    assert!(run(FsOp::Read { path: p(".ENV") }, &g, &mut f).is_err());
    let outside = ToolPolicy::new(&PolicyConfig {
        project: "/p".into(),
        allow_secret: vec!["/etc/shadow".into()],
        ..PolicyConfig::default()
    });
    assert!(outside.is_err());
}
