//! The FUSE fuzz targets' entry points (`fuzz/fuzz_targets/fuse_*.rs`),
//! replayed over their corpora by `core/tests/fuzz_corpus.rs`.

use super::abi::opcode;
use super::codec::{self, Reply};

/// `fuse_codec`: any bytes as a request, and as the reply to every
/// opcode. Panics when a request read is not the one it writes back, or
/// a reply read is not the bytes it encodes to.
pub fn codec(data: &[u8]) {
    if let Ok(req) = codec::parse_request(data) {
        let bytes = codec::encode_request(&req);
        match codec::parse_request(&bytes) {
            Ok(again) => assert_eq!(again.op, req.op, "a request read back differs"),
            Err(e) => panic!("a request written by the codec is refused: {e:?}"),
        }
    }
    let ops = [
        opcode::INIT,
        opcode::LOOKUP,
        opcode::GETATTR,
        opcode::OPEN,
        opcode::CREATE,
        opcode::READ,
        opcode::WRITE,
        opcode::STATFS,
        opcode::GETXATTR,
        opcode::RELEASE,
    ];
    for op in ops {
        if let Ok(d) = codec::decode_reply(op, data) {
            // Data replies are their bytes; every other one has a fixed
            // layout, which encodes back to exactly what was read (but
            // for the fields the server leaves zero).
            let again = codec::encode_reply(d.unique, &d.reply);
            let back = codec::decode_reply(op, &again).expect("an encoded reply decodes");
            assert_eq!(back, d, "a reply read back differs");
            if let Reply::Data(_) | Reply::Error(_) | Reply::Empty = d.reply {
                assert_eq!(again, data, "a reply's bytes differ");
            }
        }
    }
    if let Ok(entries) = codec::decode_dir(data) {
        let mut buf = codec::DirBuf::new(usize::MAX);
        for e in &entries {
            assert!(buf.push(e));
        }
        assert_eq!(codec::decode_dir(&buf.into_bytes()).ok(), Some(entries));
    }
}
