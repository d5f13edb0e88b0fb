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
//! and bound to the call's arguments (associated data) and to one round of one run. What a retry
//! gets, by what its state is:
//!
//! - **not genuine** (altered, forged, sealed for other arguments or by another ipybox process),
//!   **another credential's**, or **stale** (a round that was answered already, a replay): a
//!   JSON-RPC error (invalid params), and nothing runs. This is what the MCP conformance runner's
//!   `sep-2322-reject-tampered-state` expects; another credential's state is refused with the
//!   very words of a forged one (it reveals nothing).
//! - **an answer that is not an elicitation result** (`inputResponses` of the wrong shape): a
//!   JSON-RPC error too; the round still waits, so a corrected retry answers it. A key without
//!   an answer counts as cancelled; keys nobody asked about are ignored.
//! - **genuine but late**: nobody retried while the round waited, so its calls failed in the
//!   kernel (`ApprovalTimeout` after the approval timeout) and the cell ran on to its end. The
//!   run is not kept; what happened is ([`Gone`], at most [`MAX_RECORDS`] for [`RECORD_KEPT`]),
//!   with the cell's result text (at most [`LATE_TEXT_CHARS`], the newest [`MAX_LATE_TEXTS`], for
//!   [`LATE_TEXT_KEPT`]). The late retry gets a tool result that says so, in words for the model:
//!   the calls were not made, the cell ran once and ended, here is its result (or it is no longer
//!   kept); nothing runs now.
//!
//! Not here: when a run is parked (the request loop in [`super`]), the questions
//! ([`super::elicit`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipybox::tools::ApprovalRequest;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, ContentBlock, ElicitRequest, ElicitResult, ElicitationAction, InputRequest,
    InputRequests, InputRequiredResult, InputResponses, RequestStateCodec, SealOptions,
};
use serde::{Deserialize, Serialize};

use super::caller::Caller;
use super::cell::CellRun;
use super::elicit;
use super::results::{failure_text, truncate_output};
use super::session::KernelSession;

/// How many rounds that cannot be resumed any more are remembered (the oldest are forgotten).
pub(crate) const MAX_RECORDS: usize = 256;
/// ... and for how long.
pub(crate) const RECORD_KEPT: Duration = Duration::from_secs(24 * 3600);
/// The result text of a cell that ended while its round waited is kept this long for a late
/// retry ...
pub(crate) const LATE_TEXT_KEPT: Duration = Duration::from_secs(600);
/// ... for the newest this many such cells ...
pub(crate) const MAX_LATE_TEXTS: usize = 32;
/// ... and at most this many characters of it (the start, as a result is truncated).
pub(crate) const LATE_TEXT_CHARS: usize = 4000;
/// The longest description of a call in a late answer's text ...
const CALL_CHARS: usize = 200;
/// ... and how many calls of a round are named (a round asks at most 8 at once).
const MAX_CALLS: usize = 8;

/// The runs waiting for a retry, what became of the rounds that cannot be resumed any more, and
/// the key that seals their `requestState`.
pub(crate) struct Rounds {
    codec: RequestStateCodec,
    parked: Mutex<HashMap<u64, Parked>>,
    gone: Mutex<GoneRecords>,
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

/// A round that can no longer be resumed: what a retry naming it is told.
struct Gone {
    owner: Caller,
    round: u64,
    since: Instant,
    what: GoneWhat,
}

enum GoneWhat {
    /// A retry resumed it: another retry is a replay.
    Answered,
    /// The cell ended while the round waited for its answers.
    Ended {
        /// The calls the round asked about (described, shortened): not made.
        calls: Vec<String>,
        /// The cell's result text and whether it failed, while kept.
        result: Option<(String, bool)>,
    },
}

/// [`Gone`] records by run id, oldest first, bounded.
#[derive(Default)]
struct GoneRecords {
    by_id: HashMap<u64, Gone>,
    order: VecDeque<u64>,
    /// Run ids whose record holds a result text, oldest first.
    texts: VecDeque<u64>,
}

impl GoneRecords {
    fn insert(&mut self, id: u64, gone: Gone) {
        let has_text = matches!(
            gone.what,
            GoneWhat::Ended {
                result: Some(_),
                ..
            }
        );
        if self.by_id.insert(id, gone).is_none() {
            self.order.push_back(id);
        }
        if has_text {
            self.texts.retain(|t| *t != id);
            self.texts.push_back(id);
        }
        self.expire();
    }

    /// Forgets what is too old or too many.
    fn expire(&mut self) {
        while self.order.len() > MAX_RECORDS
            || self
                .order
                .front()
                .and_then(|id| self.by_id.get(id))
                .is_some_and(|g| g.since.elapsed() > RECORD_KEPT)
        {
            if let Some(id) = self.order.pop_front() {
                self.by_id.remove(&id);
            }
        }
        while let Some(&id) = self.texts.front() {
            let Some(gone) = self.by_id.get_mut(&id) else {
                self.texts.pop_front();
                continue;
            };
            if self.texts.len() <= MAX_LATE_TEXTS && gone.since.elapsed() <= LATE_TEXT_KEPT {
                break;
            }
            if let GoneWhat::Ended { result, .. } = &mut gone.what {
                *result = None;
            }
            self.texts.pop_front();
        }
    }
}

/// Why a retry did not resume a run.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Not genuine, another credential's, or stale: a JSON-RPC error, nothing ran.
    Invalid(ErrorData),
    /// Genuine but late: the tool result that says what happened (nothing ran now).
    Late(Box<CallToolResult>),
}

/// The words for a state that is not genuine, and for another credential's (the same: nothing
/// is revealed).
const NOT_VALID: &str = "this requestState is not valid for this call: it was altered, belongs to other arguments, to another credential or to another ipybox process. Nothing ran.\n  help: retry with the arguments and requestState of the input_required result exactly as received, or run the cell again without requestState";

fn invalid(message: String) -> Refused {
    Refused::Invalid(ErrorData::invalid_params(message, None))
}

/// "3 s", "4 min", "2 h".
fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

impl Rounds {
    pub(crate) fn new() -> Self {
        let key: [u8; 32] = rand::random();
        Self {
            codec: RequestStateCodec::try_new(key.to_vec()).expect("a 32-byte key is accepted"),
            parked: Mutex::default(),
            gone: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gone(&self) -> std::sync::MutexGuard<'_, GoneRecords> {
        self.gone.lock().unwrap_or_else(|p| p.into_inner())
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
        // A retry that never comes: once the cell has ended (its waiting calls failed with
        // ApprovalTimeout, then it ran to its end), the run goes and what happened stays.
        let rounds = Arc::downgrade(self);
        tokio::spawn(async move {
            while !watched.snapshot(usize::MAX).ended {
                if ended.changed().await.is_err() {
                    break;
                }
            }
            if let Some(rounds) = rounds.upgrade() {
                rounds.ended_while_parked(id, round);
            }
        });
        InputRequiredResult::new(Some(requests), Some(sealed))
    }

    /// Round `round` of run `id` ended without a retry (if it is still parked): the run is
    /// dropped, a [`Gone`] record with its result text kept.
    fn ended_while_parked(&self, id: u64, round: u64) {
        let entry = {
            let mut parked = self.lock();
            if parked.get(&id).is_none_or(|p| p.round != round) {
                return;
            }
            parked.remove(&id)
        };
        let Some(entry) = entry else { return };
        let calls = entry
            .asked
            .values()
            .take(MAX_CALLS)
            .map(|r| shorten(&r.describe(), CALL_CHARS))
            .collect();
        let result = entry.run.take_result().map(|result| match result {
            Ok(r) => {
                let mut text = r.text;
                if !r.images.is_empty() {
                    text.push_str(&format!(
                        "\n\n[{} image(s) were shown then and are not kept]",
                        r.images.len()
                    ));
                }
                (truncate_output(&text, LATE_TEXT_CHARS), false)
            }
            Err(e) => (truncate_output(&failure_text(&e), LATE_TEXT_CHARS), true),
        });
        tracing::info!("run {id} ended while round {round} waited: kept what happened");
        self.gone().insert(
            id,
            Gone {
                owner: entry.session.owner.clone(),
                round,
                since: Instant::now(),
                what: GoneWhat::Ended { calls, result },
            },
        );
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
        let Ok(opened) = self.codec.open_json_with::<State>(state, binding) else {
            return Err(invalid(NOT_VALID.into()));
        };
        let mut parked = self.lock();
        match parked.get(&opened.id) {
            // Another credential's state is answered as one that is not valid.
            Some(p) if &p.session.owner != caller => return Err(invalid(NOT_VALID.into())),
            Some(p) if p.round != opened.round => {
                return Err(invalid(format!(
                    "this requestState is stale: round {} of this cell was answered already (it waits in round {}). Nothing ran.\n  help: retry with the requestState of the newest input_required result",
                    opened.round, p.round
                )));
            }
            // An answer that is not an elicitation result: refused, and the round still waits
            // (a corrected retry can answer it).
            Some(p) => {
                if let Some((key, e)) = p.asked.keys().find_map(|key| {
                    let value = responses.and_then(|r| r.get(key))?;
                    serde_json::from_value::<ElicitResult>(value.clone())
                        .err()
                        .map(|e| (key, e))
                }) {
                    return Err(invalid(format!(
                        "inputResponses[\"{key}\"] is not an elicitation result ({e}). Nothing ran; the cell still waits for this answer.\n  help: answer each key of inputRequests with {{\"action\": \"accept\" | \"decline\" | \"cancel\", \"content\": {{...}}}}"
                    )));
                }
            }
            None => {
                drop(parked);
                return Err(self.not_parked(&opened, caller));
            }
        }
        let entry = parked
            .remove(&opened.id)
            .expect("checked under the same lock");
        drop(parked);
        self.gone().insert(
            opened.id,
            Gone {
                owner: caller.clone(),
                round: opened.round,
                since: Instant::now(),
                what: GoneWhat::Answered,
            },
        );
        for (key, request) in entry.asked {
            // Checked above: a present answer is an elicitation result.
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

    /// A genuine state whose run is not parked: what became of it.
    fn not_parked(&self, opened: &State, caller: &Caller) -> Refused {
        let mut gone = self.gone();
        gone.expire();
        let Some(record) = gone.by_id.get(&opened.id) else {
            return Refused::Late(Box::new(CallToolResult::error(vec![ContentBlock::text(
                "[ipybox: this answer belongs to a cell that no longer waits for it, and ipybox keeps no record of that cell any more (records are kept for 24 h). Nothing ran now.]\n  help: check what the cell changed (files, variables) before running it again: running it again repeats everything it did",
            )])));
        };
        if &record.owner != caller {
            return invalid(NOT_VALID.into());
        }
        if record.round != opened.round || matches!(record.what, GoneWhat::Answered) {
            return invalid(format!(
                "this requestState is stale: round {} of this cell was answered already. Nothing ran.\n  help: retry with the requestState of the newest input_required result; a result already received stands",
                opened.round
            ));
        }
        let GoneWhat::Ended { calls, result } = &record.what else {
            unreachable!("matched above")
        };
        let calls = match calls.as_slice() {
            [one] => format!("the call it asked about was not made: {one}"),
            many => format!(
                "the {} calls it asked about were not made: {}",
                many.len(),
                many.join(", ")
            ),
        };
        let when = ago(record.since.elapsed());
        let note = format!(
            "[ipybox: this answer came too late. The cell had stopped waiting for it, so {calls}. The cell went on to its end {when} ago; it ran once, and nothing ran now."
        );
        match result {
            Some((text, failed)) => {
                let text = format!("{note} Its result:]\n\n{text}");
                let content = vec![ContentBlock::text(text)];
                Refused::Late(Box::new(if *failed {
                    CallToolResult::error(content)
                } else {
                    CallToolResult::success(content)
                }))
            }
            None => Refused::Late(Box::new(CallToolResult::error(vec![ContentBlock::text(
                format!(
                    "{note} Its output is no longer kept (ipybox keeps it {} min).]\n  help: check what the cell changed (files, variables) before running it again: running it again repeats everything it did",
                    LATE_TEXT_KEPT.as_secs() / 60
                ),
            )]))),
        }
    }
}

/// The first `max` characters of `text`, with `…` when cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
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

    fn ended(text: Option<&str>) -> Gone {
        Gone {
            owner: Caller::Local,
            round: 0,
            since: Instant::now(),
            what: GoneWhat::Ended {
                calls: vec!["fx.add(a=1, b=2)".into()],
                result: text.map(|t| (t.to_string(), false)),
            },
        }
    }

    fn late_text(rounds: &Rounds, id: u64) -> String {
        match rounds.not_parked(&State { id, round: 0 }, &Caller::Local) {
            Refused::Late(result) => match &result.content[0] {
                ContentBlock::Text(t) => t.text.clone(),
                other => panic!("{other:?}"),
            },
            Refused::Invalid(e) => panic!("{e:?}"),
        }
    }

    /// What is kept of rounds that cannot be resumed is bounded: result texts for the newest
    /// MAX_LATE_TEXTS cells, records for the newest MAX_RECORDS; what is told then.
    #[test]
    fn late_records_are_bounded_and_say_what_is_gone() {
        let rounds = Rounds::new();
        for id in 0..(MAX_LATE_TEXTS as u64 + 1) {
            rounds.gone().insert(id, ended(Some("out")));
        }
        assert!(late_text(&rounds, 1).ends_with("Its result:]\n\nout"));
        let oldest = late_text(&rounds, 0);
        assert!(
            oldest.starts_with("[ipybox: this answer came too late. The cell had stopped waiting for it, so the call it asked about was not made: fx.add(a=1, b=2). The cell went on to its end 0 s ago; it ran once, and nothing ran now. Its output is no longer kept (ipybox keeps it 10 min).]\n  help: "),
            "{oldest}"
        );
        for id in 100..(100 + MAX_RECORDS as u64) {
            rounds.gone().insert(id, ended(None));
        }
        assert_eq!(rounds.gone().by_id.len(), MAX_RECORDS);
        assert!(
            late_text(&rounds, 0).starts_with("[ipybox: this answer belongs to a cell that no longer waits for it, and ipybox keeps no record of that cell any more"),
        );
        // Another credential's record: refused as not valid.
        let other = Caller::Token([7; 32]);
        assert!(matches!(
            rounds.not_parked(&State { id: 100, round: 0 }, &other),
            Refused::Invalid(e) if e.message.starts_with(NOT_VALID)
        ));
    }
}
