"""The pvegpu lab: Debian roots, hosts in network namespaces / nspawn, fake sysfs, QEMU kernel tier."""
