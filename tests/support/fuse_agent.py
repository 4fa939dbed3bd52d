"""An agent that knows nothing of airlock: ordinary file calls only.

Run under `airlock run --allow-rw . -- python3 fuse_agent.py` from the
project directory. It walks the project, reads and writes files with
`open` and `pathlib`, makes directories, moves and removes files, and
prints one JSON object saying what it saw, for the test to check against
the host."""

import json
import os
import pathlib
import shutil
import sys

out = {}

# os.walk: every directory and file of the project, as the agent sees it.
seen = []
for d, dirs, files in os.walk("."):
    dirs.sort()
    for f in sorted(files):
        seen.append(os.path.normpath(os.path.join(d, f)))
out["walk"] = seen

# open for reading, pathlib for reading.
with open("src/main.txt") as f:
    out["main"] = f.read()
out["readme"] = pathlib.Path("README.md").read_text()
out["stat_size"] = os.stat("README.md").st_size

# os.makedirs, open for writing, pathlib for writing, appending.
os.makedirs("build/out/deep", exist_ok=True)
with open("build/out/deep/result.txt", "w") as f:
    f.write("computed\n")
with open("build/out/deep/result.txt", "a") as f:
    f.write("appended\n")
pathlib.Path("build/notes.md").write_text("# notes\n")

# shutil.move: a rename within the mount.
shutil.move("build/notes.md", "build/out/notes.md")

# A read-and-write open, a seek, a truncate.
with open("data.bin", "r+b") as f:
    f.seek(2)
    f.write(b"XY")
    f.truncate(6)

# os.remove, and a removed file is gone.
os.remove("old.log")
out["old_gone"] = not os.path.exists("old.log")

# A file unlinked while open is still read through its handle.
with open("tmp.txt", "w+") as f:
    f.write("still here")
    f.flush()
    os.remove("tmp.txt")
    f.seek(0)
    out["unlinked_read"] = f.read()

# Renames over an existing file, and an exclusive create that must fail.
pathlib.Path("a.txt").write_text("A")
pathlib.Path("b.txt").write_text("B")
os.replace("a.txt", "b.txt")
try:
    open("b.txt", "x")
    out["exclusive"] = "created"
except FileExistsError:
    out["exclusive"] = "refused"

# A directory tree removed whole.
os.makedirs("scratch/x/y")
pathlib.Path("scratch/x/y/z.txt").write_text("z")
shutil.rmtree("scratch")
out["scratch_gone"] = not os.path.exists("scratch")

# Outside every root: the host's files are not there.
try:
    open("/etc/shadow").read()
    out["outside"] = "read"
except OSError as e:
    out["outside"] = type(e).__name__

# Asked to: a name to show the listing hides and the open refuses.
hidden = sys.argv[1] if len(sys.argv) > 1 else None
if hidden:
    out["hidden_listed"] = hidden in os.listdir(os.path.dirname(hidden) or ".")
    try:
        open(hidden).read()
        out["hidden_read"] = "read"
    except OSError as e:
        out["hidden_read"] = f"{type(e).__name__}:{e.errno}"

print(json.dumps(out))
