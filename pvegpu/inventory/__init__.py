"""Inventory time, before any connection: every host's data validated (`validate`), the guests a node's data
adds to the inventory (`guests`), the profile inventories (`profiles`), the README's variable
tables (`tables`)."""
