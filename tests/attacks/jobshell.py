"""Not an attack: a minimal job-control shell, as the user's shell starts a
command from a terminal. Run as the session leader of the terminal on
fd 0; starts argv as a job in a process group of its own, gives it the
terminal, and reports on fd 2 what a shell would see: `shell: stopped`
when ^Z stops the job (then it continues it in the foreground, as `fg`),
`shell: exit CODE` when it ends (a negative CODE: the signal)."""
import os
import signal
import sys

signal.signal(signal.SIGTTOU, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpid())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execvp(sys.argv[1], sys.argv[1:])
# Both sides set the group, as shells do: whichever runs first wins, and
# the parent's call fails with EACCES once the child has exec'd.
try:
    os.setpgid(pid, pid)
except PermissionError:
    pass
os.tcsetpgrp(0, pid)
while True:
    _, st = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(st):
        os.tcsetpgrp(0, os.getpgrp())
        os.write(2, b"shell: stopped\n")
        os.tcsetpgrp(0, pid)
        os.killpg(pid, signal.SIGCONT)
        continue
    os.tcsetpgrp(0, os.getpgrp())
    os.write(2, b"shell: exit %d\n" % os.waitstatus_to_exitcode(st))
    sys.exit(0)
