"""The operator's machine: the guests' SSH host keys and addresses (`guest_keys`), the records of creates in
flight (`create_records`), the probe of a guest's host key (`host_key_probe`), files written
whole (`files`)."""
