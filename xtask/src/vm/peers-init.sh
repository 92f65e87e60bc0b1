#!/bin/busybox sh
# PID 1 of the peers bench VM (`cargo xtask bench peers`): a pure cgroup v2 machine that is the
# node as a whole; runs the bench driver, which prints QOSLET-VM-PEERS lines, then powers off.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp QOSLET_VM=1 RUST_BACKTRACE=1

mkdir -p /proc /sys /dev /tmp /root /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
mkdir -p /etc /var/lib /var/log
echo "127.0.0.1 localhost" > /etc/hosts
# The kernel's OOM reports would interleave with the driver's lines on the one console.
dmesg -n 1

for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || echo "QOSLET-VM-WARN cannot enable $c"
done

echo "QOSLET-VM-KERNEL $(uname -r)"
/bin/qoslet-bench-peers
echo "QOSLET-VM-PEERS-EXIT rc=$?"
for f in /run/peers/*/qoslet.log; do
    echo "QOSLET-VM-PEERS-LOG $f"
    grep -iE "warn|error" "$f" | head -n 20
done
sync
poweroff -f
