"""Python ipybox 0.9.2's `KernelClient`: in ipybox-rs, `ipybox.CodeExecutor` is the client."""

from ipybox._moved import moved

_INSTEAD = {
    "KernelClient": "use ipybox.CodeExecutor (execute(), stream(), reset(), cancel()); "
    "to run code on a kernel of a Jupyter server you started, pass CodeExecutor(kernel_gateway_url=...)",
    "ExecutionError": "use ipybox.CodeExecutionError (what CodeExecutor raises)",
    "ExecutionResult": "use ipybox.CodeExecutionResult (what CodeExecutor returns)",
    "*": "use ipybox.CodeExecutor",
}


def __getattr__(name: str):
    moved(__name__, name, _INSTEAD)
