"""`pyinfra INVENTORY deploy/bench.py`: SGLang's serving benchmark on each serving host (groups `vm_guests`,
`lxc_guests`, `baremetal_hosts`) at concurrency 1 and N, results saved, tabled and plotted on this machine
(roles/bench.py). Every other host is left alone."""

from pvegpu.models.groups import SERVING
from pvegpu.run.dispatch import dispatch
from roles.bench import bench

dispatch("deploy/bench.py", [(SERVING, [bench])])
