//! Assembling what an execution printed into the text and image files a caller receives.
//!
//! Text is kept in arrival order (stdout, stderr, `execute_result` and `display_data` text/plain);
//! `image/png` outputs are decoded, written to the images directory and kept in memory (callers
//! use those bytes, never the files: the images directory is in the workspace, where a
//! sandboxed kernel can swap a file for a link to something else), and their text/plain (a repr
//! such as `<IPython.core.display.Image object>`) is left out. Files are created new, never
//! through a link, in an images directory that is not a link itself ([`crate::safe_fs`]). ANSI
//! escape sequences are removed everywhere. This module knows the shape of Jupyter outputs, not
//! how they travel.

use std::path::{Path, PathBuf};

use base64::Engine;
use jupyter_protocol::{Media, MediaType};

/// Images kept per execution unless the executor says otherwise.
pub const DEFAULT_MAX_IMAGES: usize = 16;
/// Bytes of images (decoded PNG) kept per execution unless the executor says otherwise.
pub const DEFAULT_MAX_IMAGE_BYTES: usize = 16 * 1024 * 1024;

/// How much of one execution's output is kept. Text over `max_text_bytes` keeps its first and
/// last halves, the middle replaced by a line saying how many bytes were cut; images
/// past `max_images` or `max_image_bytes` are neither saved nor kept, only counted
/// ([`ExecutionOutput::images_dropped`](super::ExecutionOutput::images_dropped)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Text kept (bytes of UTF-8); `None`: all of it.
    pub max_text_bytes: Option<usize>,
    /// Images saved and returned per execution.
    pub max_images: usize,
    /// Decoded PNG bytes saved and returned per execution (all images together).
    pub max_image_bytes: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_text_bytes: None,
            max_images: DEFAULT_MAX_IMAGES,
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

impl OutputLimits {
    /// These limits with text capped at `max` bytes too (the smaller cap wins).
    pub fn with_text_cap(mut self, max: Option<usize>) -> Self {
        self.max_text_bytes = match (self.max_text_bytes, max) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self
    }
}

/// The note that replaces the middle of text over its limit.
pub(crate) fn cut_note(cut: usize, max: usize) -> String {
    format!(
        "\n[ipybox: {cut} bytes of output cut here: at most {max} bytes of a cell's output are kept, the first and the last half]\n"
    )
}

/// Text kept within a limit while it grows: the first half of the limit, and the last half
/// (kept in a buffer that is trimmed once it reaches twice that, so appending stays linear).
#[derive(Debug, Default)]
pub(crate) struct BoundedText {
    head: String,
    tail: String,
    /// Bytes dropped between `head` and `tail`.
    cut: usize,
    max: Option<usize>,
}

impl BoundedText {
    pub(crate) fn new(max: Option<usize>) -> Self {
        Self {
            max,
            ..Self::default()
        }
    }

    pub(crate) fn push(&mut self, text: &str) {
        let Some(max) = self.max else {
            self.head.push_str(text);
            return;
        };
        let head_max = max / 2;
        let tail_max = max - head_max;
        let mut rest = text;
        if self.tail.is_empty() && self.cut == 0 && self.head.len() < head_max {
            let room = floor_char_boundary(rest, head_max - self.head.len());
            self.head.push_str(&rest[..room]);
            rest = &rest[room..];
        }
        if rest.is_empty() {
            return;
        }
        if rest.len() > tail_max {
            // Only its end can stay.
            let skip = ceil_char_boundary(rest, rest.len() - tail_max);
            self.cut += self.tail.len() + skip;
            self.tail.clear();
            rest = &rest[skip..];
        }
        self.tail.push_str(rest);
        if self.tail.len() >= 2 * tail_max.max(1) {
            self.trim_tail(tail_max);
        }
    }

    fn trim_tail(&mut self, keep: usize) {
        if self.tail.len() > keep {
            let skip = ceil_char_boundary(&self.tail, self.tail.len() - keep);
            self.cut += skip;
            self.tail.drain(..skip);
        }
    }

    /// Bytes left out so far.
    pub(crate) fn cut(&self) -> usize {
        self.cut
            + self
                .max
                .map_or(0, |max| self.tail.len().saturating_sub(max - max / 2))
    }

    /// The text kept, with the note where the middle was cut.
    pub(crate) fn text(&self) -> String {
        let cut = self.cut();
        if cut == 0 {
            return format!("{}{}", self.head, self.tail);
        }
        let max = self.max.unwrap_or_default();
        let tail = &self.tail
            [ceil_char_boundary(&self.tail, self.tail.len().saturating_sub(max - max / 2))..];
        format!("{}{}{tail}", self.head, cut_note(cut, max))
    }
}

/// `text` within `max` bytes (its first and last halves, with the note), for one string that
/// arrives whole (a traceback, an exception message).
pub(crate) fn bounded(text: String, max: Option<usize>) -> String {
    match max {
        Some(max) if text.len() > max => {
            let mut b = BoundedText::new(Some(max));
            b.push(&text);
            b.text()
        }
        _ => text,
    }
}

/// The largest index `<= at` that is a char boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The smallest index `>= at` that is a char boundary of `s`.
fn ceil_char_boundary(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Collects the outputs of one execution.
#[derive(Debug)]
pub(crate) struct OutputCollector {
    text: BoundedText,
    images: Vec<PathBuf>,
    image_data: Vec<Vec<u8>>,
    image_bytes: usize,
    images_dropped: usize,
    limits: OutputLimits,
    images_dir: PathBuf,
}

impl OutputCollector {
    pub(crate) fn new(images_dir: &Path, limits: OutputLimits) -> Self {
        Self {
            text: BoundedText::new(limits.max_text_bytes),
            images: Vec::new(),
            image_data: Vec::new(),
            image_bytes: 0,
            images_dropped: 0,
            limits,
            images_dir: images_dir.to_path_buf(),
        }
    }

    /// Appends stream text; returns the chunk as the caller should see it.
    pub(crate) fn push_stream(&mut self, text: &str) -> String {
        let clean = strip_ansi(text);
        self.text.push(&clean);
        clean
    }

    /// Appends a rich output (`execute_result` / `display_data`): its PNG, else its text/plain
    /// (an image's text/plain is only its repr, e.g. `<Figure size 640x480 with 1 Axes>`).
    /// Returns the text chunk (if any) for streaming, and the path of a saved image (if any).
    /// An image over the limits is dropped (counted, not saved).
    pub(crate) fn push_media(&mut self, media: &Media) -> (Option<String>, Option<PathBuf>) {
        let mut chunk = None;
        let mut image = None;
        let has_png = media
            .content
            .iter()
            .any(|item| matches!(item, MediaType::Png(_)));
        for item in &media.content {
            match item {
                MediaType::Png(data) => match self.save_png(data) {
                    Ok(Some((path, bytes))) => image = Some((path, bytes)),
                    Ok(None) => self.images_dropped += 1,
                    Err(e) => {
                        let msg = format!("[ipybox: could not save an image: {e}]\n");
                        self.text.push(&msg);
                        chunk = Some(msg);
                    }
                },
                MediaType::Plain(text) if chunk.is_none() && !has_png => {
                    let mut clean = strip_ansi(text);
                    if !clean.ends_with('\n') {
                        clean.push('\n');
                    }
                    self.text.push(&clean);
                    chunk = Some(clean);
                }
                _ => {}
            }
        }
        let image = image.map(|(path, bytes)| {
            self.image_bytes += bytes.len();
            self.images.push(path.clone());
            self.image_data.push(bytes);
            path
        });
        (chunk, image)
    }

    /// Decodes and saves a PNG; `None` when it would go over the image limits (nothing saved).
    fn save_png(&self, data: &str) -> std::io::Result<Option<(PathBuf, Vec<u8>)>> {
        if self.images.len() >= self.limits.max_images {
            return Ok(None);
        }
        let room = self.limits.max_image_bytes.saturating_sub(self.image_bytes);
        // Decoded, base64 is 3/4 of its length: a PNG far over the room is not even decoded.
        if data.len() / 4 * 3 > room.saturating_mul(2).saturating_add(1024) {
            return Ok(None);
        }
        // Jupyter wraps base64 in lines sometimes; drop whitespace before decoding.
        let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(compact.as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if bytes.len() > room {
            return Ok(None);
        }
        let dir = crate::safe_fs::NoFollowDir::open(&self.images_dir, Some(0o755))?;
        loop {
            let name = format!("{:08x}.png", rand::random::<u32>());
            match dir.create_new(&name, &bytes, 0o644) {
                Ok(()) => return Ok(Some((self.images_dir.join(name), bytes))),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The bytes of the last image saved (empty if none was).
    pub(crate) fn last_image_bytes(&self) -> &[u8] {
        self.image_data.last().map_or(&[], Vec::as_slice)
    }

    /// The output so far, stripped of surrounding whitespace.
    pub(crate) fn text(&self) -> String {
        self.text.text().trim().to_string()
    }

    /// The text, the image files and their bytes (same order), and how many images were
    /// dropped.
    pub(crate) fn finish(self) -> (String, Vec<PathBuf>, Vec<Vec<u8>>, usize) {
        (
            self.text.text().trim().to_string(),
            self.images,
            self.image_data,
            self.images_dropped,
        )
    }
}

/// Removes ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL/ST`, and two-byte escapes).
pub(crate) fn strip_ansi(s: &str) -> String {
    if !s.contains('\u{1b}') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                // parameters and intermediates, then one final byte in @..~
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\u{7}' {
                        break;
                    }
                    if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                        chars.next();
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{BoundedText, bounded, cut_note, strip_ansi};

    #[test]
    fn text_over_its_limit_keeps_head_and_tail_and_says_what_was_cut() {
        let mut t = BoundedText::new(Some(10));
        for c in ["abc", "defgh", "ijklmnop", "qrstuvwxyz"] {
            t.push(c);
        }
        assert_eq!(t.text(), format!("abcde{}vwxyz", cut_note(16, 10)));
        // Many small pieces: the same, whatever the pieces.
        let mut t = BoundedText::new(Some(10));
        for c in "abcdefghijklmnopqrstuvwxyz".chars() {
            t.push(&c.to_string());
        }
        assert_eq!(t.text(), format!("abcde{}vwxyz", cut_note(16, 10)));
        // Within the limit: whole, no note.
        let mut t = BoundedText::new(Some(10));
        t.push("abcdefghij");
        assert_eq!(t.text(), "abcdefghij");
        // Unlimited.
        let mut t = BoundedText::new(None);
        t.push(&"x".repeat(100_000));
        assert_eq!(t.text().len(), 100_000);
        // Characters are never split: the cut moves to a boundary.
        let mut t = BoundedText::new(Some(7));
        t.push("ééééééé");
        let kept = t.text();
        assert!(
            kept.starts_with("é\n[ipybox: ") && kept.ends_with("]\néé"),
            "{kept}"
        );
        assert_eq!(
            bounded("ab".repeat(10), Some(4)),
            format!("ab{}ab", cut_note(16, 4))
        );
        assert_eq!(bounded("abc".into(), Some(4)), "abc");
    }

    #[test]
    fn a_flood_of_text_keeps_memory_bounded() {
        let mut t = BoundedText::new(Some(1000));
        let line = "0123456789".repeat(10);
        for _ in 0..100_000 {
            t.push(&line);
            assert!(t.head.len() + t.tail.len() <= 1000 + 1000);
        }
        assert_eq!(t.cut(), 10_000_000 - 1000);
    }

    #[test]
    fn strips_csi_and_osc() {
        assert_eq!(
            strip_ansi("\u{1b}[0;31mValueError\u{1b}[0m: x"),
            "ValueError: x"
        );
        assert_eq!(
            strip_ansi("a\u{1b}]8;;http://x\u{7}link\u{1b}]8;;\u{1b}\\b"),
            "alinkb"
        );
        assert_eq!(strip_ansi("plain"), "plain");
    }
}
