"""The pre-start hookscript's entry point: `python3 pvegpu-hook.pyz [options] VMID PHASE`, and the node's
gauges timer's check: `python3 pvegpu-hook.pyz --gauges [options] VMID` (live_gauges.py: reads as
`pre-start` does, decides as `check` mode would, writes only its own textfile, prints nothing).

Proxmox runs the wrapper (`<snippets>/pvegpu-hook`, written by pvegpu) as `pvegpu-hook <vmid> <phase>`; the
wrapper adds the options the inventory gives (`--mode`, `--prefix`, `--owner`, `--sysfs-root`); without
`--owner` no mapping is pvegpu's, so none is repaired. Phases other than `pre-start` exit 0 at once. On
`pre-start` the hook reads the VM's config and /etc/pve/mapping/pci.cfg (the files Proxmox's own check reads
next), the node's PCI hardware, decides (decide.py), prints its lines to the task log, writes the repairs
with `pvesh set ... --digest` and exits 0 (start) or 1 (refused: the VM does not start). Last, it writes its
result, the time and each GPU mapping's health after its repairs to the node exporter's textfile directory
(`pvegpu_hook.prom`, pvegpu/plan/gauges.py), when that directory exists; an unexpected error writes `failed`.

Each repair re-reads pci.cfg and writes only when the mapping still holds what the decision was made on, with
that file's digest: a concurrent edit is never overwritten; the start then fails saying so, and the next start
decides again. When the hook cannot read what it decides on (a missing file, a hardware read that fails) it
says so and exits 0: it repairs nothing then, and Proxmox's own mapping check decides the start.

An unexpected error inside the hook (a bug, a read the hook does not foresee) must not keep the VM down:
Proxmox refuses the start on any non-zero exit of `pre-start` (PVE::GuestHelpers::exec_hookscript with
stop_on_error), while its own mapping check still runs after the hook. So `main` prints one line
(`failure_line`) to the task log, sends it to the journal (syslog, tag `pvegpu-hook`) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import syslog
from collections.abc import Sequence
from pathlib import Path

PRE_START = "pre-start"
MODES = ("repair", "check")
PVESH = "/usr/bin/pvesh"
TIMEOUT_S = 20.0
JOURNAL_TAG = "pvegpu-hook"  # the journal tag of the hook's lines (main.py and the wrapper, bundle.py)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the hook (module docstring); the exit status Proxmox reads."""
    args = _parser().parse_args(argv)
    if args.gauges:
        return _live_gauges(args)
    if args.phase != PRE_START:
        return 0
    try:
        from pvegpu.hook.decide import Mode, Start  # noqa: PLC0415 - only pre-start pays for the planner's import
        from pvegpu.hook.pre_start import pre_start  # noqa: PLC0415

        node = os.uname().nodename.split(".")[0]
        start = Start(args.vmid, node, Mode(args.mode), args.prefix, args.owner)
        textfiles = None if args.textfile_dir is None else Path(args.textfile_dir)
        return pre_start(
            start, Path(args.pve_root), Path(args.sysfs_root), args.pvesh, args.timeout, textfiles=textfiles
        )
    except Exception as error:  # any failure leaves the start to Proxmox (module docstring)
        line = failure_line(args.vmid, error)
        print(line, flush=True)
        syslog.openlog(JOURNAL_TAG)
        syslog.syslog(syslog.LOG_WARNING, line)
        _failed_gauges(args)
        return 0


def _live_gauges(args: argparse.Namespace) -> int:
    """`--gauges`: the node's timer's check (live_gauges.py); any failure is one line on stderr, exit 1."""
    try:
        from pvegpu.hook.decide import Mode, Start  # noqa: PLC0415
        from pvegpu.hook.live_gauges import live_gauges  # noqa: PLC0415

        node = os.uname().nodename.split(".")[0]
        start = Start(args.vmid, node, Mode.CHECK, args.prefix, args.owner)
        textfiles = None if args.textfile_dir is None else Path(args.textfile_dir)
        return live_gauges(start, Path(args.pve_root), Path(args.sysfs_root), args.timeout, textfiles)
    except Exception as error:
        print(failure_line(args.vmid, error, gauges=True), file=sys.stderr)
        return 1


def _failed_gauges(args: argparse.Namespace) -> None:
    """The `failed` result in the hook's textfile, when the hook's own modules still import."""
    try:
        from pvegpu.hook.decide import Mode, Start  # noqa: PLC0415
        from pvegpu.hook.pre_start import gauges_path, write_gauges  # noqa: PLC0415

        node = os.uname().nodename.split(".")[0]
        start = Start(args.vmid, node, Mode(args.mode), args.prefix, args.owner)
        textfiles = None if args.textfile_dir is None else Path(args.textfile_dir)
        write_gauges(gauges_path(textfiles), start, "failed")
    except Exception:  # the failure is already logged; the start goes on
        return


def failure_line(vmid: int, error: Exception, *, gauges: bool = False) -> str:
    """The one line of an unexpected error (module docstring), the error's text on that line; `gauges`:
    of the `--gauges` check."""
    said = "; ".join(part.strip() for part in str(error).splitlines() if part.strip())
    what = f"{type(error).__name__}: {said}" if said else type(error).__name__
    if gauges:
        return f"pvegpu: VM {vmid}: the mappings' check failed ({what}); the gauges were not written"
    return (
        f"pvegpu: VM {vmid}: the hook failed ({what}); the start goes on without pvegpu's repair and "
        "Proxmox's own mapping check decides"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pvegpu-hook", description="pvegpu's pre-start hookscript")
    parser.add_argument("--mode", choices=MODES, default=MODES[0])
    parser.add_argument("--prefix", default="gpu", help="mapping ids are PREFIX0, PREFIX1, ...")
    parser.add_argument("--owner", default="", help="the id in pvegpu's mark: only its mappings are repaired")
    parser.add_argument("--sysfs-root", default="/sys")
    parser.add_argument("--pve-root", default="/", help="where /etc/pve is (tests)")
    parser.add_argument("--pvesh", default=PVESH)
    parser.add_argument("--textfile-dir", help="the node exporter's textfile directory (default: Debian's)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per command it runs")
    parser.add_argument(
        "--gauges",
        action="store_true",
        help="only check the VM's mappings as check mode would and write pvegpu_mappings.prom (no PHASE)",
    )
    parser.add_argument("vmid", type=int)
    parser.add_argument("phase", nargs="?", default="")
    return parser


if __name__ == "__main__":
    sys.exit(main())
