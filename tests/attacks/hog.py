"""A memory hog: take argv[1] MiB, one touched MiB at a time, saying after
each how much it holds; `MemoryError` ends it with a line that says so (a
kill by the kernel ends it without one)."""
import json
import sys

want = int(sys.argv[1])
held = []
try:
    for i in range(want):
        held.append(bytearray(b"\1" * (1 << 20)))
        print(json.dumps({"held": len(held)}), flush=True)
except MemoryError:
    print(json.dumps({"refused_at": len(held)}), flush=True)
    sys.exit(3)
