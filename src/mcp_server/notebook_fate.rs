//! `NotebookFate`: what became of a session's notebook file once the host stopped writing it.
//! A leaf of `mcp_server/`: the session holds one (`session`), the notebook resources read it
//! (`notebook`), the HTTP service's quota sets it (`http::notebook_quota`), and it needs none of
//! them.

/// What became of a session's notebook when the host stopped writing it (a quota, see
/// `http::notebook_quota`): the reason, for its resource and, once, for the model.
#[derive(Debug, Default)]
pub(crate) struct NotebookFate {
    /// Why the notebook is no longer written, and whether a result has told the model.
    state: std::sync::Mutex<(Option<String>, bool)>,
}

impl NotebookFate {
    fn state(&self) -> std::sync::MutexGuard<'_, (Option<String>, bool)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The notebook is no longer written, for `why` (the first reason stays).
    pub(crate) fn set(&self, why: String) {
        let mut state = self.state();
        if state.0.is_none() {
            state.0 = Some(why);
        }
    }

    /// Why the notebook is no longer written, if it is not.
    pub(crate) fn gone(&self) -> Option<String> {
        self.state().0.clone()
    }

    /// The reason, the first time it is asked for (what the next result tells the model).
    pub(crate) fn take_untold(&self) -> Option<String> {
        let mut state = self.state();
        if state.1 {
            return None;
        }
        let why = state.0.clone()?;
        state.1 = true;
        Some(why)
    }
}
