"""Checks a captured MCP stdio handshake between Claude Code and ipybox (scripts/plugin-check.sh):
Claude Code's first request is `server/discover` at protocol 2026-07-28 declaring form
elicitation; ipybox's answer supports 2026-07-28 and offers the tasks and skills extensions.

Usage: handshake_check.py SENT.jsonl RECEIVED.jsonl
Prints what it found (or the problems) on one line; exits 1 on a problem.
"""

import json
import sys

sent = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
got = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
first = sent[0]
meta = first.get("params", {}).get("_meta", {})
capabilities = meta.get("io.modelcontextprotocol/clientCapabilities", {})
problems = []
if first.get("method") != "server/discover":
    problems.append(f"first request: {first.get('method')}")
if meta.get("io.modelcontextprotocol/protocolVersion") != "2026-07-28":
    problems.append(f"protocol version: {meta.get('io.modelcontextprotocol/protocolVersion')}")
if "form" not in capabilities.get("elicitation", {}):
    problems.append(f"no form elicitation in the capabilities: {capabilities}")
reply = next((m.get("result", {}) for m in got if m.get("id") == first.get("id")), {})
if "2026-07-28" not in reply.get("supportedVersions", []):
    problems.append(f"supported versions: {reply.get('supportedVersions')}")
extensions = sorted(reply.get("capabilities", {}).get("extensions", {}))
if extensions != ["io.modelcontextprotocol/skills", "io.modelcontextprotocol/tasks"]:
    problems.append(f"extensions offered: {extensions}")
if problems:
    print("; ".join(problems))
    sys.exit(1)
client = meta.get("io.modelcontextprotocol/clientInfo", {})
print(
    f"{client.get('name')} {client.get('version')} sent server/discover at 2026-07-28 with "
    f"capabilities {json.dumps(capabilities)}; ipybox offered {', '.join(extensions)}"
)
