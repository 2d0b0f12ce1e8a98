"""pyinfra group data for every host (`all`) of any inventory pyinfra loads from the repository root."""

from pvegpu.pve.nodelay import nodelay_transport

# TCP_NODELAY on pyinfra's SSH connections (pvegpu/pve/nodelay.py says why).
ssh_paramiko_connect_kwargs = {"transport_factory": nodelay_transport}
