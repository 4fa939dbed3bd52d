"""user.* extended attributes on a host file outside every root. argv: its
directory and its name (airlock refuses to start a sandboxed child whose
arguments name a file it could not read, so the file is not named whole)."""
import os
import sys
from probe import probe

path = os.path.join(sys.argv[1], sys.argv[2])
probe("setxattr", lambda: os.setxattr(path, "user.pwned", b"x" * 1000))
probe("removexattr", lambda: os.removexattr(path, "user.keep"))
