"""Roles: one `@deploy` per module, a table of contents over the run's plan (`pvegpu.run`): operations in
order. No role imports another (roles.site composes them), reads a fact, plans, parses or builds a shell
string."""
