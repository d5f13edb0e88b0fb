//! Whether one more kernel session may open (docs/http.md "What the service may use"): the
//! service's `--max-sessions`, each token's `--max-sessions-per-token`, and the memory budget
//! (`--service-memory`: every open session's `--session-memory` reserved in full). The flags'
//! values, read and checked at start-up, and the refusal a client gets.

use std::collections::HashMap;
use std::sync::Arc;

use ipybox::confine::limits::format_bytes;
use ipybox::confine::service::{self, MemoryBudget};

use super::super::mcp_server::caller::Caller;
use super::super::mcp_server::session::KernelSession;
use super::super::metrics;

/// Reads `--max-sessions-per-token`: a number, `off`, or `auto` (`max_sessions` shared out
/// evenly, rounded up, when there are several tokens; no own limit with one).
pub(crate) fn per_token(
    value: &str,
    max_sessions: usize,
    tokens: usize,
) -> Result<Option<usize>, String> {
    match value.trim() {
        "off" => Ok(None),
        "auto" => Ok((tokens > 1).then(|| max_sessions.div_ceil(tokens).max(1))),
        n => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!(
                "invalid --max-sessions-per-token `{value}`\n  help: pass a number of sessions (1 or more), `auto` or `off`"
            )),
        },
    }
}

/// Reads `--service-memory` (bytes, `auto`, `off`) for sessions of `per_session` bytes each,
/// and checks that the limits can be honoured together: a budget below one session (plus the
/// warm ones started ahead) or above the machine's memory is refused; `--max-sessions` beyond
/// what the budget holds is said (sessions past it are refused at admission).
pub(crate) fn memory_budget(
    value: &str,
    per_session: u64,
    max_sessions: usize,
    warm: usize,
) -> Result<Option<MemoryBudget>, String> {
    let total = match value.trim() {
        "off" => return Ok(None),
        "auto" => match service::default_total() {
            Some(total) => total,
            None => {
                tracing::warn!(
                    "cannot read this machine's memory (/proc/meminfo): the sessions' memory together is not bounded; help: pass --service-memory BYTES"
                );
                return Ok(None);
            }
        },
        v => ipybox::confine::limits::parse_bytes(v).map_err(|_| {
            format!(
                "invalid --service-memory `{value}`\n  help: pass bytes or a size (16G, 512M), `auto` or `off`"
            )
        })?,
    };
    let Some(budget) = MemoryBudget::new(total, per_session) else {
        return Ok(None); // sessions without a memory limit: nothing to reserve
    };
    if let Some(machine) = service::machine_memory()
        && total > machine
    {
        return Err(format!(
            "--service-memory {} is more than this machine has ({}): the sessions could not all have their memory\n  help: pass at most {}, or `auto`",
            format_bytes(total),
            format_bytes(machine),
            format_bytes(machine)
        ));
    }
    let fits = budget.sessions();
    if fits <= warm {
        return Err(format!(
            "--service-memory {} holds {fits} session(s) of --session-memory {}, and {warm} are started ahead (--warm-sessions): no client's session would fit\n  help: raise --service-memory, or lower --session-memory or --warm-sessions",
            format_bytes(total),
            format_bytes(per_session)
        ));
    }
    if max_sessions + warm > fits {
        tracing::warn!(
            "--service-memory {} holds {fits} sessions of --session-memory {} ({warm} of them started ahead, --warm-sessions): at most {} client sessions at once, not --max-sessions {max_sessions}; more are refused",
            format_bytes(total),
            format_bytes(per_session),
            fits - warm
        );
    }
    Ok(Some(budget))
}

/// What [`refusal`] checks, from the service's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    pub(crate) max_sessions: usize,
    pub(crate) max_per_token: Option<usize>,
    pub(crate) memory: Option<MemoryBudget>,
    pub(crate) warm: usize,
}

/// Why `caller` may not open one more session while `open` are open (`None`: it may), and how
/// sessions come free (`freed`, for the help line). A refusal is counted.
pub(crate) fn refusal(
    admission: Admission,
    open: &HashMap<[u8; 16], Arc<KernelSession>>,
    caller: &Caller,
    freed: &str,
) -> Option<String> {
    let why = if open.len() >= admission.max_sessions {
        format!(
            "too many sessions: this ipybox already runs the maximum of {} kernel sessions (--max-sessions)\n  help: retry later ({freed}), end a handshake-era MCP session you no longer need, or ask the operator for a higher --max-sessions",
            admission.max_sessions,
        )
    } else if let Some(budget) = admission.memory
        && open.len() + admission.warm >= budget.sessions()
    {
        format!(
            "the service's memory is taken: {} open sessions of {} each (--session-memory) fill the {} all sessions may use (--service-memory)\n  help: retry later ({freed}), or ask the operator for a lower --session-memory or a higher --service-memory",
            open.len() + admission.warm,
            format_bytes(budget.per_session),
            format_bytes(budget.total),
        )
    } else if let Some(cap) = admission.max_per_token
        && open.values().filter(|s| s.owner == *caller).count() >= cap
    {
        format!(
            "too many sessions for this token: it already has the maximum of {cap} open kernel sessions (--max-sessions-per-token)\n  help: end one of its sessions or let it idle ({freed}), or ask the operator for a higher --max-sessions-per-token"
        )
    } else {
        return None;
    };
    metrics::session_refused();
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_token_shares_out_max_sessions_among_several_tokens() {
        assert_eq!(per_token("auto", 32, 1), Ok(None));
        assert_eq!(per_token("auto", 3, 2), Ok(Some(2)));
        assert_eq!(per_token("auto", 32, 3), Ok(Some(11)));
        assert_eq!(per_token("off", 3, 2), Ok(None));
        assert_eq!(per_token("5", 3, 2), Ok(Some(5)));
        assert!(per_token("0", 3, 2).unwrap_err().contains("1 or more"));
    }

    #[test]
    fn a_budget_that_holds_no_session_is_refused() {
        let err = memory_budget("1G", 2 << 30, 4, 1).unwrap_err();
        assert!(err.contains("holds 0 session(s)"), "{err}");
        assert_eq!(memory_budget("off", 2 << 30, 4, 1), Ok(None));
        let budget = memory_budget("5G", 2 << 30, 4, 1).unwrap().unwrap();
        assert_eq!(budget.sessions(), 2);
        assert!(
            memory_budget("64T", 1 << 30, 4, 1)
                .unwrap_err()
                .contains("more than this machine has")
        );
        assert!(
            memory_budget("lots", 1 << 30, 4, 1)
                .unwrap_err()
                .contains("invalid --service-memory")
        );
    }
}
