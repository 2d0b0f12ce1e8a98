"""The run's per-host memory: each host's plan computed once (`plan`; a serving host's SGLang plan: `serving`;
the NVIDIA driver's: `driver`; the lxc container's: `container`; the cluster's PCI mappings: `mappings`), the
node's and each host's state read once (`node_state`, `host_state`; sent as pyinfra connects, from the
deploy's last run: `early_read`), the `vm` step's API reads at once
(`read_ahead`), the doctor's reads (`reports`), what a cut connection or a step reports (`progress`), which
groups a deploy acts on (`dispatch`, `pyinfra_patches`), when a unit's file needs systemd's reload (`units`),
and waiting with a deadline (`wait`)."""
