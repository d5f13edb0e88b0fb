//! Tests of `apigen` with real Python (the test venv) importing and exercising generated
//! packages: names, aliases, injection attempts, what goes on the wire, recursion, errors and the
//! atomic swap. Exact generated text is in `apigen_snapshots`; the corpus-wide check is
//! `apigen_corpus`.

use ipybox::apigen::{ApiStyle, ApigenError, ToolSpec, generate_package};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{self, require};

pub(crate) fn tool(name: &str, input: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: Some(format!("Tool {name}.")),
        input_schema: input,
        output_schema: None,
    }
}

/// Generates `srv` into a fresh temp dir; returns (tempdir, mcptools root).
fn generate(tools: &[ToolSpec]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mcptools");
    generate_package(
        "srv",
        &json!({"command": "srv", "env": {"TOKEN": "${TOKEN}"}}),
        tools,
        &root,
        ApiStyle::Sync,
    )
    .unwrap();
    (tmp, root)
}

/// Runs `code` with the generated packages and `ipybox_runtime` importable, warnings as errors.
/// `calls` collects what generated `run()`s send; the fake runner answers with `REPLY`.
fn python(root: &Path, code: &str) -> String {
    let prelude = r#"
import json, sys, warnings
warnings.simplefilter("error")
import mcptools.srv as pkg
calls = []
REPLY = {"value": {}}
def fake_run(tool_name, arguments):
    calls.append((tool_name, arguments))
    return REPLY["value"]
pkg.runner.run = fake_run
"#;
    let out = Command::new(support::python())
        .arg("-c")
        .arg(format!("{prelude}\n{code}"))
        .current_dir(root.parent().unwrap())
        .env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                root.parent().unwrap().display(),
                support::root().join("python").display()
            ),
        )
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn read(root: &Path, file: &str) -> String {
    std::fs::read_to_string(root.join("srv").join(file)).unwrap()
}

#[test]
fn small_schema_runs_and_sends_what_was_set() {
    require!(TestEnv);
    let (_tmp, root) = generate(&[crate::apigen_snapshots::search_repos_tool()]);
    let init = read(&root, "__init__.py");
    assert!(init.contains("SERVER_PARAMS = {\n    \"command\": \"srv\",\n    \"env\": {\n        \"TOKEN\": \"${TOKEN}\",\n    },\n}\n"), "{init}");
    assert!(
        init.contains("runner = ToolRunner(\"srv\", SERVER_PARAMS)"),
        "{init}"
    );
    assert!(root.join("__init__.py").exists());
    let out = python(
        &root,
        r#"
from mcptools.srv.search_repos import Params, Sort, Owner, run
REPLY["value"] = '{"total": 3}'
r = run(Params(query="q", from_=None, sort=Sort.help_wanted, owner=Owner(login="me")))
assert r.total == 3, r
print(json.dumps(calls))
"#,
    );
    assert_eq!(
        out.trim(),
        r#"[["search-repos", {"query": "q", "sort": "help-wanted", "from": null, "owner": {"login": "me"}}]]"#
    );
}

#[test]
fn module_names_keywords_digits_collisions() {
    require!(TestEnv);
    let names = [
        "search-repos",
        "Search_Repos",
        "class",
        "2fa",
        "__init__",
        "runner",
        "x.y",
    ];
    let tools: Vec<ToolSpec> = names
        .iter()
        .map(|n| tool(n, json!({"type": "object"})))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mcptools");
    let modules = generate_package("srv", &json!({}), &tools, &root, ApiStyle::Sync).unwrap();
    assert_eq!(
        modules,
        [
            "search_repos",
            "search_repos_2",
            "class_",
            "_2fa",
            "__init___",
            "runner_",
            "x_y"
        ]
    );
    let out = python(
        &root,
        r#"
import importlib
from ipybox_runtime import ToolRunner
mods = ["search_repos", "search_repos_2", "class_", "_2fa", "__init___", "runner_", "x_y"]
for m in mods:
    importlib.import_module("mcptools.srv." + m).run(importlib.import_module("mcptools.srv." + m).Params())
assert isinstance(pkg.runner, ToolRunner)
print(json.dumps([c[0] for c in calls]))
"#,
    );
    assert_eq!(
        out.trim(),
        r#"["search-repos", "Search_Repos", "class", "2fa", "__init__", "runner", "x.y"]"#
    );
}

#[test]
fn aliases_for_keywords_dashes_and_basemodel_attributes() {
    require!(TestEnv);
    let t = tool(
        "t",
        json!({"type": "object", "properties": {
            "from": {"type": "integer"}, "x-y": {"type": "integer"}, "schema": {"type": "string"},
            "json": {"type": "string"}, "model_config": {"type": "string"}, "_id": {"type": "string"},
            "str": {"type": "string"}, "2fa": {"type": "boolean"}, "x_y": {"type": "integer"}
        }}),
    );
    let (_tmp, root) = generate(&[t]);
    let out = python(
        &root,
        r#"
from mcptools.srv.t import Params, run
p = Params(from_=1, x_y_2=2, schema_="s", json_="j", model_config_="m", id_="i", str_="x", field_2fa=True, x_y=3)
wire = p.model_dump(mode="json", by_alias=True, exclude_unset=True)
print(json.dumps(wire))
q = Params.model_validate(wire)
assert q.model_dump(mode="json", by_alias=True, exclude_unset=True) == wire
assert q.from_ == 1 and q.schema_ == "s" and q.x_y == 3 and q.x_y_2 == 2
"#,
    );
    assert_eq!(
        out.trim(),
        r#"{"from": 1, "x-y": 2, "schema": "s", "json": "j", "model_config": "m", "_id": "i", "str": "x", "2fa": true, "x_y": 3}"#
    );
}

#[test]
fn injection_attempts_stay_inert() {
    require!(TestEnv);
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("PWNED");
    let m = marker.display().to_string();
    let payload = format!("__import__('os').system('touch {m}')");
    let nasty = format!(
        "\"\"\" + {payload} + \"\"\" \\ \n\r\t\u{0} ''' {{{{ x }}}} {{% raw %}} \u{2028}\""
    );
    let t = ToolSpec {
        name: format!("evil\"); {payload} #\n\"\"\""),
        description: Some(nasty.clone()),
        input_schema: json!({
            "type": "object",
            "description": nasty,
            "title": nasty,
            "properties": {
                nasty.clone(): {"type": "string", "description": nasty, "default": nasty, "title": nasty},
                "e": {"enum": [nasty, "a\"b", "c'd", "x\\"], "description": nasty},
                "p": {"type": "string", "pattern": nasty},
                "o": {"type": "object", "title": nasty, "properties": {nasty.clone(): {"const": nasty}}},
            },
            "required": ["e"],
            "$defs": {nasty.clone(): {"type": "object", "properties": {"a": {"type": "string"}}}}
        }),
        output_schema: None,
    };
    let root = tmp.path().join("mcptools");
    let params = json!({"command": nasty, "args": [nasty], "env": {nasty.clone(): "${X}"}});
    let modules = generate_package("srv", &params, &[t], &root, ApiStyle::Sync).unwrap();
    assert_eq!(modules.len(), 1);
    let module = &modules[0];
    let code = format!(
        r#"
import importlib
mod = importlib.import_module("mcptools.srv.{module}")
nasty = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
print(json.dumps({{
    "params": pkg.SERVER_PARAMS,
    "enum": [e.value for e in mod.E],
    "doc": mod.run.__doc__,
}}))
p = mod.Params.model_validate({{"e": "a\"b"}})
mod.run(p)
print(json.dumps(calls))
"#
    );
    let out = python(&root, &code);
    assert!(!marker.exists(), "payload executed");
    let mut lines = out.lines();
    let first: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(first["params"], params);
    assert_eq!(first["enum"], json!([nasty, "a\"b", "c'd", "x\\"]));
    assert!(first["doc"].as_str().unwrap().contains("__import__('os')"));
    let calls: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(calls[0][0], json!(format!("evil\"); {payload} #\n\"\"\"")));
    assert_eq!(calls[0][1], json!({"e": "a\"b"}));
}

#[test]
fn wire_format_exclude_unset_none_required_nullable_and_strings() {
    require!(TestEnv);
    let t = tool(
        "t",
        json!({"type": "object", "properties": {
            "url": {"type": "string", "format": "uri"},
            "id": {"type": "string", "format": "uuid"},
            "when": {"type": "string", "format": "date-time"},
            "opt": {"type": "integer", "default": 5},
            "maybe": {"type": ["string", "null"]},
            "must": {"type": ["integer", "null"]},
            "n": {"type": "number"}
        }, "required": ["url", "must"]}),
    );
    let (_tmp, root) = generate(&[t]);
    let out = python(
        &root,
        r#"
from pydantic import ValidationError
from mcptools.srv.t import Params
dump = lambda p: p.model_dump(mode="json", by_alias=True, exclude_unset=True)
url = "https://Example.com/a%20b?q=1#Frag"
print(json.dumps(dump(Params(url=url, must=None))))
print(json.dumps(dump(Params(url=url, must=1, opt=None, maybe=None, id="6F9619FF-8B86-D011-B42D-00C04FC964FF", when="2024-01-01T00:00:00+01:00", n=2))))
assert Params(url=url, must=None).opt == 5
try:
    Params(url=url)
    raise SystemExit("required nullable field accepted a missing value")
except ValidationError:
    pass
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        r#"{"url": "https://Example.com/a%20b?q=1#Frag", "must": null}"#
    );
    assert_eq!(
        lines[1],
        r#"{"url": "https://Example.com/a%20b?q=1#Frag", "id": "6F9619FF-8B86-D011-B42D-00C04FC964FF", "when": "2024-01-01T00:00:00+01:00", "opt": null, "maybe": null, "must": 1, "n": 2.0}"#
    );
}

#[test]
fn recursive_refs() {
    require!(TestEnv);
    let t = ToolSpec {
        name: "tree".into(),
        description: None,
        input_schema: json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}, "a": {"$ref": "#/definitions/A"}},
            "required": ["root"],
            "$defs": {"Node": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
            }, "required": ["name"]}},
            "definitions": {
                "A": {"type": "object", "properties": {"b": {"$ref": "#/definitions/B"}}},
                "B": {"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}, "x": {"type": "integer"}}}
            }
        }),
        output_schema: Some(
            json!({"$ref": "#/$defs/L", "$defs": {"L": {"type": "object", "properties": {
            "next": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}, "v": {"type": "integer"}}}}}),
        ),
    };
    let (_tmp, root) = generate(&[t]);
    let src = read(&root, "tree.py");
    assert!(
        src.contains("A.model_rebuild()") || src.contains("B.model_rebuild()"),
        "{src}"
    );
    let out = python(
        &root,
        r#"
from mcptools.srv.tree import Params, Node, A, B, run
inst = {"root": {"name": "r", "children": [{"name": "c", "children": [{"name": "g"}]}]}, "a": {"b": {"a": {"b": {"x": 1}}}}}
p = Params.model_validate(inst)
assert isinstance(p.root.children[0], Node) and isinstance(p.a.b.a, A)
assert p.model_dump(mode="json", by_alias=True, exclude_unset=True) == inst
REPLY["value"] = {"v": 1, "next": {"v": 2, "next": None}}
r = run(p)
print(r.next.v, r.next.next)
"#,
    );
    assert_eq!(out.trim(), "2 None");
}

#[test]
fn invalid_server_name_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mcptools");
    for bad in ["my-server", "class", "1abc", "", "naïve", "__x"] {
        let err = generate_package(
            bad,
            &json!({}),
            &[tool("t", json!({"type": "object"}))],
            &root,
            ApiStyle::Sync,
        )
        .unwrap_err();
        assert!(
            matches!(err, ApigenError::InvalidServerName { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("Python identifier"), "{err}");
    }
    assert!(
        !root.exists(),
        "nothing may be written for an invalid server name"
    );
}

#[test]
fn failed_generation_leaves_old_package_intact() {
    let (tmp, root) = generate(&[
        tool("a", json!({"type": "object"})),
        tool("b", json!({"type": "object"})),
    ]);
    let before = read(&root, "a.py");
    let err = generate_package(
        "srv",
        &json!({}),
        &[tool("a", json!({"type": "object"})), tool("c", json!(42))],
        &root,
        ApiStyle::Sync,
    )
    .unwrap_err();
    assert!(matches!(err, ApigenError::InvalidSchema { .. }), "{err}");
    assert!(err.to_string().contains("\"c\""), "{err}");
    assert_eq!(read(&root, "a.py"), before);
    assert!(root.join("srv/b.py").exists());
    // A successful regeneration replaces the package and leaves no temp directories.
    generate_package(
        "srv",
        &json!({}),
        &[tool("c", json!({"type": "object"}))],
        &root,
        ApiStyle::Sync,
    )
    .unwrap();
    assert!(!root.join("srv/a.py").exists() && root.join("srv/c.py").exists());
    let mut entries: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, ["__init__.py", "srv"]);
    drop(tmp);
}

#[test]
fn objects_dicts_unions_allof_patterns_and_root_results() {
    require!(TestEnv);
    let t = ToolSpec {
        name: "misc".into(),
        description: Some("Misc.".into()),
        input_schema: json!({"type": "object", "properties": {
            "strict": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false},
            "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "merged": {"allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}}
            ]},
            "look": {"type": "string", "pattern": "^(?=a)\\w+$"},
            "tuple": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}]},
            "kind": {"const": "x"},
            "level": {"enum": [1, 2, 3]}
        }}),
        output_schema: Some(json!({"type": "array", "items": {"type": "string"}})),
    };
    let (_tmp, root) = generate(&[t]);
    let src = read(&root, "misc.py");
    assert!(
        src.contains("labels: dict[str, int] | None = None"),
        "{src}"
    );
    assert!(src.contains("either: str | int | None = None"), "{src}");
    assert!(
        src.contains("look: str | None = None"),
        "lookahead pattern must be dropped:\n{src}"
    );
    assert!(
        src.contains("tuple_: list[Any] | None = Field(default=None, alias=\"tuple\")")
            || src.contains("tuple: list[Any] | None = None"),
        "{src}"
    );
    assert!(src.contains("kind: Literal[\"x\"] | None = None"), "{src}");
    assert!(
        src.contains("level: Literal[1, 2, 3] | None = None"),
        "{src}"
    );
    assert!(src.contains("class Result(RootModel[list[str]]):"), "{src}");
    python(
        &root,
        r#"
from pydantic import ValidationError
from mcptools.srv.misc import Params, Strict, Merged, run
try:
    Strict(a=1, extra=2)
    raise SystemExit("additionalProperties: false must forbid extras")
except ValidationError:
    pass
p = Params.model_validate({"merged": {"a": "x", "b": 1}, "labels": {"k": 1}, "either": 3, "look": "zzz", "extra": [1]})
assert isinstance(p.merged, Merged) and p.either == 3
assert p.model_dump(mode="json", by_alias=True, exclude_unset=True)["extra"] == [1]
REPLY["value"] = '["a", "b"]'
assert run(p).root == ["a", "b"]
"#,
    );
}
