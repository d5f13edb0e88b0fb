//! `--approve ask` for clients of MCP 2026-07-28, which has no server-to-client requests: multi
//! round-trip requests (SEP-2322). A cell that reaches tool calls (or shell commands) needing the
//! user's approval is *parked*: it keeps running (its [`CellRun`] driver consumes its output)
//! while those calls wait, and the `tools/call` answers `resultType: "input_required"` with one
//! form-mode elicitation per pending approval (the same question and `remember` box as the
//! older era's `elicitation/create`, see [`super::elicit`]) and a sealed `requestState`. The
//! client asks its user and retries the same call with `inputResponses` and the echoed
//! `requestState`; the retry resumes the parked run: the cell is never run twice and its output
//! is whole in the final result.
//!
//! `requestState` is sealed with [`RequestStateCodec`] (HMAC-SHA256, a random key per process)
//! and bound to the call's arguments (associated data) and to one round of one run. Forged,
//! tampered or foreign states, a state of an older round (a replay), and a state whose run no
//! longer waits are refused with a clear error, and nothing runs. The server-side entry is what
//! makes a state valid: a retry that never comes leaves the waiting calls to fail in the kernel
//! with `ApprovalTimeout` after the approval timeout; the cell then runs on to its end, and its
//! result is kept for [`RETENTION`] for a late retry, then dropped.
//!
//! Not here: when a run is parked (the request loop in [`super`]), the questions
//! ([`super::elicit`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipybox::tools::ApprovalRequest;
use rmcp::model::{
    ElicitRequest, ElicitResult, ElicitationAction, InputRequest, InputRequests,
    InputRequiredResult, InputResponses, RequestStateCodec, SealOptions,
};
use serde::{Deserialize, Serialize};

use super::cell::CellRun;
use super::elicit;
use super::session::{Caller, KernelSession};

/// How long a parked run's result is kept after the cell ended, for a late retry.
pub(crate) const RETENTION: Duration = Duration::from_secs(60);

/// The runs waiting for a retry, and the key that seals their `requestState`.
pub(crate) struct Rounds {
    codec: RequestStateCodec,
    parked: Mutex<HashMap<u64, Parked>>,
    next_id: AtomicU64,
}

/// One run waiting for the user's answers.
struct Parked {
    run: CellRun,
    /// The kernel session the run belongs to: the retry continues there, whatever it names.
    session: Arc<KernelSession>,
    /// The approvals asked about in this round, by their input-request key.
    asked: BTreeMap<String, ApprovalRequest>,
    round: u64,
}

/// Which round of which run a request belongs to (for the next [`Rounds::park`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundId {
    id: u64,
    round: u64,
}

/// What `requestState` carries (signed, not secret).
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Which parked run.
    id: u64,
    /// Which round of it: an older round's state is a replay.
    round: u64,
}

/// Why a retry was refused; the text is for the model (nothing ran).
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

impl Rounds {
    pub(crate) fn new() -> Self {
        let key: [u8; 32] = rand::random();
        Self {
            codec: RequestStateCodec::try_new(key.to_vec()).expect("a 32-byte key is accepted"),
            parked: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Parks `run` until the client answers `asking`, and returns the `input_required` result to
    /// send. `resumed` is the round this request answered (`None` for a new call); `binding` is
    /// the call's arguments: a retry must carry the same.
    pub(crate) fn park(
        self: &Arc<Self>,
        resumed: Option<RoundId>,
        run: CellRun,
        asking: Vec<ApprovalRequest>,
        binding: &[u8],
        session: &Arc<KernelSession>,
    ) -> InputRequiredResult {
        let (id, round) = match resumed {
            Some(r) => (r.id, r.round + 1),
            None => (self.next_id.fetch_add(1, Ordering::Relaxed), 0),
        };
        let mut requests = InputRequests::new();
        let mut asked = BTreeMap::new();
        for (i, request) in asking.into_iter().enumerate() {
            let key = format!("approval-{round}-{i}");
            requests.insert(
                key.clone(),
                InputRequest::Elicitation(ElicitRequest::new(elicit::elicitation(&request))),
            );
            asked.insert(key, request);
        }
        let state = serde_json::to_vec(&State { id, round }).unwrap_or_default();
        let sealed = self
            .codec
            .seal_with(&state, &SealOptions::new().associated_data(binding));
        let mut ended = run.watch();
        let watched = run.clone();
        self.lock().insert(
            id,
            Parked {
                run,
                session: session.clone(),
                asked,
                round,
            },
        );
        // A retry that never comes: drop the entry some time after the cell ended (its waiting
        // calls failed with ApprovalTimeout, then it ran to its end).
        let rounds = Arc::downgrade(self);
        tokio::spawn(async move {
            while !watched.snapshot(usize::MAX).ended {
                if ended.changed().await.is_err() {
                    break;
                }
            }
            tokio::time::sleep(RETENTION).await;
            if let Some(rounds) = rounds.upgrade() {
                let mut parked = rounds.lock();
                if parked.get(&id).is_some_and(|p| p.round == round) {
                    tracing::info!("dropping the result of run {id}: no retry of round {round}");
                    parked.remove(&id);
                }
            }
        });
        InputRequiredResult::new(Some(requests), Some(sealed))
    }

    /// The parked run that `state` names, with its kernel session, after applying the user's
    /// answers to the approvals of its round (an approval without an answer counts as
    /// cancelled); with the round, for the next [`Rounds::park`]. Only `caller`, the credential
    /// whose call parked it, may resume it.
    pub(crate) fn resume(
        &self,
        state: &str,
        binding: &[u8],
        responses: Option<&InputResponses>,
        caller: &Caller,
    ) -> Result<(CellRun, RoundId, Arc<KernelSession>), Refused> {
        let opened: State = self.codec.open_json_with(state, binding).map_err(|e| {
            Refused(format!(
                "this requestState is not valid for this call ({e}): it was altered, belongs to other arguments or to another ipybox process. Nothing ran.\n  help: retry with the arguments and requestState of the input_required result exactly as received, or run the cell again without requestState"
            ))
        })?;
        let mut parked = self.lock();
        let gone = || {
            Refused(
                "this requestState names a cell that no longer waits: it was answered already, or its result was dropped after the approval timeout and a further minute. Nothing ran.\n  help: run the cell again without requestState".into(),
            )
        };
        // Another credential's state is answered as one that does not exist.
        if parked
            .get(&opened.id)
            .is_some_and(|p| &p.session.owner != caller)
        {
            return Err(gone());
        }
        let Some(entry) = parked.remove(&opened.id) else {
            return Err(gone());
        };
        if entry.round != opened.round {
            let current = entry.round;
            parked.insert(opened.id, entry);
            return Err(Refused(format!(
                "this requestState is stale: round {} of this cell was answered already (it waits in round {current}). Nothing ran.\n  help: retry with the requestState of the newest input_required result",
                opened.round
            )));
        }
        drop(parked);
        for (key, request) in entry.asked {
            let answer = responses
                .and_then(|r| r.get(&key))
                .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok())
                .unwrap_or_else(|| ElicitResult::new(ElicitationAction::Cancel));
            elicit::answer(request, &answer, &entry.session.allowances);
        }
        Ok((
            entry.run,
            RoundId {
                id: opened.id,
                round: opened.round,
            },
            entry.session,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_bound_to_arguments_and_process() {
        let rounds = Rounds::new();
        let sealed = rounds.codec.seal_with(
            &serde_json::to_vec(&State { id: 7, round: 2 }).unwrap(),
            &SealOptions::new().associated_data(b"args"),
        );
        let opened: State = rounds.codec.open_json_with(&sealed, b"args").unwrap();
        assert_eq!((opened.id, opened.round), (7, 2));
        // Other arguments, another process's key, a tampered value.
        assert!(
            rounds
                .codec
                .open_json_with::<State>(&sealed, b"other")
                .is_err()
        );
        assert!(
            Rounds::new()
                .codec
                .open_json_with::<State>(&sealed, b"args")
                .is_err()
        );
        let mut tampered = sealed.clone();
        tampered.pop();
        assert!(
            rounds
                .codec
                .open_json_with::<State>(&tampered, b"args")
                .is_err()
        );
    }
}
