"""A local stand-in for the Anthropic Messages API that plays a scripted model turn, so that a
whole Claude Code session (`claude -p`) runs offline against ipybox.

Usage: messages_standin.py PLAN.json LOG_DIR   (prints the port it listens on, then serves)

PLAN.json is a list of steps, one per answer of the main conversation, or an object whose keys
are prompts (what `claude -p PROMPT` was given) and whose values are such lists: each
conversation then plays the plan of its prompt (the text of its first user message; a
conversation continued with `--continue` keeps its first prompt, so its plan), and several
conversations, one after the other or side by side, can share one stand-in. Steps:
  {"tool": "<tool name>", "input": {...}}     the model calls a tool (streamed as input_json_delta)
  {"text": "..."}                             the model answers in text and ends its turn
A step may also say {"delay": SECONDS} (the model pauses that long before answering), and a
tool's input may hold "{handle}": the first ipybox session handle (`ipybox-s1.stdio.…`) the
conversation's messages name, as a model that read its transcript would pass it. A conversation
continued with `claude -p --continue` carries the earlier turns, so its steps follow theirs.
The n-th request of the main conversation (the one that offers tools) gets step n, where n is
the number of assistant messages it already carries; after the last step it gets a text answer
(and a conversation whose prompt no plan names gets one that says so).
Every other request (Claude Code's side requests: titles, summaries, quota probes) gets a short
text answer. Every request body is written to LOG_DIR/NNN.json, in arrival order.

Streaming SSE exactly as the API sends it: message_start, content_block_start/delta/stop,
message_delta (stop_reason), message_stop. Standard library only; not a model, not a fake of
ipybox: it decides nothing from what ipybox answers (but for copying the handle it names).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_counter = itertools.count()
_lock = threading.Lock()


def _events(message_id: str, model: str, blocks: list[dict], stop_reason: str) -> list[tuple[str, dict]]:
    usage = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    events: list[tuple[str, dict]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
        )
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                ("content_block_start", {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
            )
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": block["text"]}},
                )
            )
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": 20}},
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


_HANDLE = re.compile(r"ipybox-s1\.stdio\.[A-Za-z0-9_-]+")


def _with_handle(value, messages: list[dict]):
    """``value`` with each ``{handle}`` replaced by the first ipybox session handle the
    conversation's tool results name (what a model that read its transcript passes)."""
    text = json.dumps(messages)
    found = _HANDLE.search(text)
    handle = found.group(0) if found else "<no handle in the conversation>"
    if isinstance(value, str):
        return value.replace("{handle}", handle)
    if isinstance(value, dict):
        return {k: _with_handle(v, messages) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_handle(v, messages) for v in value]
    return value


def _texts(content) -> list[str]:
    """The text of a message's content: the string, or each text block's."""
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]


def _plan_of(plans, messages: list[dict]) -> list[dict]:
    """The steps of the plan whose prompt the conversation's first user message holds: a text
    block equal to it (Claude Code adds blocks of its own around the prompt), else the one plan
    whose prompt occurs in that message."""
    if isinstance(plans, list):
        return plans
    first = next((m for m in messages if m.get("role") == "user"), {})
    texts = [t.strip() for t in _texts(first.get("content"))]
    exact = [k for k in plans if k.strip() in texts]
    inside = [k for k in plans if any(k in t for t in texts)]
    chosen = exact if len(exact) == 1 else inside
    if len(chosen) != 1:
        return [{"text": f"stand-in: no plan (or more than one: {chosen}) for the prompt {texts!r}"}]
    return plans[chosen[0]]


class Handler(BaseHTTPRequestHandler):
    plan: list[dict] | dict[str, list[dict]] = []
    log_dir = "."
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        with _lock:
            n = next(_counter)
        with open(os.path.join(self.log_dir, f"{n:03d}.json"), "w") as f:
            json.dump({"path": self.path, "body": request}, f)
        if not self.path.split("?")[0].endswith("/messages"):
            # count_tokens and the like: a harmless answer.
            return self._json({"input_tokens": 10})
        model = request.get("model", "claude-stand-in")
        tools = request.get("tools") or []
        main = any(t.get("name") == "ToolSearch" for t in tools)
        blocks: list[dict]
        stop = "end_turn"
        if main:
            messages = request.get("messages", [])
            plan = _plan_of(self.plan, messages)
            step_index = sum(1 for m in messages if m.get("role") == "assistant")
            step = plan[step_index] if step_index < len(plan) else {"text": "Done."}
            # A model that pauses before its next step (ipybox checkpoints an idle session).
            time.sleep(float(step.get("delay", 0)))
            if "tool" in step:
                tool_input = _with_handle(step["input"], request.get("messages", []))
                blocks = [{"type": "tool_use", "id": f"toolu_standin_{n:03d}", "name": step["tool"], "input": tool_input}]
                stop = "tool_use"
            else:
                blocks = [{"type": "text", "text": step["text"]}]
        else:
            blocks = [{"type": "text", "text": "ipybox check"}]
        message_id = f"msg_standin_{n:03d}"
        if not request.get("stream"):
            content = [
                {"type": "text", "text": b["text"]}
                if b["type"] == "text"
                else {"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]}
                for b in blocks
            ]
            return self._json(
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 10, "output_tokens": 20},
                }
            )
        body = "".join(
            f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in _events(message_id, model, blocks, stop)
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("request-id", f"req_standin_{n:03d}")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: dict) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    plan_path, log_dir = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        Handler.plan = json.load(f)
    Handler.log_dir = log_dir
    os.makedirs(log_dir, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
