#!/usr/bin/env bash
# lab/kernel/boot.sh - boot a real kernel under QEMU (TCG, q35, emulated IOMMU) with a lab topology's devices
# and print the IOMMU groups it computed.
#
#   bash lab/kernel/boot.sh TOPOLOGY [intel|amd]      e.g. bash lab/kernel/boot.sh switches
#
# Prints the guest's report (lab/kernel/init: "=== BEGIN", "IOMMU ...", one "PCI <bdf> ... group=N path=..."
# line per function, "=== END") and a "TIMING ..." line; exits 0 iff the report is complete. The devices come
# from `python -m lab.kernel.qemu TOPOLOGY IOMMU` (what each description becomes in QEMU: see that module).
# Env: PYTHON (default python3) runs lab.kernel.qemu; PVEGPU_KERNEL_TIMEOUT (default 300 s) bounds the boot:
# only a hung guest needs it (a panic ends QEMU at once: panic=-1, -no-reboot), and a busy host slows a sound
# boot a lot (measured: ~30-60 s, 2 cores at load 8-10); PVEGPU_LAB_CACHE as for prepare.sh. KVM is not used:
# nested guests hang on the CI machines; TCG boots in ~4-7 s on a quiet host. `pcie_ports=compat` keeps the
# PCIe port services (pciehp, AER, PME) off the ports: pciehp alone costs seconds per boot under TCG. Groups
# do not depend on them: the PCI core enables ACS and the IOMMU core groups (tests/kernel checks that the
# qemu-probe layout still gives exactly the groups captured in shared/fixtures/real-kernel, which was booted
# without this option).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
topology=${1:?usage: boot.sh TOPOLOGY [intel|amd]}
iommu=${2:-intel}
cache=$(bash "$here/prepare.sh")
mapfile -t devices < <(cd "$here/../.." && PYTHONPATH=. "${PYTHON:-python3}" -m lab.kernel.qemu "$topology" "$iommu")
((${#devices[@]})) || exit 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# no_timer_check: at boot the kernel checks the IO-APIC timer by waiting ~65 ms of TSC for 5 PIT ticks; a
# TCG guest whose host CPUs are busy gets too few, and with interrupt remapping (intremap=on) there is no
# fallback: "Kernel panic - not syncing: timer doesn't work through Interrupt-remapped IO-APIC". QEMU's timer
# works; KVM and Hyper-V guests skip this check by themselves (arch/x86/kernel/kvm.c), TCG has no paravirt to
# say so. The other load-sensitive steps only warn (TSC/APIC calibration, clocksource watchdog).
cmdline="console=ttyS0 loglevel=3 panic=-1 no_timer_check ${iommu}_iommu=on iommu=pt pcie_ports=compat"
started=$(date +%s.%N)
status=0
timeout "${PVEGPU_KERNEL_TIMEOUT:-300}" qemu-system-x86_64 -accel tcg -cpu max -machine q35 -m 256 -smp 1 \
    -nodefaults -nographic -no-reboot -serial stdio -kernel "$cache/vmlinux" -initrd "$cache/initrd.gz" \
    -append "$cmdline" "${devices[@]}" >"$log" 2>&1 || status=$?
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
# The serial console adds \r; the report starts on a line of its own (init prints a newline first).
tr -d '\r' <"$log" | sed -n '/^=== BEGIN/,/^=== END/p'
echo "TIMING topology=$topology iommu=$iommu wall=${elapsed}s"
if ! tr -d '\r' <"$log" | grep -q '^=== END'; then
    echo "lab/kernel/boot.sh: no complete report (qemu exit $status); last output:" >&2
    tr -d '\r' <"$log" | tail -20 >&2
    exit 1
fi
