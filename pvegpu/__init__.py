"""pvegpu: provision a multi-GPU LLM inference node on Proxmox VE, and keep it standing.

Layers (one job each; imports point down only):

    deploy/*.py          entry points: pick roles by host group; no logic
    roles/               @deploy compositions, in order; no parsing, no shell strings
    pvegpu.operations    diff desired vs observed -> commands / API calls, or host.noop(reason)
    pvegpu.plan          pure functions: (spec, observed) -> desired state; no I/O, no pyinfra
    pvegpu.facts         observe hosts; every remote command line is assembled here, parsed by pure functions
    pvegpu.models        pydantic specs (declared) and frozen dataclasses (observed)

`pvegpu.cli` is the offline command line (`pvegpu topology`, ...): it reads a captured /sys tree with the
same command and parser the facts use on a live host.
"""
