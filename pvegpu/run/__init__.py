"""The run's per-host memory: each host's plan computed once (`plan`), the node's and each host's state read
once (`node_state`, `host_state`), what a cut connection or a step reports (`progress`), which groups a deploy
acts on (`dispatch`, `pyinfra_patches`), and waiting with a deadline (`wait`)."""
