#!/usr/bin/env bash
# port_race.sh: does another process take MASTER_PORT before rank 0 binds
# it? Runs JOBS one-rank jobs in a row under `pprun launch`, each binding
# MASTER_PORT (with SO_REUSEADDR, as torch's TCPStore does) 0.3 s after it
# starts (where torch would be importing), while a churner keeps most of
# the kernel's ephemeral ports (ip_local_port_range) bound and rebinds
# them as fast as it can: the traffic of a busy machine, packed. Prints
# how many jobs found their port taken.
#
#   bench/port_race.sh [PPRUN] [JOBS]      (default build/pprun, 200)
set -uo pipefail
pprun=${1:-build/pprun}
jobs=${2:-200}
read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
held=$(( (hi - lo) * 3 / 4 ))
limit=$(ulimit -Hn)
[ "$limit" != unlimited ] && [ "$held" -gt $((limit - 1024)) ] && held=$((limit - 1024)) # held within the fd limit
ulimit -n $((held + 1024))
python3 - "$held" <<'PY' &
import collections, socket, sys
held, ring = int(sys.argv[1]), collections.deque()
while True:  # bind(0): a port from the ephemeral range, kept until `held` newer ones
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", 0))
    except OSError:
        s.close()
        continue
    ring.append(s)
    if len(ring) > held:
        ring.popleft().close()
PY
churn=$!
trap 'kill $churn 2>/dev/null' EXIT
sleep 2
taken=0
for i in $(seq "$jobs"); do
  "$pprun" launch --nproc-per-node 1 -- python3 -c '
import os, socket, sys, time
time.sleep(0.3)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("", int(os.environ["MASTER_PORT"])))
    s.listen()
except OSError as e:
    print("MASTER_PORT", os.environ["MASTER_PORT"], "taken:", e)
    sys.exit(3)
' >/tmp/port_race.$$ 2>&1 || { taken=$((taken + 1)); grep -m1 taken /tmp/port_race.$$; }
done
rm -f /tmp/port_race.$$
echo "$pprun: $taken of $jobs jobs found MASTER_PORT taken (ephemeral range $lo-$hi, $held ports held by the churner)"
