"""Python ipybox 0.9.2's `KernelGateway` (it started a Jupyter Kernel Gateway): ipybox-rs starts
kernels itself, or uses a Jupyter server you run (`CodeExecutor(kernel_gateway_url=...)`)."""

from ipybox._moved import moved

_INSTEAD = {
    "KernelGateway": "ipybox.CodeExecutor starts its kernel itself (no gateway process); to use a Jupyter "
    "Kernel Gateway or Jupyter Server you run, pass CodeExecutor(kernel_gateway_url='http://host:port') "
    "(docs/remote-kernels.md)",
    "*": "ipybox.CodeExecutor starts its kernel itself (no gateway process)",
}


def __getattr__(name: str):
    moved(__name__, name, _INSTEAD)
