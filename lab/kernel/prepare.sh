#!/usr/bin/env bash
# lab/kernel/prepare.sh - the kernel tier's kernel and initramfs, built once and cached; idempotent.
#
#   bash lab/kernel/prepare.sh        prints the cache directory (vmlinux, initrd.gz) on stdout
#
# Cache: ${PVEGPU_LAB_CACHE:-/var/cache/pvegpu-lab}/kernel/
#   vmlinux          Debian's kernel, uncompressed. QEMU boots it through its PVH entry (Debian builds with
#                    CONFIG_PVH=y), which skips the bzImage's xz decompression: ~4.5 s of every boot under TCG.
#                    Taken from the package's /boot/vmlinuz-*: its payload is one xz stream (magic fd 37 7a 58
#                    5a 00), decompressed here with python3's lzma (the kernel's scripts/extract-vmlinux does
#                    the same with xz).
#   kernel-version   the package it came from: the linux-image-amd64 metapackage's current kernel, fetched
#                    with `apt-get download` from the configured apt sources (~70 MB, deleted after use);
#                    PVEGPU_LAB_KERNEL=<package> picks another. Delete the cache directory to refresh.
#   initrd.gz        busybox (busybox-static) + lab/kernel/init; rebuilt whenever init changes.
# Needs: apt, dpkg-deb, python3, cpio, gzip, busybox-static. Cold: ~10 s; cached: well under a second.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${PVEGPU_LAB_CACHE:-/var/cache/pvegpu-lab}/kernel
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one preparation at a time (bootstrap and a test run may race)
log() { printf 'lab/kernel/prepare.sh: %s\n' "$*" >&2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ ! -s $cache/vmlinux ]]; then
    package=${PVEGPU_LAB_KERNEL:-}
    if [[ -z $package ]]; then
        depends() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
        package=$(depends)
        if [[ -z $package ]]; then
            log "no apt lists for linux-image-amd64: apt-get update"
            apt-get update -qq
            package=$(depends)
        fi
        [[ -n $package ]] || { log "cannot tell which kernel linux-image-amd64 installs"; exit 1; }
    fi
    log "fetching $package (apt-get download)"
    (cd "$work" && apt-get download -q -o APT::Sandbox::User=root "$package" >&2)
    dpkg-deb --fsys-tarfile "$work"/*.deb | tar -x -C "$work" --wildcards './boot/vmlinuz-*'
    python3 - "$work"/boot/vmlinuz-* "$cache/vmlinux.new" <<'PY'
import lzma, sys
image = open(sys.argv[1], "rb").read()
start = image.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit(f"{sys.argv[1]}: no xz payload (not a Debian xz-compressed bzImage?)")
kernel = lzma.LZMADecompressor().decompress(image[start:])
if kernel[:4] != b"\x7fELF":
    sys.exit(f"{sys.argv[1]}: the xz payload is not an ELF vmlinux")
open(sys.argv[2], "wb").write(kernel)
PY
    mv "$cache/vmlinux.new" "$cache/vmlinux"  # atomic: a cut-short run leaves no half vmlinux
    echo "$package" >"$cache/kernel-version"
    log "cached $cache/vmlinux ($package)"
fi

stamp=$(cat "$here/init" /bin/busybox | sha256sum | cut -c1-16)
if [[ ! -s $cache/initrd.gz || $(cat "$cache/initrd.stamp" 2>/dev/null) != "$stamp" ]]; then
    root=$work/initramfs
    mkdir -p "$root"/{bin,proc,sys,dev}
    cp /bin/busybox "$root/bin/busybox"
    install -m 755 "$here/init" "$root/init"
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -9) >"$cache/initrd.gz.new"
    mv "$cache/initrd.gz.new" "$cache/initrd.gz"
    echo "$stamp" >"$cache/initrd.stamp"
    log "built $cache/initrd.gz"
fi
echo "$cache"
