#!/usr/bin/env python3
"""Regenerate fuzz/corpus/pager deterministically.

The language (core/src/pager/fuzzing.rs): three config bytes (page size,
threshold, limit), then commands `cmd arg ...` where (cmd & 0x3f) % 9 picks the op
and cmd >> 6 the client: 0 wrap, 1 stream chunk, 2 page, 3 lines, 4 all,
5 search, 6 to-file, 7 client gone, 8 fail the next file op.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "corpus", "pager")


def wrap(data, arg=0, client=0):
    return bytes([0 + (client << 6), arg, len(data)]) + data


def chunk(data, stream=0, more=True, client=0):
    return bytes([1 + (client << 6), stream * 2 + (1 if more else 0), len(data)]) + data


def page(fd, n, client=0):
    return bytes([2 + (client << 6), fd, n])


def lines(fd, a, client=0):
    return bytes([3 + (client << 6), fd, a])


def all_(fd, client=0):
    return bytes([4 + (client << 6), fd])


def search(fd, q, client=0):
    return bytes([5 + (client << 6), fd, len(q)]) + q


def to_file(arg, extra=b"", client=0):
    return bytes([6 + (client << 6), arg]) + extra


def gone(client):
    return bytes([7 + (client << 6), 0])


def fail():
    return bytes([8, 1])


TEXT = b"alpha\nbeta\r\ngamma <&> \"q\"\n" + "é😀ß\n".encode() * 3
CASES = {
    "seed_flow": bytes([3, 9, 64]) + wrap(TEXT) + page(1, 1) + page(1, 2) + page(1, 7) + lines(1, 2) + all_(1) + search(1, b"a"),
    "long_line_pages": bytes([3, 5, 64]) + wrap(b"y" * 12 + b"\n") + page(1, 5) + all_(1),
    "binary_base64": bytes([4, 5, 64]) + wrap(bytes(range(0, 40))) + page(1, 1) + page(1, 3) + search(1, b"A") + to_file(0b0000_0100),
    "streams_interleaved": bytes([5, 5, 64]) + chunk(b"one\n", 0, True) + chunk(b"two\n", 0, True, client=1) + chunk(b"three\n", 0, False) + chunk(b"four\n", 0, False, client=1) + page(1, 1) + page(2, 1),
    "limit_reached": bytes([2, 1, 0]) + wrap(b"x" * 200) + wrap(b"y" * 200) + chunk(b"z" * 250, 0, True) + chunk(b"z" * 250, 0, True) + all_(1),
    "to_file_modes": bytes([3, 5, 64]) + wrap(TEXT) + to_file(0b0000_0100) + to_file(0b0000_0101) + to_file(0b0000_0110, bytes([2])) + to_file(0b0100_0100) + to_file(0b1000_0100 | 0x80),
    "failing_files": bytes([3, 5, 64]) + wrap(TEXT) + fail() + to_file(0b0000_0100) + fail() + to_file(0b0000_0110, bytes([1])),
    "death_mid_stream_and_job": bytes([3, 5, 64]) + wrap(TEXT, client=1) + chunk(b"half", 0, True, client=2) + gone(2) + to_file(0b0000_0100, client=1) + gone(1) + page(1, 1),
    "unknown_fds_and_ranges": bytes([3, 5, 64]) + wrap(TEXT) + page(7, 1) + page(3, 1) + lines(1, 0) + lines(1, 9) + search(1, b"") + search(1, b"\x01"),
    "user_input_threshold": bytes([3, 9, 64]) + wrap(b"0123456", arg=1) + wrap(b"0123456789ab", arg=1) + page(1, 1),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in CASES.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
