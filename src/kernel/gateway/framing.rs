//! Jupyter messages on a kernel's WebSocket (`/api/kernels/{id}/channels`), in both framings the
//! Jupyter servers speak:
//!
//! - `v1.kernel.websocket.jupyter.org` (binary): `n` (u64 LE), then `n` offsets (u64 LE), then the
//!   channel name and the parts `header`, `parent_header`, `metadata`, `content`, buffers…; part
//!   `i` spans `offsets[i]..offsets[i+1]` (offset 0 is the channel);
//! - legacy (text): one JSON object with the four parts and a `channel` key.
//!
//! Which one is used is decided by the server's answer to the subprotocol offer.

use jupyter_protocol::JupyterMessage;
use jupyter_protocol::messaging::Channel;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

/// The subprotocol ipybox offers.
pub(crate) const V1_PROTOCOL: &str = "v1.kernel.websocket.jupyter.org";

/// How messages are framed on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    V1,
    Legacy,
}

fn channel_name(channel: &Channel) -> &'static str {
    match channel {
        Channel::Shell => "shell",
        Channel::Control => "control",
        Channel::Stdin => "stdin",
        Channel::IOPub => "iopub",
        Channel::Heartbeat => "hb",
    }
}

fn parse_channel(name: &str) -> Option<Channel> {
    Some(match name {
        "shell" => Channel::Shell,
        "control" => Channel::Control,
        "stdin" => Channel::Stdin,
        "iopub" => Channel::IOPub,
        "hb" => Channel::Heartbeat,
        _ => return None,
    })
}

/// A message for `channel` as a WebSocket frame.
pub(crate) fn encode(
    msg: &JupyterMessage,
    channel: Channel,
    framing: Framing,
) -> serde_json::Result<Message> {
    match framing {
        Framing::Legacy => {
            let mut value = serde_json::to_value(msg)?;
            value["channel"] = Value::String(channel_name(&channel).into());
            Ok(Message::Text(serde_json::to_string(&value)?.into()))
        }
        Framing::V1 => {
            let value = serde_json::to_value(msg)?;
            let parts: Vec<Vec<u8>> = ["header", "parent_header", "metadata", "content"]
                .iter()
                .map(|k| serde_json::to_vec(value.get(*k).unwrap_or(&Value::Null)))
                .collect::<Result<_, _>>()?;
            let name = channel_name(&channel).as_bytes();
            let count = parts.len() + 2;
            let mut offsets = Vec::with_capacity(count);
            offsets.push(8 * (1 + count));
            offsets.push(offsets[0] + name.len());
            for part in &parts {
                offsets.push(offsets[offsets.len() - 1] + part.len());
            }
            let mut frame = Vec::with_capacity(offsets[offsets.len() - 1]);
            frame.extend_from_slice(&(count as u64).to_le_bytes());
            for offset in &offsets {
                frame.extend_from_slice(&(*offset as u64).to_le_bytes());
            }
            frame.extend_from_slice(name);
            for part in &parts {
                frame.extend_from_slice(part);
            }
            Ok(Message::Binary(frame.into()))
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("malformed v1 frame: {0}")]
    Frame(&'static str),
    #[error("unknown channel `{0}`")]
    Channel(String),
    #[error("invalid message JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unreadable message: {0}")]
    Message(String),
}

/// The channel and message of a frame; `None` for frames that carry no message (ping, pong,
/// close).
pub(crate) fn decode(frame: &Message) -> Result<Option<(Channel, JupyterMessage)>, DecodeError> {
    let value = match frame {
        Message::Binary(bytes) => decode_v1(bytes)?,
        Message::Text(text) => serde_json::from_str::<Value>(text)?,
        _ => return Ok(None),
    };
    let Some(name) = value.get("channel").and_then(Value::as_str) else {
        return Err(DecodeError::Frame("no channel"));
    };
    let channel = parse_channel(name).ok_or_else(|| DecodeError::Channel(name.to_string()))?;
    let msg = JupyterMessage::from_value(value).map_err(|e| DecodeError::Message(e.to_string()))?;
    Ok(Some((channel, msg)))
}

/// A v1 frame as the JSON object the legacy framing would have carried.
fn decode_v1(bytes: &[u8]) -> Result<Value, DecodeError> {
    let word = |i: usize| -> Result<usize, DecodeError> {
        let chunk = bytes
            .get(8 * i..8 * i + 8)
            .ok_or(DecodeError::Frame("truncated offsets"))?;
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        usize::try_from(u64::from_le_bytes(b)).map_err(|_| DecodeError::Frame("offset too large"))
    };
    let count = word(0)?;
    if !(6..=1 << 16).contains(&count) {
        return Err(DecodeError::Frame("fewer than four message parts"));
    }
    let offsets: Vec<usize> = (1..=count).map(word).collect::<Result<_, _>>()?;
    let part = |i: usize| -> Result<&[u8], DecodeError> {
        let start = offsets[i];
        let end = offsets.get(i + 1).copied().unwrap_or(bytes.len());
        bytes
            .get(start..end)
            .filter(|_| start <= end)
            .ok_or(DecodeError::Frame("offset out of range"))
    };
    let channel = std::str::from_utf8(part(0)?).map_err(|_| DecodeError::Frame("channel"))?;
    let mut value = serde_json::Map::new();
    value.insert("channel".into(), Value::String(channel.into()));
    for (i, key) in ["header", "parent_header", "metadata", "content"]
        .iter()
        .enumerate()
    {
        value.insert((*key).into(), serde_json::from_slice(part(i + 1)?)?);
    }
    Ok(Value::Object(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::{ExecuteRequest, JupyterMessageContent};

    #[test]
    fn both_framings_round_trip() {
        let msg: JupyterMessage = ExecuteRequest::new("print('é')".into()).into();
        for framing in [Framing::V1, Framing::Legacy] {
            let frame = encode(&msg, Channel::Shell, framing).unwrap();
            let (channel, back) = decode(&frame).unwrap().unwrap();
            assert!(matches!(channel, Channel::Shell));
            assert_eq!(back.header.msg_id, msg.header.msg_id);
            match back.content {
                JupyterMessageContent::ExecuteRequest(r) => assert_eq!(r.code, "print('é')"),
                other => panic!("unexpected content {other:?}"),
            }
        }
    }

    #[test]
    fn v1_layout_matches_jupyter_server() {
        // The layout of jupyter_server's serialize_msg_to_ws_v1: 6 offsets (channel + 4 parts
        // + end), the first is 8 * (1 + 6) = 56, the channel name sits right after the offsets.
        let msg: JupyterMessage = ExecuteRequest::new(String::new()).into();
        let Message::Binary(frame) = encode(&msg, Channel::IOPub, Framing::V1).unwrap() else {
            panic!("v1 frames are binary");
        };
        assert_eq!(u64::from_le_bytes(frame[0..8].try_into().unwrap()), 6);
        assert_eq!(u64::from_le_bytes(frame[8..16].try_into().unwrap()), 56);
        assert_eq!(u64::from_le_bytes(frame[16..24].try_into().unwrap()), 61);
        assert_eq!(&frame[56..61], b"iopub");
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        for bytes in [
            vec![],
            vec![1, 2, 3],
            [6u64, 56, 61, 9999, 0, 0, 0]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>(),
        ] {
            assert!(decode(&Message::Binary(bytes.into())).is_err());
        }
        assert!(decode(&Message::Text("{}".into())).is_err());
        assert!(decode(&Message::Ping(Vec::new().into())).unwrap().is_none());
    }
}
