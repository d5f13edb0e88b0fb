//! Reading a notebook back, for `ipybox replay`: its code cells in order with the sections
//! between them (a reset or a replaced kernel: the replay resets too), and what of a cell's
//! outputs a replay compares.
//!
//! Any nbformat 4 notebook reads (Jupyter's own too); the `ipybox` metadata of a recorded one
//! adds each cell's timeout, output limit and status. Compared are a cell's stdout and stderr
//! (each whole: how a cell's writes to the two interleave depends on timing), the text of its
//! results and displays, its images (bytes), and its error (type and message: a traceback names
//! the execution count). Not here: running cells (the binary's `replay`).

use std::time::Duration;

use serde_json::Value;

/// Why a file is not a notebook ipybox can replay.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "not a Jupyter notebook: {0}\n  help: pass an .ipynb file (ipybox writes them under the workspace's notebooks/)"
    )]
    NotJson(#[from] serde_json::Error),
    #[error(
        "not a Jupyter notebook of format 4 ({0})\n  help: convert it with `jupyter nbconvert --to notebook --nbformat 4`"
    )]
    Format(String),
}

/// One entry of a notebook, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A code cell.
    Code(Box<RecordedCell>),
    /// A new section: the kernel was reset or replaced (`reset`, `kernel replaced`,
    /// `restarted`) here.
    Section(String),
    /// `install_package(spec)` ran here.
    Installed(String),
}

/// A code cell as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCell {
    /// Its number among the notebook's code cells, from 1.
    pub number: usize,
    pub source: String,
    /// The timeout it ran with, if recorded.
    pub timeout: Option<Duration>,
    /// The caller's limit on its text (the MCP tool's `max_output_chars`), if recorded.
    pub output_limit: Option<usize>,
    /// How it ended (`ok`, `error`, `timed out`, ...), if recorded.
    pub status: Option<String>,
    pub outputs: Outputs,
}

/// What a replay compares of a cell's outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outputs {
    pub stdout: String,
    pub stderr: String,
    /// The text/plain of each `execute_result` and text-only `display_data`, in order.
    pub texts: Vec<String>,
    /// Each image, base64 (whitespace removed).
    pub images: Vec<String>,
    /// The error's type and message.
    pub error: Option<(String, String)>,
}

/// The entries of `bytes`, a notebook.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, ReadError> {
    let notebook: Value = serde_json::from_slice(bytes)?;
    match notebook.get("nbformat").and_then(Value::as_u64) {
        Some(4) => {}
        Some(n) => return Err(ReadError::Format(format!("it is format {n}"))),
        None => return Err(ReadError::Format("it has no `nbformat`".into())),
    }
    let cells = notebook
        .get("cells")
        .and_then(Value::as_array)
        .ok_or_else(|| ReadError::Format("it has no `cells` list".into()))?;
    let mut entries = Vec::new();
    let mut number = 0;
    for cell in cells {
        let meta = &cell["metadata"]["ipybox"];
        match cell["cell_type"].as_str() {
            Some("code") => {
                number += 1;
                entries.push(Entry::Code(Box::new(RecordedCell {
                    number,
                    source: text(&cell["source"]),
                    timeout: meta["timeout"]
                        .as_f64()
                        .filter(|t| t.is_finite() && *t > 0.0)
                        .map(|t| Duration::from_secs_f64(t.min(86_400.0 * 365.0))),
                    output_limit: meta["output_limit"].as_u64().map(|n| n as usize),
                    status: meta["status"].as_str().map(str::to_string),
                    outputs: outputs(cell),
                })));
            }
            Some("markdown") => match (meta["section"].as_str(), meta["installed"].as_str()) {
                (Some("start") | None, None) => {}
                (Some(kind), _) => entries.push(Entry::Section(kind.to_string())),
                (None, Some(spec)) => entries.push(Entry::Installed(spec.to_string())),
            },
            _ => {}
        }
    }
    Ok(entries)
}

/// What a replay compares of `cell`'s outputs (a code cell's JSON).
pub fn outputs(cell: &Value) -> Outputs {
    let mut out = Outputs::default();
    let Some(list) = cell["outputs"].as_array() else {
        return out;
    };
    for output in list {
        match output["output_type"].as_str() {
            Some("stream") => {
                let into = match output["name"].as_str() {
                    Some("stderr") => &mut out.stderr,
                    _ => &mut out.stdout,
                };
                into.push_str(&text(&output["text"]));
            }
            Some("execute_result" | "display_data") => {
                let data = &output["data"];
                match data.get("image/png") {
                    Some(png) => out
                        .images
                        .push(text(png).chars().filter(|c| !c.is_whitespace()).collect()),
                    None => {
                        if let Some(plain) = data.get("text/plain") {
                            out.texts.push(text(plain));
                        }
                    }
                }
            }
            Some("error") => {
                out.error = Some((
                    output["ename"].as_str().unwrap_or_default().to_string(),
                    output["evalue"].as_str().unwrap_or_default().to_string(),
                ))
            }
            _ => {}
        }
    }
    out
}

impl Outputs {
    /// How `replayed` differs from these (recorded) outputs, one line per part that differs;
    /// empty when they are the same.
    pub fn differences(&self, replayed: &Outputs) -> Vec<String> {
        let mut lines = Vec::new();
        for (what, a, b) in [
            ("stdout", &self.stdout, &replayed.stdout),
            ("stderr", &self.stderr, &replayed.stderr),
        ] {
            if a != b {
                lines.push(format!("{what} differs: {}", first_difference(a, b)));
            }
        }
        if self.texts != replayed.texts {
            lines.push(format!(
                "results differ: {}",
                first_difference(&self.texts.join("\n"), &replayed.texts.join("\n"))
            ));
        }
        if self.images != replayed.images {
            let same = self
                .images
                .iter()
                .zip(&replayed.images)
                .filter(|(a, b)| a == b)
                .count();
            lines.push(format!(
                "images differ: {} recorded, {} replayed, {same} identical",
                self.images.len(),
                replayed.images.len()
            ));
        }
        if self.error != replayed.error {
            let show = |e: &Option<(String, String)>| match e {
                None => "no error".to_string(),
                Some((ename, evalue)) => format!("{ename}: {}", shorten(evalue, 80)),
            };
            lines.push(format!(
                "error differs: recorded {}, replayed {}",
                show(&self.error),
                show(&replayed.error)
            ));
        }
        lines
    }
}

/// Where `a` and `b` first differ, as a short excerpt of each from the start of that line.
fn first_difference(a: &str, b: &str) -> String {
    let at = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()));
    let line_start = |s: &str| s[..at.min(s.len())].rfind('\n').map_or(0, |i| i + 1);
    let excerpt = |s: &str| {
        let from = line_start(s);
        format!("{:?}", shorten(&s[from..], 60))
    };
    format!("recorded {}, replayed {}", excerpt(a), excerpt(b))
}

fn shorten(s: &str, max: usize) -> String {
    crate::tools::shorten(s, max)
}

/// A notebook's multi-line string: a string, or a list of strings to join.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_cells_sections_and_outputs() {
        let notebook = json!({
            "nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [
                {"cell_type": "markdown", "id": "a", "metadata": {"ipybox": {"section": "start"}}, "source": "x"},
                {"cell_type": "code", "id": "b", "execution_count": 1, "source": ["x = 1\n", "print(x)"],
                 "metadata": {"ipybox": {"timeout": 2.5, "output_limit": 100, "status": "ok"}},
                 "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": ["1\n"]},
                    {"output_type": "stream", "name": "stderr", "text": "w\n"},
                    {"output_type": "stream", "name": "stdout", "text": "2\n"},
                    {"output_type": "display_data", "data": {"image/png": "iVBO\nRw==", "text/plain": "<Image>"}, "metadata": {}},
                    {"output_type": "execute_result", "execution_count": 1, "data": {"text/plain": "3"}, "metadata": {}},
                 ]},
                {"cell_type": "markdown", "id": "c", "metadata": {"ipybox": {"section": "reset"}}, "source": "---"},
                {"cell_type": "markdown", "id": "d", "metadata": {"ipybox": {"installed": "numpy"}}, "source": "i"},
                {"cell_type": "markdown", "id": "e", "metadata": {}, "source": "a note"},
                {"cell_type": "code", "id": "f", "execution_count": 1, "source": "1/0", "metadata": {},
                 "outputs": [{"output_type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": []}]},
            ]
        });
        let entries = parse(&serde_json::to_vec(&notebook).unwrap()).unwrap();
        assert_eq!(entries.len(), 4);
        let Entry::Code(first) = &entries[0] else {
            panic!("{entries:?}")
        };
        assert_eq!(first.source, "x = 1\nprint(x)");
        assert_eq!(first.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(first.output_limit, Some(100));
        assert_eq!(
            first.outputs,
            Outputs {
                stdout: "1\n2\n".into(),
                stderr: "w\n".into(),
                texts: vec!["3".into()],
                images: vec!["iVBORw==".into()],
                error: None,
            }
        );
        assert_eq!(entries[1], Entry::Section("reset".into()));
        assert_eq!(entries[2], Entry::Installed("numpy".into()));
        let Entry::Code(last) = &entries[3] else {
            panic!()
        };
        assert_eq!(last.number, 2);
        assert_eq!(
            last.outputs.error,
            Some(("ZeroDivisionError".into(), "division by zero".into()))
        );
    }

    #[test]
    fn differences_name_what_differs() {
        let recorded = Outputs {
            stdout: "a\nb 1\n".into(),
            ..Default::default()
        };
        let mut replayed = recorded.clone();
        assert!(recorded.differences(&replayed).is_empty());
        replayed.stdout = "a\nb 2\n".into();
        replayed.error = Some(("ValueError".into(), "x".into()));
        assert_eq!(
            recorded.differences(&replayed),
            [
                "stdout differs: recorded \"b 1\\n\", replayed \"b 2\\n\"",
                "error differs: recorded no error, replayed ValueError: x",
            ]
        );
    }

    #[test]
    fn what_is_not_a_notebook_says_so() {
        let e = parse(b"{").unwrap_err().to_string();
        assert!(e.starts_with("not a Jupyter notebook: "), "{e}");
        let e = parse(br#"{"nbformat": 3, "worksheets": []}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("not a Jupyter notebook of format 4 (it is format 3)"),
            "{e}"
        );
    }
}
