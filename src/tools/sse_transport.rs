//! Legacy HTTP+SSE MCP client transport (protocol 2024-11-05), which rmcp no longer ships.
//!
//! `GET` the SSE URL; the server's first `endpoint` event names (relative to the SSE URL) where
//! to `POST` JSON-RPC messages; every later `message` event is one server JSON-RPC message.
//! The endpoint must have the SSE URL's origin (so configured headers never go elsewhere).
//!
//! This is a transport only: the MCP handshake and everything above it is rmcp's. There is no
//! reconnect: when the SSE stream ends, the session ends.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use reqwest::{Url, header::HeaderMap};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use sse_stream::{Sse, SseStream};

/// Errors of the SSE transport.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SseTransportError {
    #[error("HTTP request failed: {0}")]
    Http(#[from] reqwest::Error),
    #[error("server answered {status} to {what}{}", if body.is_empty() { String::new() } else { format!(": {body}") })]
    Status {
        what: &'static str,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("{0}")]
    Protocol(String),
    #[error("cannot encode message: {0}")]
    Json(#[from] serde_json::Error),
}

type EventStream = Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>;

/// A connected legacy SSE transport: usable with `rmcp::serve_client`.
pub(crate) struct SseClientTransport {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
    events: EventStream,
}

impl SseClientTransport {
    /// Opens the SSE stream and waits for the `endpoint` event.
    pub(crate) async fn connect(
        client: reqwest::Client,
        url: Url,
        headers: HeaderMap,
    ) -> Result<Self, SseTransportError> {
        let resp = client
            .get(url.clone())
            .headers(headers.clone())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await?;
        let resp = success(resp, "the SSE GET").await?;
        let mut events: EventStream = Box::pin(SseStream::from_bytes_stream(resp.bytes_stream()));
        let endpoint = loop {
            match events.next().await {
                None => {
                    return Err(SseTransportError::Protocol(
                        "the SSE stream ended before the server sent its `endpoint` event".into(),
                    ));
                }
                Some(Err(e)) => {
                    return Err(SseTransportError::Protocol(format!(
                        "reading the SSE stream failed: {e}"
                    )));
                }
                Some(Ok(ev)) if ev.event.as_deref() == Some("endpoint") => {
                    let data = ev.data.unwrap_or_default();
                    let endpoint = url.join(data.trim()).map_err(|e| {
                        SseTransportError::Protocol(format!(
                            "the `endpoint` event carries an invalid URL `{data}`: {e}"
                        ))
                    })?;
                    if endpoint.origin() != url.origin() {
                        return Err(SseTransportError::Protocol(format!(
                            "the `endpoint` event points to another origin ({}); refusing to send messages there",
                            endpoint.origin().ascii_serialization()
                        )));
                    }
                    break endpoint;
                }
                Some(Ok(_)) => continue,
            }
        };
        tracing::debug!(path = endpoint.path(), "legacy SSE endpoint received");
        Ok(Self {
            client,
            endpoint,
            headers,
            events,
        })
    }
}

impl Transport<RoleClient> for SseClientTransport {
    type Error = SseTransportError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let request = self
            .client
            .post(self.endpoint.clone())
            .headers(self.headers.clone());
        async move {
            let body = serde_json::to_vec(&item)?;
            let resp = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await?;
            success(resp, "a message POST").await?;
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.events.next().await? {
                Err(e) => {
                    tracing::warn!("legacy SSE stream failed: {e}");
                    return None;
                }
                Ok(ev) => {
                    if !matches!(ev.event.as_deref(), None | Some("message")) {
                        continue;
                    }
                    let Some(data) = ev.data else { continue };
                    match serde_json::from_str(&data) {
                        Ok(msg) => return Some(msg),
                        Err(e) => {
                            tracing::warn!("ignoring an SSE message that is not JSON-RPC: {e}")
                        }
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.events = Box::pin(futures::stream::empty());
        Ok(())
    }
}

/// `resp` if its status is a success, else an error with the status and the body's start.
async fn success(
    resp: reqwest::Response,
    what: &'static str,
) -> Result<reqwest::Response, SseTransportError> {
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    Err(SseTransportError::Status {
        what,
        status,
        body: body.chars().take(500).collect(),
    })
}
