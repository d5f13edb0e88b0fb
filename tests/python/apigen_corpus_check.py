"""Checks generated MCP tool modules against their schemas (driven by tests/apigen_corpus.rs).

Usage: apigen_corpus_check.py MANIFEST.json
The manifest lists {server, module, tool, input_schema, output_schema}; the generated packages
must be importable (`mcptools.<server>.<module>`). For every tool: the module imports without
warnings; for instances that hypothesis-jsonschema generates from the input schema (and output
schema), `Params.model_validate(instance)` succeeds and its
`model_dump(mode="json", by_alias=True, exclude_unset=True)` is valid under the schema and
equal to the instance. Schemas that hypothesis-jsonschema cannot generate from are counted and
reported as skipped. Prints one JSON summary line at the end.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor

EXAMPLES = int(os.environ.get("APIGEN_EXAMPLES", "25"))
# Schemas above this size (JSON characters) get fewer examples to keep the run short.
LARGE_SCHEMA = 15_000
LARGE_EXAMPLES = 8


class Mismatch(Exception):
    pass


def check_model(model, schema, label):
    """Returns None if ok, 'skip: why' if hypothesis can't generate, else raises Mismatch."""
    import jsonschema
    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis_jsonschema import from_schema

    validator = jsonschema.validators.validator_for(schema)(schema)
    try:
        strategy = from_schema(schema)
    except Exception as e:  # unsupported by the generator
        return f"skip: {type(e).__name__}: {str(e)[:120]}"

    large = len(json.dumps(schema)) > LARGE_SCHEMA

    @settings(
        max_examples=min(EXAMPLES, LARGE_EXAMPLES) if large else EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(instance):
        assume(validator.is_valid(instance))
        try:
            obj = model.model_validate(instance)
        except Exception as e:
            raise Mismatch(f"{label}: model_validate failed for {json.dumps(instance)[:400]}: {e}")
        try:
            dumped = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
        except Exception as e:
            raise Mismatch(f"{label}: model_dump failed: {e}")
        errors = [e.message for e in validator.iter_errors(dumped)]
        if errors:
            raise Mismatch(
                f"{label}: dump invalid under schema: {errors[:2]}; "
                f"instance={json.dumps(instance)[:300]} dumped={json.dumps(dumped)[:300]}"
            )
        if dumped != instance:
            raise Mismatch(
                f"{label}: dump differs: instance={json.dumps(instance)[:300]} "
                f"dumped={json.dumps(dumped)[:300]}"
            )

    try:
        prop()
    except Mismatch:
        raise
    except Exception as e:
        return f"skip: {type(e).__name__}: {str(e)[:120]}"
    return None


def check_tool(entry):
    name = f"mcptools.{entry['server']}.{entry['module']}"
    started = time.time()
    result = {"module": name, "imported": False, "checked": 0, "skipped": [], "failures": []}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mod = importlib.import_module(name)
        result["imported"] = True
    except Exception:
        result["failures"].append(f"{name}: import failed:\n{traceback.format_exc(limit=3)}")
        return result
    pairs = [("Params", entry["input_schema"])]
    if entry.get("output_schema") is not None:
        pairs.append(("Result", entry["output_schema"]))
    for cls, schema in pairs:
        label = f"{name}.{cls}"
        model = getattr(mod, cls, None)
        if model is None:
            result["failures"].append(f"{label}: class missing")
            continue
        try:
            outcome = check_model(model, schema, label)
        except Mismatch as e:
            result["failures"].append(str(e))
            continue
        except Exception:
            result["failures"].append(f"{label}: checker crashed:\n{traceback.format_exc(limit=3)}")
            continue
        if outcome is None:
            result["checked"] += 1
        else:
            result["skipped"].append(f"{label}: {outcome}")
    result["seconds"] = time.time() - started
    return result


def main():
    manifest = json.load(open(sys.argv[1]))
    start = time.time()
    workers = int(os.environ.get("APIGEN_WORKERS", str(os.cpu_count() or 1)))
    if workers > 1:
        # Biggest schemas first, one at a time, so the slow ones don't end up last.
        order = sorted(
            range(len(manifest)),
            key=lambda i: -len(json.dumps([manifest[i]["input_schema"], manifest[i].get("output_schema")])),
        )
        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(check_tool, [manifest[i] for i in order], chunksize=1))
        results = [None] * len(manifest)
        for i, r in zip(order, done):
            results[i] = r
    else:
        results = [check_tool(e) for e in manifest]
    summary = {
        "modules": len(manifest),
        "imported": sum(r["imported"] for r in results),
        "checked_models": sum(r["checked"] for r in results),
        "skipped": [s for r in results for s in r["skipped"]],
        "failures": [f for r in results for f in r["failures"]],
        "seconds": round(time.time() - start, 1),
    }
    slowest = sorted(results, key=lambda r: -r.get("seconds", 0))[:8]
    print("slowest:", ", ".join(f"{r['module']} {r.get('seconds', 0):.1f}s" for r in slowest))
    for s in summary["skipped"]:
        print("SKIPPED", s)
    for f in summary["failures"]:
        print("FAILURE", f)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
