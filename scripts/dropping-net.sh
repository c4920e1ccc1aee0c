#!/usr/bin/env bash
# Run "$@" (after the hosts file $1) where names of TEST-NET-1 drop every packet: run it inside a fresh
# network and mount namespace (unshare -n -m). A veth pair without ARP whose far end holds no address
# (packets to 192.0.2.0/24 die there), and the hosts file $1 bound over /etc/hosts. Nothing leaves the
# machine. Used by tests/launch/test_fanout.py and benchmarks/startup.py (silent hosts).
#   unshare -n -m -- bash scripts/dropping-net.sh HOSTS_FILE COMMAND...
set -e
ip link set lo up
ip link add mldrop0 type veth peer name mldrop1
ip link set mldrop0 arp off up
ip link set mldrop1 up
ip addr add 192.0.2.1/24 dev mldrop0
mount --bind "$1" /etc/hosts
shift
exec "$@"
