#!/usr/bin/env bash
# The worker instances' container firewall (batch.tf, local.container_firewall), applied for
# real: network namespaces stand for an instance (Docker's DOCKER-USER chain and masquerading,
# the ECS agent's DNAT of 169.254.170.2:80 to its credentials endpoint on 127.0.0.1:51679 and
# its introspection port 51678), a run's container on a Docker network (br-*), a container on
# docker0, and the VPC beyond (the metadata service, another link-local address, Amazon DNS,
# an NFS server, a web server). Before the firewall every probe must get through (the set-up is
# right); after it only the web server and Amazon DNS on port 53; the script is then run again
# and must change nothing.
#
#   sudo terraform/aws-batch/tests/container_firewall.sh
#
# Needs root, iproute2, iptables and python3; touches no network namespace but the four it
# makes (and removes). Prints PASS/FAIL per probe, then `container firewall: N passed, M
# failed`. Exit 0 when every probe behaves, 1 when one does not, 2 when it cannot run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module=$(dirname "$here")

for tool in ip iptables iptables-save python3; do
  command -v "$tool" >/dev/null || { echo "container firewall: could not run ($tool missing)"; exit 2; }
done
if [ "$(id -u)" != 0 ]; then
  echo "container firewall: could not run (needs root for ip netns and iptables)"
  exit 2
fi

work=$(mktemp -d)
H=clfw$$h C=clfw$$c D=clfw$$d O=clfw$$o
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in "$C" "$D" "$O" "$H"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The firewall script exactly as the user data writes it (a here-document without
# interpolation in batch.tf).
python3 - "$module/batch.tf" "$work/firewall.sh" <<'PY'
import re, sys, textwrap
src = open(sys.argv[1]).read()
m = re.search(r"\n  container_firewall = <<-EOT\n(.*?)\n  EOT\n", src, re.S)
if not m or "${" in m.group(1):
    sys.exit("container_firewall here-document not found (or it interpolates)")
open(sys.argv[2], "w").write(textwrap.dedent(m.group(1)) + "\n")
PY

cat >"$work/serve.py" <<'PY'
# serve.py tcp|udp ADDR PORT: answers every connection or datagram with "ok".
import socket, sys
kind, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "tcp":
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(16)
    while True:
        c, _ = s.accept(); c.sendall(b"ok\n"); c.close()
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        _, peer = s.recvfrom(512); s.sendto(b"ok\n", peer)
PY
cat >"$work/probe.py" <<'PY'
# probe.py tcp|udp ADDR PORT: exit 0 when "ok" comes back within 2 s.
import socket, sys
kind, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    if kind == "tcp":
        s = socket.create_connection((addr, port), timeout=2)
        s.settimeout(2); ok = s.recv(16).startswith(b"ok")
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
        s.sendto(b"?", (addr, port)); ok = s.recvfrom(16)[0].startswith(b"ok")
except OSError:
    ok = False
sys.exit(0 if ok else 1)
PY

for ns in "$H" "$C" "$D" "$O"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
# The instance: a run's network (br-*), docker0, and its interface to the VPC.
ip -n "$H" link add br-0123456789ab type bridge
ip -n "$H" link add docker0 type bridge
ip -n "$H" addr add 172.18.0.1/16 dev br-0123456789ab
ip -n "$H" addr add 172.17.0.1/16 dev docker0
ip -n "$H" link add vethrun type veth peer name eth0 netns "$C"
ip -n "$H" link add vethdock type veth peer name eth0 netns "$D"
ip -n "$H" link set vethrun master br-0123456789ab
ip -n "$H" link set vethdock master docker0
ip -n "$H" link add ens5 type veth peer name eth0 netns "$O"
ip -n "$H" addr add 10.9.0.1/24 dev ens5
for l in br-0123456789ab docker0 vethrun vethdock ens5; do ip -n "$H" link set "$l" up; done
ip -n "$H" route add default via 10.9.0.2
ip netns exec "$H" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.route_localnet=1
# The containers.
ip -n "$C" addr add 172.18.0.2/16 dev eth0
ip -n "$D" addr add 172.17.0.2/16 dev eth0
for ns in "$C" "$D"; do ip -n "$ns" link set eth0 up; done
ip -n "$C" route add default via 172.18.0.1
ip -n "$D" route add default via 172.17.0.1
# The VPC: a web server and an NFS server (10.9.0.2), the metadata service, Amazon Time Sync
# and Amazon DNS at their link-local addresses.
ip -n "$O" addr add 10.9.0.2/24 dev eth0
for a in 169.254.169.254 169.254.169.123 169.254.169.253; do ip -n "$O" addr add "$a/32" dev lo; done
ip -n "$O" link set eth0 up
ip -n "$O" route add default via 10.9.0.1
# Docker's and the ECS agent's own rules.
hipt() { ip netns exec "$H" iptables -w 30 "$@"; }
hipt -t nat -A POSTROUTING -s 172.16.0.0/12 -o ens5 -j MASQUERADE
hipt -N DOCKER-USER
hipt -A DOCKER-USER -j RETURN
hipt -A FORWARD -j DOCKER-USER
hipt -t nat -A PREROUTING -p tcp -d 169.254.170.2 --dport 80 -j DNAT --to-destination 127.0.0.1:51679

serve() {
  ip netns exec "$1" python3 "$work/serve.py" "$2" "$3" "$4" &
  pids+=($!)
}
serve "$O" tcp 10.9.0.2 80
serve "$O" tcp 10.9.0.2 2049
serve "$O" udp 10.9.0.2 2049
serve "$O" tcp 169.254.169.254 80
serve "$O" tcp 169.254.169.123 80
serve "$O" udp 169.254.169.253 53
serve "$O" tcp 169.254.169.253 53
serve "$H" tcp 127.0.0.1 51679
serve "$H" tcp 0.0.0.0 51678
sleep 1

passed=0 failed=0
# expect NAME NS open|blocked tcp|udp ADDR PORT
expect() {
  local name=$1 ns=$2 want=$3 got=blocked
  shift 3
  if ip netns exec "$ns" python3 "$work/probe.py" "$@"; then got=open; fi
  if [ "$got" = "$want" ]; then
    passed=$((passed + 1))
    echo "PASS $name: $* $got"
  else
    failed=$((failed + 1))
    echo "FAIL $name: $* $got, expected $want"
  fi
}
probes() { # $1: the state the guarded destinations must be in
  local phase=$1 guarded=$2 ns gw who
  for who in run docker0; do
    if [ "$who" = run ]; then ns=$C gw=172.18.0.1; else ns=$D gw=172.17.0.1; fi
    expect "$phase, $who: the metadata service" "$ns" "$guarded" tcp 169.254.169.254 80
    expect "$phase, $who: another link-local address" "$ns" "$guarded" tcp 169.254.169.123 80
    expect "$phase, $who: the ECS credentials endpoint" "$ns" "$guarded" tcp 169.254.170.2 80
    expect "$phase, $who: the ECS agent's introspection port" "$ns" "$guarded" tcp "$gw" 51678
    expect "$phase, $who: NFS over TCP" "$ns" "$guarded" tcp 10.9.0.2 2049
    expect "$phase, $who: NFS over UDP" "$ns" "$guarded" udp 10.9.0.2 2049
    expect "$phase, $who: a web server" "$ns" open tcp 10.9.0.2 80
    expect "$phase, $who: Amazon DNS over UDP" "$ns" open udp 169.254.169.253 53
    expect "$phase, $who: Amazon DNS over TCP" "$ns" open tcp 169.254.169.253 53
  done
}

probes "without the firewall" open
ip netns exec "$H" bash "$work/firewall.sh"
probes "with the firewall" blocked
ip netns exec "$H" iptables-save -t filter | grep -v '^[#:]' | sed 's/\[[0-9:]*\]//' >"$work/once"
ip netns exec "$H" bash "$work/firewall.sh"
ip netns exec "$H" iptables-save -t filter | grep -v '^[#:]' | sed 's/\[[0-9:]*\]//' >"$work/twice"
if cmp -s "$work/once" "$work/twice"; then
  passed=$((passed + 1))
  echo "PASS run again: the rules are the same"
else
  failed=$((failed + 1))
  echo "FAIL run again: the rules changed"
  diff "$work/once" "$work/twice" || true
fi
probes "run again" blocked

echo "container firewall: $passed passed, $failed failed"
[ "$failed" = 0 ]
