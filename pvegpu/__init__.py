"""pvegpu: provision a multi-GPU LLM inference node on Proxmox VE, and keep it standing.

Layers (one job each; imports point down only, one import-linter contract each):

    deploy/*.py          entry points: pick roles by host group; no logic
    roles/               one @deploy each, a table of contents over the run's plan; no role imports a role
    pvegpu.operations    diff desired vs observed -> commands / API calls, or host.noop(reason)
    pvegpu.run           the run's per-host memory: plan_of, serving_plan_of, the node/host state read once,
                         read-ahead, progress, dispatch
    pvegpu.plan          pure functions: (spec, observed) -> desired state; no I/O, no pyinfra
    pvegpu.facts         observe hosts; every remote command line is assembled here, parsed by pure functions
    pvegpu.pve           the Proxmox API adapter: client, errors, transports (pvesh over SSH, https, local)
    pvegpu.inventory     inventory-time validation (before any connection), guests_of, profiles, README tables
    pvegpu.local         the operator's machine: guest keys, create records, host-key probe
    pvegpu.cli           the `pvegpu` command (offline topology/mapping) and its reports
    pvegpu.hook          the node's pre-start hook (standard library only)
    pvegpu.fetch         the model fetcher, uploaded alone (standard library and huggingface_hub only)
    pvegpu.models        pydantic specs (declared) and frozen dataclasses (observed)

`pvegpu.cli.main` is the offline command line (`pvegpu topology`, ...): it reads a captured /sys tree with the
same command and parser the facts use on a live host.
"""
