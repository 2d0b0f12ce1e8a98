"""Roles: `@deploy` compositions of pvegpu operations, in order. No parsing, no shell strings."""
