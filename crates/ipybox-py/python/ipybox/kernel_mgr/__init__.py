"""Python ipybox 0.9.2's kernel management (`KernelClient`, `KernelGateway`). ipybox-rs runs and
talks to its kernels in Rust; see `ipybox.kernel_mgr.client` and `ipybox.kernel_mgr.server` for
what replaces each name."""
