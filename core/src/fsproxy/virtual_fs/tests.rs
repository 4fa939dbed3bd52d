use super::*;
use proptest::prelude::*;

#[test]
fn names_count_against_the_byte_limit() {
    let mut v = VirtualFs::new(100, 10);
    let long = "n".repeat(60);
    v.open(&long, Mode::Write).unwrap();
    assert_eq!(v.bytes(), 60);
    let other = "m".repeat(41);
    let e = v.open(&other, Mode::Write).unwrap_err();
    assert_eq!(e.code, ErrorCode::Range);
    assert!(e.message.contains("--max-virtual-bytes"), "{}", e.message);
    // Reopening an existing name costs nothing more.
    v.open(&long, Mode::Append).unwrap();
    assert_eq!(v.bytes(), 60);
    // Directories' names count too.
    assert_eq!(v.mkdir(&other, false, false).unwrap_err().code, ErrorCode::Range);
}

#[test]
fn the_number_of_files_is_bounded() {
    let mut v = VirtualFs::new(1 << 20, 3);
    for n in ["a", "b", "c"] {
        v.open(n, Mode::Write).unwrap();
    }
    let e = v.open("d", Mode::ReadWrite).unwrap_err();
    assert!(e.message.contains("--max-virtual-files"), "{}", e.message);
    assert_eq!(v.files(), 3);
    // A read of a missing file creates nothing.
    assert_eq!(v.open("e", Mode::Read).unwrap_err().code, ErrorCode::NoEnt);
    // Nor may a directory be made past the limit.
    assert!(v.mkdir("d", false, false).unwrap_err().message.contains("--max-virtual-files"));
}

#[test]
fn truncation_gives_bytes_back() {
    let mut v = VirtualFs::new(100, 10);
    let id = v.open("f", Mode::Write).unwrap();
    let mut pos = 0;
    v.write(id, &mut pos, false, &[1; 50]).unwrap();
    assert_eq!(v.bytes(), 51);
    v.open("f", Mode::Write).unwrap();
    assert_eq!(v.bytes(), 1);
}

#[test]
fn a_removed_file_lives_on_through_its_handle_until_released() {
    let mut v = VirtualFs::new(1000, 10);
    let id = v.open("out/a.txt", Mode::ReadWrite).unwrap();
    let mut pos = 0;
    v.write(id, &mut pos, false, b"kept").unwrap();
    v.remove("out/a.txt", false).unwrap();
    assert_eq!(v.contents("out/a.txt"), None);
    // A new file under the old name is another file.
    let other = v.open("out/a.txt", Mode::Write).unwrap();
    assert_ne!(id, other);
    let mut at = 0;
    assert_eq!(v.read(id, &mut at, 10), b"kept");
    assert_eq!(v.files(), 2);
    v.release(id);
    assert_eq!(v.files(), 1);
    assert_eq!(v.bytes(), "out/a.txt".len() as u64);
}

#[test]
fn a_renamed_file_keeps_its_handles_and_a_replaced_one_its_readers() {
    let mut v = VirtualFs::new(1000, 10);
    let a = v.open("a", Mode::Write).unwrap();
    let (mut pa, mut pb) = (0, 0);
    v.write(a, &mut pa, false, b"A").unwrap();
    let b = v.open("b", Mode::Write).unwrap();
    v.write(b, &mut pb, false, b"B").unwrap();
    assert_eq!(v.rename("a", "b", true).unwrap_err().code, ErrorCode::Arg);
    v.rename("a", "b", false).unwrap();
    assert_eq!(v.contents("b"), Some(&b"A"[..]));
    assert_eq!(v.contents("a"), None);
    // Writes through the handle land in the file at its new name.
    v.write(a, &mut pa, false, b"2").unwrap();
    assert_eq!(v.contents("b"), Some(&b"A2"[..]));
    // The replaced file is still there for its handle.
    let mut at = 0;
    assert_eq!(v.read(b, &mut at, 10), b"B");
    v.release(b);
    v.release(a);
    assert_eq!(v.files(), 1);
    assert_eq!(v.bytes(), 1 + 2);
}

#[test]
fn directories_are_implicit_explicit_and_never_files() {
    let mut v = VirtualFs::new(1000, 20);
    v.open("out/new/deep.txt", Mode::Write).unwrap();
    assert!(v.is_dir("out") && v.is_dir("out/new") && v.is_dir(""));
    assert_eq!(v.stat("out", false).unwrap().kind, Kind::Dir);
    assert_eq!(v.open("out", Mode::Write).unwrap_err().code, ErrorCode::Perm);
    assert_eq!(v.open("out/new/deep.txt/x", Mode::Write).unwrap_err().code, ErrorCode::NoEnt);
    assert_eq!(v.mkdir("out", false, false).unwrap_err().code, ErrorCode::Arg);
    v.mkdir("out", true, false).unwrap();
    v.mkdir("empty", false, false).unwrap();
    let none = BTreeSet::new();
    let names = |p: &Page| p.entries.iter().map(|e| (e.name.clone(), e.kind)).collect::<Vec<_>>();
    let top = v.list("", None, 10, &["scratch".to_owned()].into()).unwrap();
    assert_eq!(
        names(&top),
        [("empty".into(), Kind::Dir), ("out".into(), Kind::Dir), ("scratch".into(), Kind::Dir)]
    );
    // Paged.
    let first = v.list("", None, 1, &none).unwrap();
    assert_eq!((names(&first), first.more), (vec![("empty".into(), Kind::Dir)], true));
    let second = v.list("", Some("empty"), 1, &none).unwrap();
    assert_eq!((names(&second), second.more), (vec![("out".into(), Kind::Dir)], false));
    assert_eq!(v.list("out/new/deep.txt", None, 10, &none).unwrap_err().code, ErrorCode::Arg);
    assert_eq!(v.list("nowhere", None, 10, &none).unwrap_err().code, ErrorCode::NoEnt);
    assert_eq!(v.remove("out", false).unwrap_err().code, ErrorCode::Arg);
    v.remove("empty", false).unwrap();
    assert_eq!(v.remove("empty", false).unwrap_err().code, ErrorCode::NoEnt);
    // A directory moves with what is in it.
    v.rename("out", "moved", false).unwrap();
    assert_eq!(v.contents("moved/new/deep.txt"), Some(&b""[..]));
    assert!(!v.is_dir("out"));
    assert_eq!(v.rename("moved", "moved/inner", false).unwrap_err().code, ErrorCode::Arg);
}

#[derive(Clone, Debug)]
enum Step {
    Open(u8, u8),
    Write(usize, u8),
    Close(usize),
    Mkdir(u8, bool),
    Remove(u8),
    Rename(u8, u8, bool),
}

fn name(n: u8) -> &'static str {
    ["a", "b", "a/x", "a/y", "b/x", "c/d/e", "c", "c/d"][usize::from(n % 8)]
}

proptest! {
    /// Whatever is opened, written, made, removed and renamed, the bytes
    /// and nodes counted are what a recount finds, and within the limits.
    #[test]
    fn the_counts_are_what_is_held(steps in proptest::collection::vec(
        prop_oneof![
            (any::<u8>(), 0u8..4).prop_map(|(n, m)| Step::Open(n, m)),
            (0usize..6, 0u8..40).prop_map(|(h, l)| Step::Write(h, l)),
            (0usize..6).prop_map(Step::Close),
            (any::<u8>(), any::<bool>()).prop_map(|(n, p)| Step::Mkdir(n, p)),
            any::<u8>().prop_map(Step::Remove),
            (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(a, b, n)| Step::Rename(a, b, n)),
        ],
        0..60,
    )) {
        let mut v = VirtualFs::new(120, 6);
        let mut open: Vec<(NodeId, u64)> = Vec::new();
        for s in steps {
            match s {
                Step::Open(n, m) => {
                    let mode = [Mode::Read, Mode::Write, Mode::Append, Mode::ReadWrite][usize::from(m)];
                    if let Ok(id) = v.open(name(n), mode) {
                        open.push((id, 0));
                    }
                }
                Step::Write(h, len) => {
                    if let Some((id, pos)) = open.get_mut(h) {
                        let _ = v.write(*id, pos, false, &vec![7; usize::from(len)]);
                    }
                }
                Step::Close(h) => {
                    if h < open.len() {
                        let (id, _) = open.remove(h);
                        v.release(id);
                    }
                }
                Step::Mkdir(n, p) => { let _ = v.mkdir(name(n), p, false); }
                Step::Remove(n) => { let _ = v.remove(name(n), false); }
                Step::Rename(a, b, n) => { let _ = v.rename(name(a), name(b), n); }
            }
            let names: u64 = v.names.keys().chain(v.dirs.iter()).map(|k| k.len() as u64).sum();
            let data: u64 = v.nodes.values().map(|n| n.data.len() as u64).sum();
            prop_assert_eq!(v.bytes(), names + data);
            prop_assert!(v.bytes() <= 120 && v.files() <= 6);
            // Every node is linked by one name or held open.
            for (id, node) in &v.nodes {
                let links = v.names.values().filter(|n| *n == id).count();
                prop_assert_eq!(links, usize::from(node.linked));
                prop_assert!(node.linked || node.opens > 0);
            }
            // No name is a file and a directory.
            for k in v.names.keys() {
                prop_assert!(!v.is_dir(k), "{} is both", k);
            }
        }
        for (id, _) in open {
            v.release(id);
        }
        prop_assert_eq!(v.nodes.len(), v.names.len());
    }
}
