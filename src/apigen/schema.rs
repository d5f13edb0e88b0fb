//! The type model: JSON Schema (as found in MCP tool definitions) -> Python classes and types.
//!
//! [`build_module`] walks a tool's input and output schemas and produces a [`ModuleModel`]:
//! the classes to emit (pydantic models and string enums, dependencies first) and the types of
//! their fields. It decides *what* Python means a schema; it never produces source text (that is
//! `render.rs`) and never escapes anything. Schema features without a faithful Python type
//! degrade to `Any` (documented in `docs/apigen.md`); nothing here fails on odd schemas except
//! an input schema that is not a JSON object at all.

use super::naming;
use super::pattern;
use crate::json_kind::json_kind;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// A Python type annotation.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ty {
    Any,
    Str,
    Int,
    Float,
    Bool,
    Null,
    List(Box<Ty>),
    /// `dict[str, T]`
    Dict(Box<Ty>),
    /// `Literal[...]` of strings, integers, booleans.
    Literal(Vec<Value>),
    /// A generated class (model or enum) of this module.
    Class(String),
    Union(Vec<Ty>),
    /// A type with pydantic `Field` constraints: (keyword, JSON value).
    Constrained(Box<Ty>, Vec<(&'static str, Value)>),
}

impl Ty {
    /// True if `None` is a valid value.
    pub(super) fn is_nullable(&self) -> bool {
        match self {
            Ty::Any | Ty::Null => true,
            Ty::Union(items) => items.iter().any(Ty::is_nullable),
            Ty::Constrained(inner, _) => inner.is_nullable(),
            _ => false,
        }
    }

    /// A union, flattened and de-duplicated, `None` last; `Any` absorbs everything.
    pub(super) fn union(items: Vec<Ty>) -> Ty {
        let mut out: Vec<Ty> = Vec::new();
        let mut null = false;
        let mut stack: Vec<Ty> = items.into_iter().rev().collect();
        while let Some(t) = stack.pop() {
            match t {
                Ty::Any => return Ty::Any,
                Ty::Null => null = true,
                Ty::Union(inner) => stack.extend(inner.into_iter().rev()),
                t if !out.contains(&t) => out.push(t),
                _ => {}
            }
        }
        if null {
            out.push(Ty::Null);
        }
        match out.len() {
            0 => Ty::Any,
            1 => out.pop().expect("one"),
            _ => Ty::Union(out),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Extra {
    Allow,
    Forbid,
}

#[derive(Debug)]
pub(super) struct FieldSpec {
    /// The property name on the wire.
    pub wire: String,
    pub ty: Ty,
    pub required: bool,
    pub default: Option<Value>,
    pub description: Option<String>,
}

#[derive(Debug)]
pub(super) struct ModelSpec {
    pub name: String,
    pub doc: Option<String>,
    pub fields: Vec<FieldSpec>,
    pub extra: Extra,
    /// Type of additional properties when the schema constrains them.
    pub extra_ty: Option<Ty>,
    /// Set for a `RootModel` (an output schema that is not an object).
    pub root: Option<Ty>,
}

#[derive(Debug)]
pub(super) struct EnumSpec {
    pub name: String,
    /// (member name, value)
    pub members: Vec<(String, String)>,
}

#[derive(Debug)]
pub(super) enum ClassSpec {
    Model(ModelSpec),
    Enum(EnumSpec),
}

impl ClassSpec {
    pub(super) fn name(&self) -> &str {
        match self {
            ClassSpec::Model(m) => &m.name,
            ClassSpec::Enum(e) => &e.name,
        }
    }
}

#[derive(Debug)]
pub(super) struct ModuleModel {
    /// Classes in emission order: a class comes after the classes it uses, except in cycles.
    pub classes: Vec<ClassSpec>,
    /// Models that refer to a class defined after them (recursion): need `model_rebuild()`.
    pub rebuild: Vec<String>,
    pub has_result: bool,
}

/// Builds the classes for one tool. `tool_name` only feeds docstrings.
pub(super) fn build_module(
    tool_name: &str,
    input: &Value,
    output: Option<&Value>,
) -> Result<ModuleModel, String> {
    if !input.is_object() {
        return Err(format!(
            "inputSchema must be a JSON object, got {}",
            json_kind(input)
        ));
    }
    let mut b = Builder {
        taken: naming::reserved_class_names(),
        classes: Vec::new(),
        rebuild: Vec::new(),
        enum_cache: HashMap::new(),
        root: input,
        refs: HashMap::new(),
        open: Vec::new(),
        depth: 0,
    };
    b.refs
        .insert(String::new(), RefState::Open(Some("Params".into())));
    b.build_model(
        input,
        "Params",
        Some(format!("Arguments of the `{tool_name}` tool.")),
        "Params",
    );
    let mut has_result = false;
    if let Some(out) = output.filter(|o| o.is_object()) {
        has_result = true;
        b.root = out;
        b.refs.clear();
        let doc = Some(format!("Structured result of the `{tool_name}` tool."));
        let resolved = b.normalize(out);
        if is_object_schema(&resolved) {
            b.refs
                .insert(String::new(), RefState::Open(Some("Result".into())));
            b.build_model(out, "Result", doc, "Result");
        } else {
            b.open.push(false);
            let ty = b.ty(out, "ResultValue");
            let needs_rebuild = b.open.pop().unwrap_or(false);
            if needs_rebuild {
                b.rebuild.push("Result".into());
            }
            b.classes.push(ClassSpec::Model(ModelSpec {
                name: "Result".into(),
                doc,
                fields: Vec::new(),
                extra: Extra::Allow,
                extra_ty: None,
                root: Some(ty),
            }));
        }
    }
    Ok(ModuleModel {
        classes: b.classes,
        rebuild: b.rebuild,
        has_result,
    })
}

enum RefState {
    /// Being built; `Some(class)` if it becomes a class (recursion refers to it by name).
    Open(Option<String>),
    Done(Ty),
}

struct Builder<'a> {
    taken: HashSet<String>,
    classes: Vec<ClassSpec>,
    rebuild: Vec<String>,
    /// (class base name, values) -> class, so one enum used twice is emitted once.
    enum_cache: HashMap<(String, Vec<String>), String>,
    root: &'a Value,
    refs: HashMap<String, RefState>,
    /// One flag per model under construction: does it refer to a not-yet-defined class?
    open: Vec<bool>,
    depth: usize,
}

const MAX_DEPTH: usize = 48;

/// Keywords that make a schema more than an annotation.
const TYPE_KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "items",
    "prefixItems",
    "$ref",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "additionalProperties",
    "patternProperties",
];

fn has_type_keywords(m: &Map<String, Value>) -> bool {
    TYPE_KEYWORDS.iter().any(|k| m.contains_key(*k))
}

fn is_object_schema(s: &Value) -> bool {
    let Some(m) = s.as_object() else { return false };
    let typed_object = match m.get("type") {
        Some(Value::String(t)) => t == "object",
        None => m.contains_key("properties"),
        _ => false,
    };
    typed_object && !m.contains_key("anyOf") && !m.contains_key("oneOf")
}

fn literal_ok(v: &Value) -> bool {
    matches!(v, Value::String(_) | Value::Bool(_) | Value::Null)
        || v.as_i64().is_some()
        || v.as_u64().is_some()
}

impl<'a> Builder<'a> {
    fn resolve(&self, ptr: &str) -> Option<&'a Value> {
        let frag = ptr.strip_prefix('#')?;
        if frag.is_empty() {
            return Some(self.root);
        }
        let mut cur = self.root;
        for seg in frag.strip_prefix('/')?.split('/') {
            let seg = percent_decode(seg).replace("~1", "/").replace("~0", "~");
            cur = match cur {
                Value::Object(m) => m.get(&seg)?,
                Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    /// Resolves a top-level `$ref` chain and merges `allOf`, without creating classes. Used to
    /// decide what a schema is.
    fn normalize(&self, s: &Value) -> Value {
        let mut cur = s.clone();
        for _ in 0..8 {
            let Some(m) = cur.as_object() else { return cur };
            if let Some(Value::String(r)) = m.get("$ref") {
                match self.resolve(r) {
                    Some(t) => cur = t.clone(),
                    None => return Value::Bool(true),
                }
                continue;
            }
            if m.contains_key("allOf") {
                match self.merge_all_of(m) {
                    Some(merged) => cur = merged,
                    None => return Value::Bool(true),
                }
                continue;
            }
            return cur;
        }
        cur
    }

    /// Merges `allOf` into one schema: a single typed member wins, members that are objects are
    /// merged (properties, required, additionalProperties: false). Otherwise `None` (-> Any).
    fn merge_all_of(&self, m: &Map<String, Value>) -> Option<Value> {
        let members = m.get("allOf")?.as_array()?;
        let mut rest = m.clone();
        rest.remove("allOf");
        let mut parts: Vec<Value> = Vec::new();
        if has_type_keywords(&rest) {
            parts.push(Value::Object(rest.clone()));
        }
        for member in members {
            let n = self.normalize(member);
            match &n {
                Value::Object(mm) if !has_type_keywords(mm) => {}
                Value::Bool(true) => {}
                _ => parts.push(n),
            }
        }
        let annotations: Map<String, Value> = rest
            .into_iter()
            .filter(|(k, _)| !TYPE_KEYWORDS.contains(&k.as_str()))
            .collect();
        let merged = match parts.len() {
            0 => Value::Object(Map::new()),
            1 => parts.pop().expect("one"),
            _ => {
                if !parts.iter().all(is_object_schema) {
                    return None;
                }
                let mut props = Map::new();
                let mut required: Vec<Value> = Vec::new();
                let mut forbid = false;
                for p in &parts {
                    let pm = p.as_object().expect("object schema");
                    for (k, v) in pm
                        .get("properties")
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                    {
                        if props.get(k).is_some_and(|old| old != v) {
                            props.insert(k.clone(), Value::Bool(true));
                        } else {
                            props.insert(k.clone(), v.clone());
                        }
                    }
                    for r in pm
                        .get("required")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if !required.contains(r) {
                            required.push(r.clone());
                        }
                    }
                    forbid |= pm.get("additionalProperties") == Some(&Value::Bool(false));
                }
                let mut out = Map::new();
                out.insert("type".into(), "object".into());
                out.insert("properties".into(), Value::Object(props));
                out.insert("required".into(), Value::Array(required));
                if forbid {
                    out.insert("additionalProperties".into(), false.into());
                }
                Value::Object(out)
            }
        };
        // Keep title/description of the outer schema.
        let mut merged = merged;
        if let Value::Object(mm) = &mut merged {
            for (k, v) in annotations {
                if k == "title" || k == "description" {
                    mm.entry(k).or_insert(v);
                }
            }
        }
        Some(merged)
    }

    fn ty(&mut self, s: &Value, hint: &str) -> Ty {
        if self.depth > MAX_DEPTH {
            return Ty::Any;
        }
        self.depth += 1;
        let t = self.ty_inner(s, hint);
        self.depth -= 1;
        t
    }

    fn ty_inner(&mut self, s: &Value, hint: &str) -> Ty {
        let Value::Object(m) = s else { return Ty::Any };
        if let Some(Value::String(r)) = m.get("$ref") {
            return self.ref_ty(r, hint);
        }
        if let Some(all) = m.get("allOf").and_then(Value::as_array) {
            if all.len() == 1 && !m.contains_key("properties") && !m.contains_key("type") {
                return self.ty(&all[0], hint);
            }
            return match self.merge_all_of(m) {
                Some(merged) => self.ty(&merged, hint),
                None => Ty::Any,
            };
        }
        for key in ["anyOf", "oneOf"] {
            let Some(members) = m.get(key).and_then(Value::as_array) else {
                continue;
            };
            let typed: Vec<&Value> = members
                .iter()
                .filter(|v| !matches!(v, Value::Object(mm) if !has_type_keywords(mm)))
                .collect();
            if typed.is_empty() || m.contains_key("properties") {
                continue; // only constraints (e.g. alternative `required` sets): ignore
            }
            let parent_type = m.get("type");
            let tys: Vec<Ty> = typed
                .into_iter()
                .map(|member| match (parent_type, member) {
                    (Some(t), Value::Object(mm))
                        if !mm.contains_key("type") && !mm.contains_key("$ref") =>
                    {
                        let mut mm = mm.clone();
                        mm.insert("type".into(), t.clone());
                        self.ty(&Value::Object(mm), hint)
                    }
                    _ => self.ty(member, hint),
                })
                .collect();
            return Ty::union(tys);
        }
        if let Some(values) = m.get("enum").and_then(Value::as_array) {
            return self.enum_ty(values, m, hint);
        }
        if let Some(c) = m.get("const") {
            return if literal_ok(c) {
                Ty::Literal(vec![c.clone()])
            } else {
                Ty::Any
            };
        }
        match m.get("type") {
            Some(Value::String(t)) => self.typed(m, t, hint),
            Some(Value::Array(ts)) => {
                let tys = ts
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|t| self.typed(m, t, hint))
                    .collect();
                Ty::union(tys)
            }
            _ => {
                if m.contains_key("properties") || m.contains_key("additionalProperties") {
                    self.typed(m, "object", hint)
                } else if m.contains_key("items") || m.contains_key("prefixItems") {
                    self.typed(m, "array", hint)
                } else {
                    Ty::Any
                }
            }
        }
    }

    fn typed(&mut self, m: &Map<String, Value>, t: &str, hint: &str) -> Ty {
        let mut kw: Vec<(&'static str, Value)> = Vec::new();
        let num = |k: &str| m.get(k).filter(|v| v.is_number()).cloned();
        let base = match t {
            "string" => {
                if let Some(v) = num("minLength") {
                    kw.push(("min_length", v));
                }
                if let Some(v) = num("maxLength") {
                    kw.push(("max_length", v));
                }
                if let Some(Value::String(p)) = m.get("pattern")
                    && pattern::is_portable(p)
                {
                    kw.push(("pattern", Value::String(p.clone())));
                }
                Ty::Str
            }
            "integer" | "number" => {
                let excl_bool = |k: &str| m.get(k) == Some(&Value::Bool(true));
                if let Some(v) = num("minimum") {
                    kw.push((
                        if excl_bool("exclusiveMinimum") {
                            "gt"
                        } else {
                            "ge"
                        },
                        v,
                    ));
                }
                if let Some(v) = num("exclusiveMinimum") {
                    kw.push(("gt", v));
                }
                if let Some(v) = num("maximum") {
                    kw.push((
                        if excl_bool("exclusiveMaximum") {
                            "lt"
                        } else {
                            "le"
                        },
                        v,
                    ));
                }
                if let Some(v) = num("exclusiveMaximum") {
                    kw.push(("lt", v));
                }
                if let Some(v) = num("multipleOf").filter(|v| v.as_f64().is_some_and(|f| f > 0.0)) {
                    kw.push(("multiple_of", v));
                }
                if t == "integer" { Ty::Int } else { Ty::Float }
            }
            "boolean" => Ty::Bool,
            "null" => Ty::Null,
            "array" => {
                if let Some(v) = num("minItems") {
                    kw.push(("min_length", v));
                }
                if let Some(v) = num("maxItems") {
                    kw.push(("max_length", v));
                }
                match m.get("items") {
                    _ if m.contains_key("prefixItems") => Ty::List(Box::new(Ty::Any)),
                    Some(items @ Value::Object(_)) => {
                        let item_hint = format!("{hint}Item");
                        Ty::List(Box::new(self.ty(items, &item_hint)))
                    }
                    _ => Ty::List(Box::new(Ty::Any)),
                }
            }
            "object" => {
                let has_props = m
                    .get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|p| !p.is_empty());
                if has_props {
                    let schema = Value::Object(m.clone());
                    let name = naming::class_name(title_or(m, hint), &mut self.taken);
                    return Ty::Class(self.build_model(&schema, &name, None, hint));
                }
                match m.get("additionalProperties") {
                    Some(ap @ Value::Object(apm)) if !apm.is_empty() => {
                        let value_hint = format!("{hint}Value");
                        Ty::Dict(Box::new(self.ty(ap, &value_hint)))
                    }
                    _ => Ty::Dict(Box::new(Ty::Any)),
                }
            }
            _ => Ty::Any,
        };
        if kw.is_empty() {
            base
        } else {
            Ty::Constrained(Box::new(base), kw)
        }
    }

    fn enum_ty(&mut self, values: &[Value], m: &Map<String, Value>, hint: &str) -> Ty {
        let mut uniq: Vec<&Value> = Vec::new();
        for v in values {
            if !uniq.contains(&v) {
                uniq.push(v);
            }
        }
        let nullable = uniq.iter().any(|v| v.is_null());
        let non_null: Vec<&Value> = uniq.iter().copied().filter(|v| !v.is_null()).collect();
        if non_null.is_empty() {
            return Ty::Null;
        }
        let strings: Option<Vec<String>> = non_null
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect();
        let base = match strings {
            Some(strings) if strings.len() >= 2 => {
                let base_name = naming::pascal_case(title_or(m, hint));
                let key = (base_name, strings);
                if let Some(name) = self.enum_cache.get(&key) {
                    Ty::Class(name.clone())
                } else {
                    let name = naming::class_name(&key.0, &mut self.taken);
                    let refs: Vec<&str> = key.1.iter().map(String::as_str).collect();
                    let members = naming::enum_member_names(&refs)
                        .into_iter()
                        .zip(key.1.iter().cloned())
                        .collect();
                    self.classes.push(ClassSpec::Enum(EnumSpec {
                        name: name.clone(),
                        members,
                    }));
                    self.enum_cache.insert(key, name.clone());
                    Ty::Class(name)
                }
            }
            _ if non_null.iter().all(|v| literal_ok(v)) => {
                Ty::Literal(non_null.into_iter().cloned().collect())
            }
            _ => return Ty::Any,
        };
        if nullable {
            Ty::union(vec![base, Ty::Null])
        } else {
            base
        }
    }

    fn ref_ty(&mut self, r: &str, hint: &str) -> Ty {
        match self.refs.get(r) {
            Some(RefState::Done(t)) => return t.clone(),
            Some(RefState::Open(Some(name))) => {
                let name = name.clone();
                if let Some(flag) = self.open.last_mut() {
                    *flag = true;
                }
                return Ty::Class(name);
            }
            Some(RefState::Open(None)) => return Ty::Any,
            None => {}
        }
        let Some(target) = self.resolve(r) else {
            return Ty::Any;
        };
        let last = r
            .rsplit('/')
            .next()
            .map(|s| percent_decode(s).replace("~1", "/").replace("~0", "~"));
        let def_hint = match last.as_deref() {
            Some(s) if !s.is_empty() && s != "#" => s.to_string(),
            _ => hint.to_string(),
        };
        let normalized = self.normalize(target);
        let becomes_model = is_object_schema(&normalized)
            && normalized
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| !p.is_empty());
        let ty = if becomes_model {
            let hint_src = normalized
                .as_object()
                .map(|m| title_or(m, &def_hint).to_string());
            let name =
                naming::class_name(hint_src.as_deref().unwrap_or(&def_hint), &mut self.taken);
            self.refs
                .insert(r.to_string(), RefState::Open(Some(name.clone())));
            self.build_model(&normalized, &name, None, &def_hint);
            Ty::Class(name)
        } else {
            self.refs.insert(r.to_string(), RefState::Open(None));
            self.ty(target, &def_hint)
        };
        self.refs.insert(r.to_string(), RefState::Done(ty.clone()));
        ty
    }

    /// Builds a model class named `name` (already reserved or fixed) from an object schema and
    /// appends it after the classes its fields need. Returns the name.
    fn build_model(&mut self, s: &Value, name: &str, doc: Option<String>, hint: &str) -> String {
        let s = self.normalize(s);
        self.taken.insert(name.to_string());
        let empty = Map::new();
        let m = s.as_object().unwrap_or(&empty);
        let required: HashSet<&str> = m
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        self.open.push(false);
        let mut fields = Vec::new();
        if is_object_schema(&s) || m.contains_key("properties") {
            for (prop, ps) in m
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let prop_hint = if prop.chars().any(|c| c.is_ascii_alphanumeric()) {
                    prop.as_str()
                } else {
                    hint
                };
                let ty = self.ty(ps, prop_hint);
                let pm = ps.as_object();
                fields.push(FieldSpec {
                    wire: prop.clone(),
                    ty,
                    required: required.contains(prop.as_str()),
                    default: pm.and_then(|pm| pm.get("default")).cloned(),
                    description: pm
                        .and_then(|pm| pm.get("description"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .filter(|d| !d.trim().is_empty()),
                });
            }
        }
        let (extra, extra_ty) = match m.get("additionalProperties") {
            Some(Value::Bool(false)) => (Extra::Forbid, None),
            Some(ap @ Value::Object(apm)) if !apm.is_empty() => {
                let value_hint = format!("{name}Value");
                let t = self.ty(ap, &value_hint);
                (Extra::Allow, if t == Ty::Any { None } else { Some(t) })
            }
            _ => (Extra::Allow, None),
        };
        if self.open.pop().unwrap_or(false) {
            self.rebuild.push(name.to_string());
        }
        let doc = m
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| !d.trim().is_empty())
            .map(str::to_string)
            .or(doc);
        self.classes.push(ClassSpec::Model(ModelSpec {
            name: name.to_string(),
            doc,
            fields,
            extra,
            extra_ty,
            root: None,
        }));
        name.to_string()
    }
}

fn title_or<'m>(m: &'m Map<String, Value>, hint: &'m str) -> &'m str {
    match m.get("title").and_then(Value::as_str) {
        Some(t) if t.chars().any(|c| c.is_ascii_alphabetic()) => t,
        _ => hint,
    }
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[i + 1..i + 3])
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
