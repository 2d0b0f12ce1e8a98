"""The NCCL profile in force as the doctor names it (pvegpu.run.serving.ServingNccl.describe)."""

from __future__ import annotations

from pvegpu.plan.nccl import plan_nccl
from pvegpu.run.serving import ServingNccl


def test_describe_names_the_profile_its_reason_and_settings() -> None:
    shm = ServingNccl(plan_nccl("vm", None, infiniband=False), None, p2p=False)
    assert shm.describe("vm") == (
        "NCCL profile SHM (profile vm: no P2P between passed-through GPUs): CUDA_DEVICE_MAX_CONNECTIONS=64 "
        "NCCL_BUFFSIZE=8388608 NCCL_DEBUG=INFO NCCL_IB_DISABLE=1 NCCL_MIN_NCHANNELS=32 NCCL_P2P_DISABLE=1 "
        "--enable-p2p-check --disable-custom-all-reduce"
    )
    proven = ServingNccl(plan_nccl("vm", None, infiniband=False, p2p=True), None, p2p=True)
    assert proven.describe("vm").startswith(
        "NCCL profile P2P (profile vm: P2P between the VM's GPUs is proven or forced, vm.p2p): "
    )
    assert "NCCL_P2P_DISABLE" not in proven.describe("vm")
