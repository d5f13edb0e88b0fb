//! Placeholder: filled in by the tool-calling issue.
