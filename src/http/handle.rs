//! Kernel session handles: what a 2026-07-28 client passes back as the `session` argument.
//!
//! `ipybox-s1.<route>.<payload>`: `route` is the replica that holds the kernel (local kernels:
//! a load balancer may route on it, e.g. from the `Mcp-Param-Session` header) or `gw` for a
//! kernel on a kernel gateway (any replica can serve it); `payload` (base64url) is the
//! session's random id (128 bits), the route or the gateway kernel's id (and which of the
//! session's kernels it is: its generation), and a 128-bit tag:
//! HMAC-SHA256 under the server's session key of all that and the caller's credential. So a
//! handle cannot be guessed or altered, works only with the token it was made for, and is
//! valid on every replica that shares the session key (`--session-secret`).
//!
//! A handle carries no secret of its own: it is a name that only its owner's token makes
//! usable. It is never logged (logs use the session's tag).
//!
//! Not here: what a session is, when it expires.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::super::mcp_server::caller::Caller;

const PREFIX: &str = "ipybox-s1.";
/// The route of handles whose kernel is on a kernel gateway.
pub(crate) const GATEWAY_ROUTE: &str = "gw";
const TAG_LEN: usize = 16;

/// Where a session's kernel is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// A local kernel of replica `route`.
    Local { replica: String },
    /// Kernel `kernel_id` on the kernel gateway (empty: its kernel never started), the
    /// session's `generation`-th kernel (0 for the first; each replacement, a reset say, counts
    /// one up), so a replica can tell a newer handle from an outdated one.
    Gateway { kernel_id: String, generation: u32 },
}

/// A handle's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) id: [u8; 16],
    pub(crate) place: Place,
}

/// Why a string is not a usable handle (the text is for the model).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// Not something ipybox makes.
    Malformed,
    /// Made for another credential, altered, or made with another session key.
    NotYours,
}

impl Invalid {
    pub(crate) fn message(&self) -> String {
        match self {
            Invalid::Malformed => "this is not an ipybox session handle (they look like `ipybox-s1.<route>.<...>`)\n  help: pass the handle exactly as a result named it, or leave `session` out to start a new session".into(),
            Invalid::NotYours => "this session handle is not valid with your credential: it was made for another token, altered, or issued by an ipybox with another --session-secret\n  help: pass a handle a result gave you, or leave `session` out to start a new session".into(),
        }
    }
}

/// Makes and checks handles with one key (the replicas of one service share it).
pub(crate) struct Handles {
    key: Vec<u8>,
}

impl Handles {
    pub(crate) fn new(key: Vec<u8>) -> Self {
        Self { key }
    }

    fn tag(&self, caller: &Caller, body: &[u8]) -> [u8; TAG_LEN] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(b"ipybox session handle v1\0");
        mac.update(&(caller.binding().len() as u32).to_be_bytes());
        mac.update(caller.binding());
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    /// The handle of `handle` for `caller`.
    pub(crate) fn encode(&self, handle: &Handle, caller: &Caller) -> String {
        let (route, detail) = match &handle.place {
            Place::Local { replica } => (replica.as_str(), replica.as_str()),
            Place::Gateway { kernel_id, .. } => (GATEWAY_ROUTE, kernel_id.as_str()),
        };
        let mut body = Vec::with_capacity(18 + detail.len() + TAG_LEN);
        body.push(match handle.place {
            Place::Local { .. } => 0,
            Place::Gateway { .. } => 2,
        });
        body.extend_from_slice(&handle.id);
        body.push(u8::try_from(detail.len()).unwrap_or(u8::MAX));
        body.extend_from_slice(&detail.as_bytes()[..detail.len().min(255)]);
        if let Place::Gateway { generation, .. } = handle.place {
            body.extend_from_slice(&generation.to_be_bytes());
        }
        let tag = self.tag(caller, &body);
        body.extend_from_slice(&tag);
        format!("{PREFIX}{route}.{}", URL_SAFE_NO_PAD.encode(body))
    }

    /// What `text` names, if it is a handle made for `caller` with this key.
    pub(crate) fn decode(&self, text: &str, caller: &Caller) -> Result<Handle, Invalid> {
        let rest = text.trim().strip_prefix(PREFIX).ok_or(Invalid::Malformed)?;
        let (route, payload) = rest.split_once('.').ok_or(Invalid::Malformed)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Invalid::Malformed)?;
        if bytes.len() < 1 + 16 + 1 + TAG_LEN {
            return Err(Invalid::Malformed);
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        let expected = self.tag(caller, body);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&expected[..], tag)) {
            return Err(Invalid::NotYours);
        }
        let kind = body[0];
        let mut id = [0; 16];
        id.copy_from_slice(&body[1..17]);
        let len = usize::from(body[17]);
        let detail = body.get(18..18 + len).ok_or(Invalid::Malformed)?;
        let tail = if kind == 2 { 4 } else { 0 };
        if 18 + len + tail != body.len() {
            return Err(Invalid::Malformed);
        }
        let detail = String::from_utf8(detail.to_vec()).map_err(|_| Invalid::Malformed)?;
        let place = match kind {
            0 if route == detail => Place::Local { replica: detail },
            2 if route == GATEWAY_ROUTE => {
                let mut generation = [0; 4];
                generation.copy_from_slice(&body[18 + len..]);
                Place::Gateway {
                    kernel_id: detail,
                    generation: u32::from_be_bytes(generation),
                }
            }
            _ => return Err(Invalid::Malformed),
        };
        Ok(Handle { id, place })
    }
}

/// Whether `name` can be a replica's name in a handle (`--replica-id`): 1–32 ASCII letters,
/// digits, `-` or `_`, and not the gateway route.
pub(crate) fn valid_replica(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && name != GATEWAY_ROUTE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(replica: &str) -> Handle {
        Handle {
            id: [7; 16],
            place: Place::Local {
                replica: replica.into(),
            },
        }
    }

    #[test]
    fn round_trip_bound_to_the_caller_and_key() {
        let handles = Handles::new(b"key one".to_vec());
        let alice = Caller::Token([1; 32]);
        let bob = Caller::Token([2; 32]);
        let gw = Handle {
            id: [9; 16],
            place: Place::Gateway {
                kernel_id: "3f1c2a44-0000-4000-8000-000000000001".into(),
                generation: 7,
            },
        };
        for handle in [local("replica-a"), gw] {
            let text = handles.encode(&handle, &alice);
            assert_eq!(handles.decode(&text, &alice), Ok(handle.clone()));
            assert_eq!(handles.decode(&text, &bob), Err(Invalid::NotYours));
            assert_eq!(
                handles.decode(&text, &Caller::Local),
                Err(Invalid::NotYours)
            );
            assert_eq!(
                Handles::new(b"key two".to_vec()).decode(&text, &alice),
                Err(Invalid::NotYours)
            );
        }
        let text = handles.encode(&local("replica-a"), &alice);
        assert!(text.starts_with("ipybox-s1.replica-a."), "{text}");
    }

    #[test]
    fn altered_and_malformed_handles_are_refused() {
        let handles = Handles::new(b"k".to_vec());
        let me = Caller::Local;
        let text = handles.encode(&local("a"), &me);
        // Another route in front of the same payload: the route is inside the tag.
        let rerouted = text.replacen("ipybox-s1.a.", "ipybox-s1.b.", 1);
        assert_eq!(handles.decode(&rerouted, &me), Err(Invalid::Malformed));
        // Every single-character change of the payload is refused.
        let payload_at = text.rfind('.').unwrap() + 1;
        for i in payload_at..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            assert!(handles.decode(&altered, &me).is_err(), "{altered}");
        }
        for bad in [
            "",
            "ipybox-s1.",
            "ipybox-s1.a.",
            "ipybox-s1.a.!!!",
            "s1.a.AAAA",
            "ipybox-s1.a.AAAA",
        ] {
            assert_eq!(handles.decode(bad, &me), Err(Invalid::Malformed), "{bad}");
        }
    }

    #[test]
    fn replica_names() {
        assert!(valid_replica("ipybox-0"));
        assert!(!valid_replica(""));
        assert!(!valid_replica("gw"));
        assert!(!valid_replica("a.b"));
        assert!(!valid_replica(&"x".repeat(33)));
    }
}
