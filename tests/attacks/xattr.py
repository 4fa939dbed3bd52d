"""user.* extended attributes on a host file outside every root. argv: path."""
import os
import sys
from probe import probe

path = sys.argv[1]
probe("setxattr", lambda: os.setxattr(path, "user.pwned", b"x" * 1000))
probe("removexattr", lambda: os.removexattr(path, "user.keep"))
