"""The kernel tier: a real Linux kernel under QEMU (TCG, emulated IOMMU) computes the IOMMU groups."""
