"""Facts: observe hosts with one remote command each and parse the output in pure functions.

`hardware`: every PCI function (ids, class, driver, IOMMU group, NUMA node, bridge chain, link, BARs, slot)
read from sysfs in one command. `boot`: kernel command line, bootloader, Proxmox release.
Parse failures raise `errors.FactParseError`, which pyinfra reports as a per-host fact error.
"""
