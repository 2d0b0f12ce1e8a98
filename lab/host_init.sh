#!/bin/bash
# host_init.sh ROOT CMDLINE_FILE HOSTNAME - PID 1 of a netns-mode lab host (see lab/hosts.py).
#
# Runs inside `unshare --mount --pid --uts --fork --kill-child` (private mounts, own PID namespace) entered into
# the host's network namespace. Mounts what sshd and pyinfra need into ROOT, makes ROOT the namespace's "/" with
# pivot_root (so this namespace does not pin other hosts' overlays the way a chroot would), then runs sshd and
# reaps orphans until it exits. ROOT/sys is NOT mounted over: it holds the host's fake sysfs tree.
set -euo pipefail
root=${1:?ROOT} cmdline=${2:?CMDLINE_FILE} name=${3:?HOSTNAME}

mount -t proc proc "$root/proc"
mount --bind "$cmdline" "$root/proc/cmdline"          # the host's fake kernel command line
mount -t tmpfs -o mode=755,size=16m tmpfs "$root/dev"
while read -r node major minor; do
    mknod -m 666 "$root/dev/$node" c "$major" "$minor"
done <<'EOF'
null 1 3
zero 1 5
full 1 7
random 1 8
urandom 1 9
tty 5 0
EOF
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
mount -t tmpfs -o mode=755,size=64m tmpfs "$root/run"
mkdir "$root/run/sshd"
mount -t tmpfs -o mode=1777,size=256m tmpfs "$root/tmp"
hostname "$name"

cd "$root"
pivot_root . .          # the old root now sits on top of the new one at "/"...
umount -l .             # ...and is detached here, with every other mount of the host machine
cd /
/usr/sbin/sshd -D -e &
wait "$!"
