//! The codeact skill over MCP (the skills extension, SEP-2640): `skills/list`, `skills/get`,
//! `resources/list`, `resources/read` and `resources/directory/read` of
//! `skill://codeact/...`, so any client that supports the extension gets the skill without the
//! Claude Code plugin.
//!
//! One source: the files are `skills/codeact/` of this repository, the folder the Claude Code
//! marketplace ships, embedded in the binary at build time ([`ipybox::SKILLS`]). At start they are written to a
//! private temporary directory and loaded into rmcp's [`SkillCatalog`], which keeps the bytes in
//! memory (the directory is removed right after).
//!
//! Not here: the other MCP tools.

use rmcp::ErrorData;
use rmcp::handler::server::skill_catalog::SkillCatalog;
use rmcp::model::{
    GetSkillResult, ListResourcesResult, ListSkillsResult, ReadResourceDirectoryResult,
    ReadResourceResult,
};

/// The skills served; empty (and logged) if they could not be loaded.
pub(crate) struct Skills(Option<SkillCatalog>);

impl Skills {
    /// Loads the embedded skills.
    pub(crate) fn load() -> Self {
        match load() {
            Ok(catalog) => Self(Some(catalog)),
            Err(e) => {
                tracing::warn!("the codeact skill is not served over MCP: {e}");
                Self(None)
            }
        }
    }

    pub(crate) fn list(&self) -> ListSkillsResult {
        self.0.as_ref().map_or_else(
            || ListSkillsResult::with_all_items(Vec::new()),
            |c| c.list_skills(),
        )
    }

    pub(crate) fn get(&self, uri: &str) -> Result<GetSkillResult, ErrorData> {
        match &self.0 {
            Some(catalog) => catalog.get_skill(uri),
            None => Err(ErrorData::invalid_params(
                format!("unknown skill {uri}"),
                None,
            )),
        }
    }

    pub(crate) fn resources(&self) -> ListResourcesResult {
        ListResourcesResult::with_all_items(
            self.0.as_ref().map(|c| c.resources()).unwrap_or_default(),
        )
    }

    pub(crate) fn read(&self, uri: &str) -> Option<ReadResourceResult> {
        self.0.as_ref()?.read_resource(uri)
    }

    pub(crate) fn read_directory(
        &self,
        uri: &str,
    ) -> Result<ReadResourceDirectoryResult, ErrorData> {
        match &self.0 {
            Some(catalog) => catalog.read_resource_directory(uri),
            None => Err(ErrorData::invalid_params(
                format!("not a directory: {uri}"),
                None,
            )),
        }
    }
}

fn load() -> std::io::Result<SkillCatalog> {
    let dir = tempfile::Builder::new()
        .prefix("ipybox-skills-")
        .tempdir()?;
    ipybox::SKILLS.extract(dir.path())?;
    SkillCatalog::from_dir(dir.path()).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_codeact_skill_byte_for_byte() {
        let skills = Skills::load();
        let listed = skills.list();
        let uris: Vec<&str> = listed.skills.iter().map(|s| s.uri.as_str()).collect();
        assert_eq!(uris, ["skill://codeact/SKILL.md"]);
        // Byte for byte what was embedded (tests/integration/mcp_modern.rs compares the served
        // files with skills/codeact/ on disk).
        for file in ["SKILL.md", "references/output-parsers.md"] {
            let read = skills.read(&format!("skill://codeact/{file}")).unwrap();
            let embedded = ipybox::SKILLS
                .get_file(format!("codeact/{file}"))
                .unwrap()
                .contents_utf8()
                .unwrap();
            match &read.contents[0] {
                rmcp::model::ResourceContents::TextResourceContents { text, .. } => {
                    assert_eq!(text, embedded, "{file}")
                }
                other => panic!("{file}: {other:?}"),
            }
        }
    }
}
