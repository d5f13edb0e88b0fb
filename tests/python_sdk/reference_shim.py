"""Only for runs against Python ipybox 0.9.2 (scripts/python-sdk-check.sh --reference).

0.9.2's KernelClient.stream() ends a cell at the shell channel's `execute_reply`. The Jupyter
protocol does not order the shell and IOPub channels, and through the kernel gateway the reply
often overtakes the cell's last `stream` messages (always under load: on a busy 2-core machine 5
to 30 % of `print` outputs are lost, the result's text is None and the output shows up as a stray
message of the next cell). That is a race in 0.9.2, not behaviour ipybox-rs copies, so for the
reference run this shim holds an `execute_reply` back until the IOPub `status: idle` of the same
request has been read (the ordering 0.9.2 assumes). Nothing else of 0.9.2 is changed.
Disable with IPYBOX_REFERENCE_SHIM=0 to see 0.9.2 unaided.
"""

from collections import deque


def install() -> None:
    from ipybox.kernel_mgr.client import KernelClient

    if getattr(KernelClient, "_reference_shim", False):
        return
    read_message = KernelClient._read_message

    async def _read_message(self) -> dict:
        state = self.__dict__.setdefault("_reference_shim_state", {"ready": deque(), "held": {}, "idle": set()})
        if state["ready"]:
            return state["ready"].popleft()
        while True:
            msg = await read_message(self)
            msg_id = msg.get("parent_header", {}).get("msg_id")
            msg_type = msg.get("msg_type")
            if msg_type == "execute_reply" and msg_id not in state["idle"]:
                state["held"][msg_id] = msg  # wait for the request's IOPub idle
                continue
            if msg_type == "status" and msg.get("content", {}).get("execution_state") == "idle":
                held = state["held"].pop(msg_id, None)
                if held is not None:
                    state["ready"].append(held)
                else:
                    state["idle"].add(msg_id)
            if msg_type == "execute_reply":
                state["idle"].discard(msg_id)
            return msg

    KernelClient._read_message = _read_message
    KernelClient._reference_shim = True
