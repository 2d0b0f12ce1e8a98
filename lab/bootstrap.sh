#!/usr/bin/env bash
# lab/bootstrap.sh - install everything the tests and the lab need; idempotent, well under a second when warm.
#
# Run as root on Debian 12. Steps, each skipped when its result is already there (cold times on 2 cores):
#   1. apt packages: one `apt-get update`, then install what is missing                     ~25 s
#   2. the project's virtual environment .venv: pip install -e '.[dev]'; redone when
#      pyproject.toml changes (its hash is stamped into the venv)                           ~20 s
#      and the checkout's bytecode: pyinfra's CLI writes none (sys.dont_write_bytecode), so
#      without it every run compiled pvegpu's modules from source (~0.25 s of CPU a run)       ~2 s
#   3. the lab's Debian root (lab/root.py): debootstrap, cached as a tarball in
#      $PVEGPU_LAB_CACHE (default /var/cache/pvegpu-lab), unpacked there once as the hosts'
#      shared base; rebuilt when its package list or recipe changes                        ~75 s
#   4. the kernel tier's kernel and initramfs, cached there too (lab/kernel/prepare.sh)      ~10 s
#   5. the wheels of the pinned huggingface_hub for the lab hosts' hub venv, from PyPI, cached
#      there too (lab/guest_payload.py hub_wheels)                                           ~5 s
# Keep $PVEGPU_LAB_CACHE where it survives between CI runs; where it does not, steps 3-4 rebuild it.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
started=$SECONDS
step() { printf '[bootstrap %3ds] %s\n' $((SECONDS - started)) "$*" >&2; }

if [[ $(id -u) != 0 ]]; then
    echo "lab/bootstrap.sh: run as root (apt, debootstrap, network namespaces and mounts need it)" >&2
    exit 1
fi

# 1. apt. The lab: debootstrap, iproute2 (netns, veth), util-linux (nsenter, unshare, mount), systemd-container
# (nspawn), openssh-client (ssh, ssh-keygen), zstd (root tarball). The kernel tier: qemu, busybox, cpio.
# The VM guests' stand-in apt repository (lab/guest_payload.py): dpkg-dev (dpkg-scanpackages), gnupg (signing).
# A lab VM start's QEMU check (lab/pve/qemu_cmdline.py): qemu-system-x86, ovmf (the OVMF pflash images).
packages=(busybox-static ca-certificates cpio debootstrap dpkg-dev gnupg iproute2 openssh-client ovmf
          python3-venv qemu-system-x86 systemd-container util-linux zstd)
installed=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }')
missing=()
for package in "${packages[@]}"; do
    grep -qx -- "$package" <<<"$installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    step "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. venv, from Debian's python3 (whatever `python3` PATH finds, e.g. a pyenv shim, may lack venv support).
venv=$repo/.venv
want=$(sha256sum "$repo/pyproject.toml" | cut -c1-16)
if [[ ! -x $venv/bin/python || $(cat "$venv/.pvegpu-pyproject" 2>/dev/null) != "$want" ]]; then
    step "venv: pip install -e '.[dev]' into $venv"
    [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
    (cd "$repo" && "$venv/bin/pip" install -q --disable-pip-version-check -e '.[dev]')
    echo "$want" >"$venv/.pvegpu-pyproject"
fi
# Only what changed since is compiled again (compileall compares each source's mtime and size).
"$venv/bin/python" -m compileall -q "$repo/pvegpu" "$repo/roles" "$repo/lab" "$repo/group_data" \
    "$repo/inventory" >/dev/null

# 3. the lab's root (prints the base directory; builds or unpacks what is missing)
base=$(cd "$repo" && "$venv/bin/python" -m lab.root)

# 4. the kernel tier (prints its cache directory)
kernel=$(bash "$repo/lab/kernel/prepare.sh")

# 5. huggingface_hub's wheels (the model fetch in the lab)
(cd "$repo" && "$venv/bin/python" -c 'from lab import guest_payload; guest_payload.hub_wheels()')

step "ready: venv $venv, lab base $base, kernel tier $kernel"
