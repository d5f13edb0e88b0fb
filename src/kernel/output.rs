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

/// Collects the outputs of one execution.
#[derive(Debug)]
pub(crate) struct OutputCollector {
    text: String,
    images: Vec<PathBuf>,
    image_data: Vec<Vec<u8>>,
    images_dir: PathBuf,
}

impl OutputCollector {
    pub(crate) fn new(images_dir: &Path) -> Self {
        Self {
            text: String::new(),
            images: Vec::new(),
            image_data: Vec::new(),
            images_dir: images_dir.to_path_buf(),
        }
    }

    /// Appends stream text; returns the chunk as the caller should see it.
    pub(crate) fn push_stream(&mut self, text: &str) -> String {
        let clean = strip_ansi(text);
        self.text.push_str(&clean);
        clean
    }

    /// Appends a rich output (`execute_result` / `display_data`): its PNG, else its text/plain
    /// (an image's text/plain is only its repr, e.g. `<Figure size 640x480 with 1 Axes>`).
    /// Returns the text chunk (if any) for streaming, and the path of a saved image (if any).
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
                    Ok((path, bytes)) => image = Some((path, bytes)),
                    Err(e) => {
                        let msg = format!("[ipybox: could not save an image: {e}]\n");
                        self.text.push_str(&msg);
                        chunk = Some(msg);
                    }
                },
                MediaType::Plain(text) if chunk.is_none() && !has_png => {
                    let mut clean = strip_ansi(text);
                    if !clean.ends_with('\n') {
                        clean.push('\n');
                    }
                    self.text.push_str(&clean);
                    chunk = Some(clean);
                }
                _ => {}
            }
        }
        let image = image.map(|(path, bytes)| {
            self.images.push(path.clone());
            self.image_data.push(bytes);
            path
        });
        (chunk, image)
    }

    fn save_png(&self, data: &str) -> std::io::Result<(PathBuf, Vec<u8>)> {
        // Jupyter wraps base64 in lines sometimes; drop whitespace before decoding.
        let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(compact.as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let dir = crate::safe_fs::NoFollowDir::open(&self.images_dir, Some(0o755))?;
        loop {
            let name = format!("{:08x}.png", rand::random::<u32>());
            match dir.create_new(&name, &bytes, 0o644) {
                Ok(()) => return Ok((self.images_dir.join(name), bytes)),
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
        self.text.trim().to_string()
    }

    /// The text, the image files and their bytes (same order).
    pub(crate) fn finish(self) -> (String, Vec<PathBuf>, Vec<Vec<u8>>) {
        (self.text.trim().to_string(), self.images, self.image_data)
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
    use super::strip_ansi;

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
