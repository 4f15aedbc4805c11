#!/bin/sh
# gser-demo's receiver, sent what anyone who reaches its port can send (a
# hello of another transport version, a hello cut short, bytes that are no
# hello), goes on listening and serves the real sender that comes next.
# Usage: demo_stranger.sh GSER_DEMO PYTHON
set -eu
demo=$1
py=$2
dir=$(mktemp -d)
rpid=
cleanup() {
    [ -n "$rpid" ] && kill "$rpid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$demo" --role recv --host 127.0.0.1 --port 0 --rows 2000 --cols 4 --iters 2 --family host --memory host \
    >"$dir/recv.out" 2>"$dir/recv.err" &
rpid=$!
port=
for _ in $(seq 1 300); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$dir/recv.out")
    [ -n "$port" ] && break
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.1
done
[ -n "$port" ] || { echo "the receiver did not start"; cat "$dir/recv.err"; exit 1; }
# The strangers, one connection each, each read until the receiver closes it.
"$py" - "$port" <<'PY'
import socket, struct, sys
port = int(sys.argv[1])
magic = b"\x89GSERUCX"
def hello(version):
    return magic + struct.pack("<IIIIII", version, 0, 0, 0, 0, 0) + bytes(32)
for what, data in [("another version", hello(99)), ("a hello cut short", hello(99)[:40]),
                   ("no hello", b"GET / HTTP/1.1\r\n\r\n")]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    if len(data) < 64:
        s.shutdown(socket.SHUT_WR)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()
    print("sent", what)
PY
kill -0 "$rpid" 2>/dev/null || { echo "the receiver stopped on a stranger's bytes:"; cat "$dir/recv.err"; exit 1; }
"$demo" --role send --host 127.0.0.1 --port "$port" --rows 2000 --cols 4 --iters 2 --family host --memory host
status=0
wait "$rpid" || status=$?
rpid=
cat "$dir/recv.out" "$dir/recv.err"
[ "$status" -eq 0 ] || { echo "receiver exit status $status"; exit 1; }
grep -q "2 transfers received, 2 verified" "$dir/recv.out"
grep -q "still listening" "$dir/recv.err"
