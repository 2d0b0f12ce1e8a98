"""`pyinfra INVENTORY deploy/bench.py`: SGLang's serving benchmark on each serving host (groups `vm_guests`,
`lxc_guests`, `baremetal_hosts`) at concurrency 1 and N, results saved, tabled and plotted on this machine
(roles/bench.py)."""

from pyinfra.context import host

from roles.bench import bench

if {"vm_guests", "lxc_guests", "baremetal_hosts"} & set(host.groups):
    bench()
