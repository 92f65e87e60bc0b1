#!/bin/busybox sh
# PID 1 of the test VM: mounts a pure cgroup v2 system, runs every test binary in /tests and
# prints one QOSLET-VM-* line per step for the host to parse, then powers off.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TMPDIR=/tmp QOSLET_VM=1 RUST_BACKTRACE=1
export QOSLET_TEST_HOG=/bin/qoslet-test-hog

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

# Tests that serve on 127.0.0.1 or resolve localhost need loopback and /etc/hosts.
ip link set lo up
mkdir -p /etc
echo "127.0.0.1 localhost" > /etc/hosts

# Every controller the kernel offers, for the tests' own child cgroups.
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || echo "QOSLET-VM-WARN cannot enable $c"
done

echo "QOSLET-VM-KERNEL $(uname -r)"
# An image built for one job (the peers bench, xtask/src/vm/peers.sh) runs it instead of the tests.
if [ -f /main.sh ]; then . /main.sh; fi
echo "QOSLET-VM-CGROUP v2 controllers=$(cat /sys/fs/cgroup/cgroup.subtree_control | tr ' ' ',')"

total_passed=0
total_failed=0
total_ignored=0
for t in /tests/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "QOSLET-VM-BINARY-START name=$name"
    "$t" --test-threads=1 > /tmp/out 2>&1
    rc=$?
    cat /tmp/out
    # libtest's summary: "test result: ok. 3 passed; 0 failed; 1 ignored; ..."
    set -- $(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' /tmp/out) 0 0 0
    passed=$1 failed=$2 ignored=$3
    # A binary that crashed before its summary still counts as a failure.
    if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
    echo "QOSLET-VM-BINARY name=$name rc=$rc passed=$passed failed=$failed ignored=$ignored"
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    total_ignored=$((total_ignored + ignored))
done

echo "QOSLET-VM-RESULT passed=$total_passed failed=$total_failed ignored=$total_ignored"
sync
poweroff -f
