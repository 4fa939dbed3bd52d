#!/usr/bin/env python3
"""Write the seed corpus of the `fuse_codec` target under fuzz/corpus/.
Deterministic: rerunning it rewrites the same files. Each input is the
bytes of one FUSE request as the kernel writes it (or one reply as the
server writes it), laid out as include/uapi/linux/fuse.h says."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "corpus", "fuse_codec")


def write(name, data):
    os.makedirs(CORPUS, exist_ok=True)
    with open(os.path.join(CORPUS, name), "wb") as f:
        f.write(data)


def req(opcode, body, unique=2, nodeid=1, extlen=0):
    length = 40 + len(body)
    return struct.pack("<IIQQIIIHH", length, opcode, unique, nodeid, 1000, 1000, 42, extlen, 0) + body


def reply(unique, error, body=b""):
    return struct.pack("<IiQ", 16 + len(body), error, unique) + body


write("init", req(26, struct.pack("<IIII", 7, 41, 131072, 0x73FFFFFB) + struct.pack("<I", 0x3F) + bytes(44)))
write("init_old", req(26, struct.pack("<IIII", 7, 31, 131072, 0x1)))
write("lookup", req(1, b"src\0"))
write("lookup_dotdot", req(1, b"..\0"))
write("lookup_unterminated", req(1, b"abc"))
write("forget", req(2, struct.pack("<Q", 3), nodeid=5))
write("batch_forget", req(42, struct.pack("<II", 2, 0) + struct.pack("<QQQQ", 5, 1, 6, 2)))
write("batch_forget_lies", req(42, struct.pack("<II", 0xFFFFFFFF, 0) + struct.pack("<QQ", 5, 1)))
write("getattr_fh", req(3, struct.pack("<IIQ", 1, 0, 9)))
write("setattr_size", req(4, struct.pack("<IIQQQQQQIIIIIIII", 8, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
write("mkdir", req(9, struct.pack("<II", 0o755, 0o022) + b"newdir\0"))
write("rename2", req(45, struct.pack("<QII", 1, 1, 0) + b"a\0b\0"))
write("open", req(14, struct.pack("<II", 2, 0), nodeid=5))
write("create_excl", req(35, struct.pack("<IIII", 0o301, 0o644, 0o022, 0) + b"index.lock\0"))
write("read", req(15, struct.pack("<QQIIQII", 3, 4096, 131072, 0, 0, 0, 0), nodeid=5))
write("write", req(16, struct.pack("<QQIIQII", 3, 0, 5, 0, 0, 0, 0) + b"hello", nodeid=5))
write("write_short", req(16, struct.pack("<QQIIQII", 3, 0, 500, 0, 0, 0, 0) + b"hello", nodeid=5))
write("readdirplus", req(44, struct.pack("<QQIIQII", 1, 0, 4096, 0, 0, 0, 0)))
write("release", req(18, struct.pack("<QIIQ", 3, 0, 0, 0), nodeid=5))
write("interrupt", req(36, struct.pack("<Q", 2), unique=9, nodeid=0))
write("symlink", req(6, b"link\0/etc/passwd\0"))
write("unknown", req(4242, b"whatever"))
write("extension", req(9, struct.pack("<II", 0o755, 0) + b"d\0" + bytes(5) + bytes(8), extlen=1))
write("reply_error", reply(2, -13))
write("reply_entry", reply(2, 0, struct.pack("<QQQQII", 2, 0, 1, 1, 0, 0) + bytes(88)))
write("reply_dir", struct.pack("<QQII", 2, 1, 1, 8) + b"a" + bytes(7) + struct.pack("<QQII", 3, 2, 2, 4) + b"bb" + bytes(6))
