"""STAND-INS for what a lab host cannot have: the NVIDIA driver (module, device files, userspace) and SGLang.

The modules here run inside lab hosts (Debian's python3, standard library only: pvegpu is not installed
there) and are packaged by `lab.guest_payload` into the lab apt repository and wheel: `nvidia_module` "loads"
the module for the `nvidia-kernel-open-dkms` package's maintainer scripts, `nvidia_modprobe` becomes
`/usr/bin/nvidia-modprobe` of the `nvidia-modprobe` package, `nvidia_smi` the `/usr/bin/nvidia-smi` of
`nvidia-driver-cuda`, `sglang_serve` the `sglang` command of the stand-in `sglang` wheel. Every output they
produce says STAND-IN where a human could mistake it for the real thing.
"""
