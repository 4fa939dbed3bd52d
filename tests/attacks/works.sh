# What must keep working inside: one line per check, "name ok" or "name FAILED".
check() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name ok"; else echo "$name FAILED"; fi; }
check pipeline sh -c 'test "$(printf "b\na\n" | sort | head -n1 | tr a A)" = A'
check tmp sh -c 'echo scratch > /tmp/scratch.$$ && test "$(cat /tmp/scratch.$$)" = scratch && rm /tmp/scratch.$$'
check subprocess python3 -c 'import subprocess; assert subprocess.run(["echo", "hi"], capture_output=True).stdout == b"hi\n"'
check multiprocessing python3 -c '
import multiprocessing
if __name__ == "__main__":
    with multiprocessing.Pool(2) as p:
        assert p.map(abs, [-1, -2, 3]) == [1, 2, 3]
'
check git sh -c 'd=$(mktemp -d /tmp/g.XXXXXX) && cd "$d" && git init -q && echo x > f && git add f && git -c user.name=t -c user.email=t@t commit -qm one && test "$(git log --format=%s)" = one'
check nested sh -c 'test "$("$AIRLOCK" run -- sh -c "echo inner")" = inner'
check fs_cat sh -c 'test "$("$AIRLOCK" fs cat data.txt)" = data'
