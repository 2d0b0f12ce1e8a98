"""pyinfra operations: diff desired state against facts, yield only the commands needed, or say why not."""
