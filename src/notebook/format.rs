//! The session notebook's JSON (nbformat 4.5): the notebook around its cells, code cells with
//! their outputs and `ipybox` metadata, the markdown cells that mark sections, and the UTC times
//! they carry.
//!
//! Each cell is serialized once, when it ends (see [`super::Notebook`]); the notebook is the
//! cells joined inside a fixed head and tail, so appending to the file never serializes old cells
//! again. Not here: what a cell holds while it runs ([`super::record`]), files.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// The notebook's head up to the first cell.
pub(crate) const HEAD: &[u8] = b"{\n \"cells\": [\n";

/// The notebook's tail after the last cell: its metadata and format version.
pub(crate) fn tail(metadata: &Value) -> Vec<u8> {
    let metadata = serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into());
    format!("\n ],\n \"metadata\": {metadata},\n \"nbformat\": 4,\n \"nbformat_minor\": 5\n}}\n")
        .into_bytes()
}

/// The notebook-level metadata: a Python kernelspec (Jupyter opens the notebook with it) and
/// what ipybox knows of the session.
/// `confinement`: how the session's kernels were confined, when known (`ipybox replay` runs
/// under it; any serializable value: the ledger's `Confinement`, which reads this layout back
/// and so sits above this module).
pub(crate) fn notebook_metadata<C: serde::Serialize>(
    tag: &str,
    started: &str,
    part: u32,
    confinement: Option<&C>,
) -> Value {
    let mut ipybox = json!({
        "session": tag,
        "started": started,
        "version": env!("CARGO_PKG_VERSION"),
    });
    if part > 1 {
        ipybox["part"] = part.into();
    }
    if let Some(confinement) = confinement {
        ipybox["confinement"] = serde_json::to_value(confinement).unwrap_or_default();
    }
    json!({
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "ipybox": ipybox,
    })
}

/// A code cell.
pub(crate) fn code_cell(
    id: &str,
    source: &str,
    execution_count: u32,
    outputs: Vec<Value>,
    metadata: Value,
) -> Value {
    json!({
        "cell_type": "code",
        "execution_count": execution_count,
        "id": id,
        "metadata": {"ipybox": metadata},
        "outputs": outputs,
        "source": source,
    })
}

/// A markdown cell; `ipybox` is its `ipybox` metadata (what kind of note it is).
pub(crate) fn markdown_cell(id: &str, source: &str, ipybox: Value) -> Value {
    json!({
        "cell_type": "markdown",
        "id": id,
        "metadata": {"ipybox": ipybox},
        "source": source,
    })
}

/// A `stream` output.
pub(crate) fn stream(name: &str, text: &str) -> Value {
    json!({"output_type": "stream", "name": name, "text": text})
}

/// An `execute_result` or `display_data` output with one MIME bundle entry.
pub(crate) fn rich(result: Option<u32>, mime: &str, data: &str) -> Value {
    let mut bundle = Map::new();
    bundle.insert(mime.into(), Value::String(data.into()));
    match result {
        Some(count) => json!({
            "output_type": "execute_result",
            "execution_count": count,
            "data": bundle,
            "metadata": {},
        }),
        None => json!({"output_type": "display_data", "data": bundle, "metadata": {}}),
    }
}

/// An `error` output.
pub(crate) fn error(ename: &str, evalue: &str, traceback: &str) -> Value {
    let lines: Vec<&str> = traceback.lines().collect();
    json!({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": lines})
}

/// `time` in UTC as `2026-05-01T09:30:05Z` (for metadata).
pub(crate) fn utc(time: SystemTime) -> String {
    let (date, (h, m, s)) = civil(time);
    format!("{date}T{h:02}:{m:02}:{s:02}Z")
}

/// `time` in UTC as `2026-05-01T09-30-05Z` (for file names: no colons).
pub(crate) fn utc_for_file(time: SystemTime) -> String {
    let (date, (h, m, s)) = civil(time);
    format!("{date}T{h:02}-{m:02}-{s:02}Z")
}

/// `time` in UTC as `09:30:05` (for notes).
pub(crate) fn utc_clock(time: SystemTime) -> String {
    let (_, (h, m, s)) = civil(time);
    format!("{h:02}:{m:02}:{s:02} UTC")
}

/// The date (`YYYY-MM-DD`) and time of day of `time` in UTC.
fn civil(time: SystemTime) -> (String, (u64, u64, u64)) {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01 (never negative here).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        (rest / 3600, rest % 3600 / 60, rest % 60),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_times() {
        let at = |secs| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(utc(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(utc(at(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(utc(at(1_777_627_805)), "2026-05-01T09:30:05Z");
        assert_eq!(utc_for_file(at(1_777_627_805)), "2026-05-01T09-30-05Z");
        assert_eq!(utc_clock(at(1_777_627_805)), "09:30:05 UTC");
        assert_eq!(utc(at(4_102_444_799)), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn a_notebook_is_its_cells_between_head_and_tail() {
        let cell = code_cell(
            "c1",
            "print(1)",
            1,
            vec![stream("stdout", "1\n")],
            json!({}),
        );
        let mut bytes = HEAD.to_vec();
        bytes.extend(serde_json::to_vec(&cell).unwrap());
        bytes.extend(tail(&notebook_metadata(
            "ab12cd34",
            "2026-05-01T09:30:05Z",
            1,
            None::<&Value>,
        )));
        let notebook: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(notebook["nbformat"], 4);
        assert_eq!(notebook["nbformat_minor"], 5);
        assert_eq!(notebook["cells"][0]["outputs"][0]["text"], "1\n");
        assert_eq!(notebook["metadata"]["ipybox"]["session"], "ab12cd34");
        assert_eq!(
            error("ValueError", "x", "Traceback\nValueError: x")["traceback"],
            json!(["Traceback", "ValueError: x"])
        );
    }
}
