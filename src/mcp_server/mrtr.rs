//! `--approve ask` for clients of MCP 2026-07-28, which has no server-to-client requests: multi
//! round-trip requests (SEP-2322). A cell that reaches tool calls (or shell commands) needing the
//! user's approval is *parked*, still running and waiting inside those calls, and the
//! `tools/call` answers `resultType: "input_required"` with one form-mode elicitation per pending
//! approval (the same question and `remember` box as the older era's `elicitation/create`, see
//! [`super::elicit`]) and a sealed `requestState`. The client asks its user and retries the same
//! call with `inputResponses` and the echoed `requestState`; the retry resumes the parked
//! execution: the cell is never run twice and its output is whole in the final result.
//!
//! `requestState` is sealed with [`RequestStateCodec`] (HMAC-SHA256, a random key per process),
//! bound to the call's arguments (associated data) and to one round of one execution, and expires
//! with the approval timeout. Forged, tampered, expired, replayed (an older round) or unknown
//! states are refused with a clear error and nothing runs. A parked execution whose retry never
//! comes is dropped after the approval timeout: its calls have failed in the kernel with
//! `ApprovalTimeout` by then, and dropping it rejects whatever it asks later.
//!
//! Not here: when an execution is parked (the cell driver in [`super`]), the questions
//! ([`super::elicit`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipybox::executor::Execution;
use ipybox::tools::ApprovalRequest;
use rmcp::model::{
    ElicitRequest, ElicitResult, ElicitationAction, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, RequestStateCodec, RequestStateError, SealOptions,
};
use serde::{Deserialize, Serialize};

use super::elicit::{self, SessionAllowances};

/// A parked execution is dropped this long after its state expired.
const GRACE: Duration = Duration::from_secs(5);

/// The executions waiting for a retry, and the key that seals their `requestState`.
pub(crate) struct Pauses {
    codec: RequestStateCodec,
    parked: Mutex<HashMap<u64, Parked>>,
    next_id: AtomicU64,
}

/// One execution waiting for the user's answers.
struct Parked {
    execution: Execution,
    /// The approvals asked about in this round, by their input-request key.
    pending: BTreeMap<String, ApprovalRequest>,
    round: u64,
}

/// What `requestState` carries (signed, not secret).
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Which parked execution.
    id: u64,
    /// Which round of it: an older round's state is a replay.
    round: u64,
}

/// Why a retry was refused; the text is for the model (nothing ran).
#[derive(Debug)]
pub(super) struct Refused(pub(super) String);

impl Pauses {
    pub(crate) fn new() -> Self {
        let key: [u8; 32] = rand::random();
        Self {
            codec: RequestStateCodec::try_new(key.to_vec()).expect("a 32-byte key is long enough"),
            parked: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks `execution` (round `round` of it, 0 for a new one; `id` when resumed) until the
    /// client answers `pending`, and returns the `input_required` result to send. `binding` is
    /// the call's arguments: a retry must carry the same.
    pub(super) fn park(
        self: &Arc<Self>,
        resumed: Option<(u64, u64)>,
        execution: Execution,
        pending: Vec<ApprovalRequest>,
        binding: &[u8],
        ttl: Duration,
    ) -> InputRequiredResult {
        let (id, round) = match resumed {
            Some((id, round)) => (id, round + 1),
            None => (self.next_id.fetch_add(1, Ordering::Relaxed), 0),
        };
        let mut requests = InputRequests::new();
        let mut waiting = BTreeMap::new();
        for (i, request) in pending.into_iter().enumerate() {
            let key = format!("approval-{round}-{i}");
            requests.insert(
                key.clone(),
                InputRequest::Elicitation(ElicitRequest::new(elicit::elicitation(&request))),
            );
            waiting.insert(key, request);
        }
        let state = serde_json::to_vec(&State { id, round }).unwrap_or_default();
        let sealed = self.codec.seal_with(
            &state,
            &SealOptions::new().associated_data(binding).ttl(ttl),
        );
        self.lock().insert(
            id,
            Parked {
                execution,
                pending: waiting,
                round,
            },
        );
        // Nobody came back: drop the execution (its calls timed out in the kernel already).
        let pauses = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(ttl.saturating_add(GRACE)).await;
            if let Some(pauses) = pauses.upgrade() {
                let mut parked = pauses.lock();
                if parked.get(&id).is_some_and(|p| p.round == round) {
                    tracing::info!("dropping execution {id}: no retry of round {round} came");
                    parked.remove(&id);
                }
            }
        });
        InputRequiredResult::new(Some(requests), Some(sealed))
    }

    /// The parked execution that `state` names, after applying the user's answers to its
    /// pending approvals; with its id and round (for the next [`Pauses::park`]).
    pub(super) fn resume(
        &self,
        state: &str,
        binding: &[u8],
        responses: Option<&InputResponses>,
        allowances: &SessionAllowances,
    ) -> Result<(Execution, (u64, u64)), Refused> {
        let opened: State = self.codec.open_json_with(state, binding).map_err(|e| {
            Refused(match e {
                RequestStateError::Expired => "this requestState has expired: the approval timeout passed, so the tool calls it asked about failed in the kernel with ApprovalTimeout. Nothing ran now.\n  help: run the cell again (without requestState)".to_string(),
                _ => format!("this requestState is not valid for this call ({e}): it was altered, belongs to other arguments or to another ipybox process. Nothing ran.\n  help: retry with the requestState and arguments of the input_required result exactly as received, or run the cell again without requestState"),
            })
        })?;
        let mut parked = self.lock();
        let current = parked.get(&opened.id).map(|p| p.round);
        if current != Some(opened.round) {
            return Err(Refused(match current {
                Some(round) => format!(
                    "this requestState is stale: round {} of this execution was already answered (it is at round {round}). Nothing ran.\n  help: retry with the requestState of the newest input_required result",
                    opened.round
                ),
                None => "this requestState names an execution that no longer waits (it was answered, cancelled or dropped). Nothing ran.\n  help: run the cell again without requestState".to_string(),
            }));
        }
        let Some(entry) = parked.remove(&opened.id) else {
            unreachable!("checked above under the same lock");
        };
        drop(parked);
        for (key, request) in entry.pending {
            let answer = responses
                .and_then(|r| r.get(&key))
                .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok());
            match answer {
                Some(result) => elicit::answer(request, &result, allowances),
                None => elicit::answer(
                    request,
                    &ElicitResult::new(ElicitationAction::Cancel),
                    allowances,
                ),
            }
        }
        Ok((entry.execution, (opened.id, opened.round)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_bound_to_arguments_process_and_time() {
        let pauses = Pauses::new();
        let sealed = pauses.codec.seal_with(
            &serde_json::to_vec(&State { id: 7, round: 2 }).unwrap(),
            &SealOptions::new()
                .associated_data(b"args")
                .ttl(Duration::from_secs(60)),
        );
        let opened: State = pauses.codec.open_json_with(&sealed, b"args").unwrap();
        assert_eq!((opened.id, opened.round), (7, 2));
        // Other arguments, another process's key, a tampered value.
        assert!(
            pauses
                .codec
                .open_json_with::<State>(&sealed, b"other")
                .is_err()
        );
        assert!(
            Pauses::new()
                .codec
                .open_json_with::<State>(&sealed, b"args")
                .is_err()
        );
        let mut tampered = sealed.clone();
        tampered.pop();
        assert!(
            pauses
                .codec
                .open_json_with::<State>(&tampered, b"args")
                .is_err()
        );
    }
}
