# The peers bench VM's main (`cargo xtask bench peers`), sourced by init.sh once the pure
# cgroup v2 system is mounted: the whole machine is the node. Runs the bench driver, which
# prints QOSLET-VM-PEERS lines, then powers off.
mkdir -p /var/lib /var/log
# The kernel's OOM reports would interleave with the driver's lines on the one console; the
# driver reads them from the ring buffer instead.
dmesg -n 1
/bin/qoslet-bench-peers
echo "QOSLET-VM-PEERS-EXIT rc=$?"
for f in /run/peers/*/qoslet.log; do
    echo "QOSLET-VM-PEERS-LOG $f"
    grep -iE "warn|error" "$f" | head -n 20
done
sync
poweroff -f
