//! Python names derived from schema and tool names: modules, classes, fields, enum members.
//!
//! Every function here returns an ASCII Python identifier that is not a keyword, and the
//! de-duplication is deterministic (first come keeps the name, later ones get a numeric suffix).
//! The rules are documented in `docs/apigen.md`. Escaping of literals lives in `pyliteral.rs`.

use std::collections::HashSet;

/// Python keywords, including soft keywords that are awkward as names.
const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case", "type", "_",
];

/// Attributes of pydantic's `BaseModel` that a field must not shadow (all `model_*` names too).
const BASEMODEL_ATTRS: &[&str] = &[
    "construct",
    "copy",
    "dict",
    "from_orm",
    "json",
    "parse_file",
    "parse_obj",
    "parse_raw",
    "schema",
    "schema_json",
    "update_forward_refs",
    "validate",
    "fields",
    "register",
];

/// Names used in generated annotations; a field of this name would shadow them in the class body.
const ANNOTATION_NAMES: &[&str] = &[
    "str",
    "int",
    "float",
    "bool",
    "list",
    "dict",
    "Any",
    "Literal",
    "Annotated",
    "Field",
    "BaseModel",
    "ConfigDict",
    "RootModel",
    "Enum",
    "json",
];

/// Class names the generated module already uses for imports.
const RESERVED_CLASSES: &[&str] = &[
    "Any",
    "Literal",
    "Annotated",
    "Field",
    "BaseModel",
    "ConfigDict",
    "RootModel",
    "Enum",
    "None",
    "True",
    "False",
    "Params",
    "Result",
];

pub(super) fn is_keyword(s: &str) -> bool {
    KEYWORDS.contains(&s)
}

/// True if `s` is a plain ASCII Python identifier (which is all we ever generate).
pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks a server name: an ASCII identifier and not a keyword. Returns the reason if not.
pub(super) fn check_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if !is_identifier(name) {
        return Err("it is not a Python identifier (use ASCII letters, digits and `_`, not starting with a digit)".into());
    }
    if is_keyword(name) {
        return Err("it is a Python keyword".into());
    }
    if name.starts_with("__") {
        return Err("names starting with `__` are reserved".into());
    }
    Ok(())
}

fn replace_non_ident(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Picks `base`, else `base_2`, `base_3`... (or `base2` with `sep = ""`) — the first not taken.
pub(super) fn dedupe(base: &str, taken: &HashSet<String>, sep: &str) -> String {
    if !taken.contains(base) {
        return base.to_string();
    }
    (2..)
        .map(|i| format!("{base}{sep}{i}"))
        .find(|n| !taken.contains(n))
        .expect("unbounded")
}

/// The module name for each tool, in order (see docs/apigen.md for the rules).
pub(super) fn module_names<'a>(tool_names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut taken: HashSet<String> = HashSet::new();
    taken.insert("__init__".into());
    let mut out = Vec::new();
    for name in tool_names {
        let mut base = replace_non_ident(name).to_ascii_lowercase();
        if base.is_empty() {
            base = "tool".into();
        }
        if base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert(0, '_');
        }
        // Keywords, dunder names (`__init__`, `__main__`) and `runner` (the package attribute
        // every tool module imports) get a trailing underscore.
        if is_keyword(&base) || base == "runner" || (base.starts_with("__") && base.ends_with("__"))
        {
            base.push('_');
        }
        let name = dedupe(&base, &taken, "_");
        taken.insert(name.clone());
        out.push(name);
    }
    out
}

/// PascalCase from arbitrary text: `search_repositories` -> `SearchRepositories`,
/// `richTextRequest` -> `RichTextRequest`. Never empty, never starts with a digit.
pub(super) fn pascal_case(s: &str) -> String {
    let mut out = String::new();
    for part in s.split(|c: char| !c.is_ascii_alphanumeric()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if out.is_empty() {
        out.push_str("Model");
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'N');
    }
    out
}

/// A class name for `hint`, unique among `taken` (which it is added to).
pub(super) fn class_name(hint: &str, taken: &mut HashSet<String>) -> String {
    let mut base = pascal_case(hint);
    if RESERVED_CLASSES.contains(&base.as_str()) && base != "Params" && base != "Result" {
        base.push_str("Model");
    }
    let name = dedupe(&base, taken, "");
    taken.insert(name.clone());
    name
}

/// Marks names the module needs as taken before any class is named.
pub(super) fn reserved_class_names() -> HashSet<String> {
    RESERVED_CLASSES.iter().map(|s| s.to_string()).collect()
}

/// Python names for the properties of one model, in order. A property keeps its name when it is
/// a usable field name; otherwise it gets a safe name (and is sent under its original one as an
/// alias). `class_names` are the module's classes, which a field must not shadow.
pub(super) fn field_names(props: &[&str], class_names: &HashSet<String>) -> Vec<String> {
    let usable = |p: &str| {
        is_identifier(p)
            && !is_keyword(p)
            && !p.starts_with('_')
            && !p.starts_with("model_")
            && !BASEMODEL_ATTRS.contains(&p)
            && !ANNOTATION_NAMES.contains(&p)
            && !class_names.contains(p)
    };
    let mut taken: HashSet<String> = props
        .iter()
        .filter(|p| usable(p))
        .map(|p| p.to_string())
        .collect();
    let mut out = Vec::with_capacity(props.len());
    let mut seen: HashSet<String> = HashSet::new();
    for p in props {
        if usable(p) && seen.insert(p.to_string()) {
            out.push(p.to_string());
            continue;
        }
        let mut base = replace_non_ident(p);
        let stripped = base.trim_start_matches('_');
        let had_underscore = stripped.len() != base.len();
        base = stripped.to_string();
        if base.is_empty() {
            base = "field".into();
        } else if base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert_str(0, "field_");
        }
        if had_underscore || !usable(&base) {
            base.push('_');
        }
        let name = dedupe(&base, &taken, "_");
        taken.insert(name.clone());
        seen.insert(name.clone());
        out.push(name);
    }
    out
}

/// Member names of a string enum, one per value, unique, derived from the values.
pub(super) fn enum_member_names(values: &[&str]) -> Vec<String> {
    let mut taken: HashSet<String> = HashSet::new();
    values
        .iter()
        .map(|v| {
            let mut base = replace_non_ident(v);
            if base.is_empty() {
                base = "empty".into();
            }
            if base.starts_with(|c: char| c.is_ascii_digit() || c == '_') {
                base.insert(0, 'v');
            }
            if is_keyword(&base) || base == "mro" {
                base.push('_');
            }
            let name = dedupe(&base, &taken, "_");
            taken.insert(name.clone());
            name
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules() {
        let names = module_names([
            "search-repos",
            "Search_Repos",
            "class",
            "2fa",
            "__init__",
            "runner",
            "a.b",
            "",
            "search_repos_2",
        ]);
        assert_eq!(
            names,
            [
                "search_repos",
                "search_repos_2",
                "class_",
                "_2fa",
                "__init___",
                "runner_",
                "a_b",
                "tool",
                "search_repos_2_2"
            ]
        );
    }

    #[test]
    fn fields() {
        let classes: HashSet<String> = ["Sort".to_string()].into();
        let names = field_names(
            &[
                "from", "x-y", "x_y", "schema", "_id", "2fa", "model_x", "Sort", "ok", "str", "",
            ],
            &classes,
        );
        assert_eq!(
            names,
            [
                "from_",
                "x_y_2",
                "x_y",
                "schema_",
                "id_",
                "field_2fa",
                "model_x_",
                "Sort_",
                "ok",
                "str_",
                "field"
            ]
        );
    }

    #[test]
    fn enums_and_classes() {
        assert_eq!(
            enum_member_names(&["a-b", "a_b", "1", "None", "", "_x_", "mro"]),
            ["a_b", "a_b_2", "v1", "None_", "empty", "v_x_", "mro_"]
        );
        let mut taken = reserved_class_names();
        assert_eq!(class_name("sort", &mut taken), "Sort");
        assert_eq!(class_name("Sort", &mut taken), "Sort2");
        assert_eq!(
            class_name("rich_textRequest", &mut taken),
            "RichTextRequest"
        );
        assert_eq!(class_name("None", &mut taken), "NoneModel");
        assert_eq!(class_name("3d", &mut taken), "N3d");
    }
}
