#!/bin/sh
# Run a command in a network namespace of its own that has loopback and
# nothing else. Dask's tests look up "this machine's address" (get_ip():
# the interface of the default route) and listen on 0.0.0.0; here there is
# no route but loopback, so every connection they make stays on 127.0.0.1.
# Exit 77 (ctest: skipped) when no namespace can be made (not root).
ns="gser-dask-$$"
# A run killed outright (a ctest timeout) leaves its namespace: remove those
# whose process is gone.
for old in $(ip netns list 2>/dev/null | sed -n 's/^\(gser-dask-[0-9]*\).*/\1/p'); do
    kill -0 "${old#gser-dask-}" 2>/dev/null || ip netns del "$old" 2>/dev/null
done
if ! ip netns add "$ns" 2>/dev/null; then
    echo "loopback_only.sh: cannot create a network namespace (needs root and iproute2): skipped" >&2
    exit 77
fi
trap 'ip netns del "$ns"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ip -n "$ns" link set lo up || exit 1
ip netns exec "$ns" "$@"
