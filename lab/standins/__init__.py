"""STAND-INS for what a lab VM guest cannot have: the NVIDIA driver's userspace and SGLang.

The modules here run inside lab guests (Debian's python3, standard library only: pvegpu is not installed
there) and are packaged by `lab.guest_payload`: `nvidia_smi` becomes the stand-in `/usr/bin/nvidia-smi` of the
lab apt repository's `nvidia-driver-cuda` package, `sglang_serve` the `sglang` command of the stand-in
`sglang` wheel. Every output they produce says STAND-IN where a human could mistake it for the real thing.
"""
