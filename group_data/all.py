"""pyinfra group data for every host (`all`) of any inventory pyinfra loads from the repository root.

pyinfra loads it with the inventory, before it connects to any host: paramiko's log goes to pyinfra's debug
log from here (pvegpu/run/pyinfra_patches.py says why), so a failed first handshake is pyinfra's one line,
not paramiko's traceback; and each host's state read is sent as soon as pyinfra connects to it.
"""

from pvegpu.run.early_read import note_deploy, pyinfra_transport
from pvegpu.run.pyinfra_patches import route_paramiko_log

route_paramiko_log()
note_deploy()

# TCP_NODELAY on pyinfra's SSH connections (pvegpu/pve/nodelay.py says why), and each host's state read sent
# as soon as pyinfra connects to it, from the deploy's last run (pvegpu/run/early_read.py).
ssh_paramiko_connect_kwargs = {"transport_factory": pyinfra_transport}
