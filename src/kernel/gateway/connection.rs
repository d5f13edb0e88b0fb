//! One kernel on a Jupyter server: its WebSocket, kept open across dropped connections, and how
//! its messages reach the execution.
//!
//! A connection task owns the socket: frames from the server go to the kernel's shell and iopub
//! receivers (the same ones a local kernel feeds); messages to send come from a queue, so a
//! message sent while the connection is down goes out once it is back. When the socket drops,
//! the task reconnects with the same `session_id`: Jupyter servers buffer a session's messages
//! while it is disconnected and replay them, so the running execution loses no output. It gives
//! up, and reports the kernel dead, when the server says the kernel is gone or cannot be reached
//! for [`RECONNECT_WINDOW`].
//!
//! Death: the server restarts a kernel whose process died and says so with an iopub `status` of
//! `restarting` (or `dead` when that failed); the restarted kernel has lost ipybox's runtime and
//! the user's state, so ipybox treats it as a death and replaces it.
//!
//! stdin: an `input_request` whose prompt starts with [`PROMPT_PREFIX`] is a request of
//! `ipybox_runtime` (a tool call, an approval, a module source); it is answered by the
//! executor's [`InputHandler`] on its own task, so several can be in progress. Any other input
//! request is answered with EOF (user code has no stdin, as with local kernels).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use jupyter_protocol::messaging::Channel;
use jupyter_protocol::{ExecutionState, InputReply, JupyterMessage, JupyterMessageContent};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use super::Gateway;
use super::framing::{self, Framing};
use super::ledger::Ledger;
use crate::kernel::KernelError;
use crate::kernel::proto;
use crate::kernel::status::ExitInfo;

/// Marks the input requests of `ipybox_runtime` (`python/ipybox_runtime/stdin_channel.py`).
pub(crate) const PROMPT_PREFIX: &str = "\u{1e}ipybox\u{1e}";

/// How long a dropped connection is retried before the kernel is given up.
pub(crate) const RECONNECT_WINDOW: Duration = Duration::from_secs(10);

/// Answers one `ipybox_runtime` request (the JSON after [`PROMPT_PREFIX`]) with the JSON reply.
pub(crate) type InputHandler =
    Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, String> + Send + Sync + 'static>;

/// What the connection task delivers to the kernel's receivers.
pub(crate) struct Inbound {
    pub(crate) shell: mpsc::UnboundedSender<JupyterMessage>,
    pub(crate) iopub: mpsc::UnboundedSender<JupyterMessage>,
}

/// A kernel on a Jupyter server. Dropping it deletes the kernel in the background (best effort:
/// the ledger covers a process that exits first).
pub(crate) struct RemoteKernel {
    gateway: Gateway,
    ledger: Option<Ledger>,
    pub(crate) id: String,
    outbound: mpsc::UnboundedSender<(Channel, JupyterMessage)>,
    exit: watch::Receiver<Option<ExitInfo>>,
    /// The connection's task; `None` until the WebSocket is open (a kernel whose connect fails
    /// is still deleted by `Drop`).
    task: Option<JoinHandle<()>>,
    deleted: bool,
}

impl RemoteKernel {
    /// Creates a kernel on `gateway` and opens its connection (not yet known to be ready: the
    /// caller does the `kernel_info` handshake).
    pub(crate) async fn create(
        gateway: &Gateway,
        ledger: Option<&Ledger>,
        env: &std::collections::BTreeMap<String, String>,
        inbound: Inbound,
        input: Option<InputHandler>,
    ) -> Result<Self, KernelError> {
        let id = gateway.create_kernel(env).await?;
        if let Some(ledger) = ledger {
            ledger.record(gateway, &id);
        }
        Self::open(gateway, ledger, id, inbound, input).await
    }

    /// Opens a connection to kernel `id`, which exists on `gateway` already (another ipybox
    /// created it: replicas that share a server's kernels). The kernel is not recorded in the
    /// ledger: this process did not create it.
    pub(crate) async fn attach(
        gateway: &Gateway,
        id: &str,
        inbound: Inbound,
        input: Option<InputHandler>,
    ) -> Result<Self, KernelError> {
        if gateway.kernel_status(id).await?.is_none() {
            return Err(KernelError::Gone {
                what: format!(
                    "kernel {id} is gone from the kernel gateway at {}",
                    gateway.url()
                ),
            });
        }
        Self::open(gateway, None, id.to_string(), inbound, input).await
    }

    async fn open(
        gateway: &Gateway,
        ledger: Option<&Ledger>,
        id: String,
        inbound: Inbound,
        input: Option<InputHandler>,
    ) -> Result<Self, KernelError> {
        let (outbound, outbound_rx) = mpsc::unbounded_channel();
        let (exit_tx, exit) = watch::channel(None);
        let mut kernel = RemoteKernel {
            gateway: gateway.clone(),
            ledger: ledger.cloned(),
            id: id.clone(),
            outbound: outbound.clone(),
            exit,
            task: None,
            deleted: false,
        };
        let session = uuid::Uuid::new_v4().to_string();
        let socket = connect(gateway, &id, &session).await?;
        kernel.task = Some(tokio::spawn(
            Link {
                gateway: gateway.clone(),
                id,
                session,
                inbound,
                input,
                outbound,
                exit: exit_tx,
            }
            .run(socket, outbound_rx),
        ));
        Ok(kernel)
    }

    pub(crate) fn send(&self, channel: Channel, msg: JupyterMessage) -> Result<(), KernelError> {
        self.outbound
            .send((channel, msg))
            .map_err(|_| proto("the kernel's connection is closed"))
    }

    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitInfo>> {
        self.exit.clone()
    }

    pub(crate) fn exited(&self) -> Option<String> {
        self.exit.borrow().as_ref().map(|e| e.0.clone())
    }

    pub(crate) async fn interrupt(&self) -> Result<(), KernelError> {
        self.gateway.interrupt(&self.id).await
    }

    /// Deletes the kernel on the server and closes the connection.
    pub(crate) async fn shutdown(mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        // `delete` retries a failing server for 10 s; this bounds a server that does not answer.
        match tokio::time::timeout(Duration::from_secs(20), self.gateway.delete(&self.id)).await {
            Ok(Ok(())) => {
                self.deleted = true;
                if let Some(ledger) = &self.ledger {
                    ledger.forget(&self.id);
                }
            }
            Ok(Err(e)) => tracing::warn!(kernel = %self.id, "could not delete the kernel: {e}"),
            Err(_) => tracing::warn!(kernel = %self.id, "deleting the kernel timed out"),
        }
    }

    /// Closes the connection and leaves the kernel running on the server (another replica
    /// uses it); it is forgotten from this process's ledger.
    pub(crate) fn detach(mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.deleted = true;
        if let Some(ledger) = &self.ledger {
            ledger.forget(&self.id);
        }
    }

    pub(crate) fn describe(&self) -> String {
        format!("kernel {} on {}", self.id, self.gateway.url())
    }
}

impl Drop for RemoteKernel {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if self.deleted {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let gateway = self.gateway.clone();
        let ledger = self.ledger.clone();
        let id = self.id.clone();
        handle.spawn(async move {
            if gateway.delete(&id).await.is_ok()
                && let Some(ledger) = ledger
            {
                ledger.forget(&id);
            }
        });
    }
}

/// Sends one message; if the socket fails, the message is kept in `unsent`.
async fn send(
    sink: &mut futures::stream::SplitSink<Socket, Message>,
    channel: Channel,
    msg: JupyterMessage,
    framing: Framing,
    unsent: &mut Option<(Channel, JupyterMessage)>,
) -> Result<(), String> {
    let frame = match framing::encode(&msg, channel.clone(), framing) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!("cannot encode a message: {e}");
            return Ok(());
        }
    };
    sink.send(frame).await.map_err(|e| {
        *unsent = Some((channel, msg));
        e.to_string()
    })
}

/// Acknowledges received data at once. Jupyter servers (tornado) write with Nagle's algorithm
/// on: after the first frame of a reply (the `busy` status) the next frames wait for its ACK,
/// which Linux delays by up to 40 ms, so every round trip cost ~48 ms instead of ~5. Re-arming
/// `TCP_QUICKACK` after each frame sends a pending ACK immediately (Linux only; elsewhere a no-op).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct QuickAck(std::os::fd::RawFd);

impl QuickAck {
    fn of(socket: &Socket) -> Self {
        use std::os::fd::AsRawFd;
        Self(socket.get_ref().get_ref().as_raw_fd())
    }

    fn now(&self) {
        #[cfg(target_os = "linux")]
        {
            let fd = self.0;
            let on: libc::c_int = 1;
            // SAFETY: a valid socket fd (owned by the connection, which outlives this call) and
            // an int option of the right size.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_QUICKACK,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the kernel's WebSocket; the framing is v1 if the server accepted the subprotocol.
async fn connect(
    gateway: &Gateway,
    id: &str,
    session: &str,
) -> Result<(Socket, Framing), KernelError> {
    let req = gateway.channels_request(id, session)?;
    // No Nagle: a request is one small frame, and waiting for the ACK of the previous one costs
    // a delayed-ACK period (~40 ms) per round trip.
    let (socket, resp) = tokio_tungstenite::connect_async_with_config(req, None, true)
        .await
        .map_err(|e| {
        use tokio_tungstenite::tungstenite::Error;
        match e {
            Error::Http(resp) if matches!(resp.status().as_u16(), 401 | 403) => KernelError::Start {
                reason: format!(
                    "the kernel gateway at {} refused the WebSocket of kernel {id} (HTTP {})",
                    gateway.url(),
                    resp.status().as_u16()
                ),
                help: format!("set {} to the server's token", super::TOKEN_VAR),
            },
            other => proto(format!("cannot open the WebSocket of kernel {id}: {other}")),
        }
    })?;
    let v1 = resp
        .headers()
        .get("Sec-WebSocket-Protocol")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p == framing::V1_PROTOCOL);
    let framing = if v1 { Framing::V1 } else { Framing::Legacy };
    tracing::debug!(kernel = %id, ?framing, "kernel WebSocket open");
    Ok((socket, framing))
}

/// The connection task's state.
struct Link {
    gateway: Gateway,
    id: String,
    session: String,
    inbound: Inbound,
    input: Option<InputHandler>,
    outbound: mpsc::UnboundedSender<(Channel, JupyterMessage)>,
    exit: watch::Sender<Option<ExitInfo>>,
}

/// Why one connection ended.
enum Ended {
    /// The socket dropped: reconnect.
    Dropped(String),
    /// The kernel is gone (dead, restarted by the server): stop.
    KernelGone(String),
    /// Nobody listens any more: stop.
    Closed,
}

impl Link {
    async fn run(
        self,
        first: (Socket, Framing),
        mut outbound: mpsc::UnboundedReceiver<(Channel, JupyterMessage)>,
    ) {
        let mut conn = Some(first);
        // A message whose send failed: it goes first on the next connection.
        let mut unsent = None;
        loop {
            let Some((socket, framing)) = conn.take() else {
                return;
            };
            match self
                .serve(socket, framing, &mut outbound, &mut unsent)
                .await
            {
                Ended::Closed => return,
                Ended::KernelGone(why) => return self.died(why),
                Ended::Dropped(why) => {
                    tracing::warn!(kernel = %self.id, why = ?why, "kernel WebSocket dropped; reconnecting");
                    match self.reconnect().await {
                        Ok(next) => conn = Some(next),
                        Err(why) => return self.died(why),
                    }
                }
            }
        }
    }

    fn died(&self, why: String) {
        tracing::warn!(kernel = %self.id, gateway = self.gateway.url(), "{}", crate::log_text::escaped(&why));
        self.exit.send_replace(Some(ExitInfo(why)));
    }

    async fn reconnect(&self) -> Result<(Socket, Framing), String> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.gateway.has_kernel(&self.id).await {
                Ok(false) => return Err("the kernel is gone from the server".into()),
                Ok(true) => {
                    if let Ok(conn) = connect(&self.gateway, &self.id, &self.session).await {
                        tracing::info!(kernel = %self.id, "kernel WebSocket reconnected");
                        return Ok(conn);
                    }
                }
                Err(_) => {}
            }
            if started.elapsed() >= RECONNECT_WINDOW {
                return Err(format!(
                    "lost the connection to the kernel gateway for {} s",
                    RECONNECT_WINDOW.as_secs()
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    async fn serve(
        &self,
        socket: Socket,
        framing: Framing,
        outbound: &mut mpsc::UnboundedReceiver<(Channel, JupyterMessage)>,
        unsent: &mut Option<(Channel, JupyterMessage)>,
    ) -> Ended {
        let ack = QuickAck::of(&socket);
        let (mut sink, mut stream) = socket.split();
        if let Some((channel, msg)) = unsent.take()
            && let Err(e) = send(&mut sink, channel, msg, framing, unsent).await
        {
            return Ended::Dropped(e);
        }
        loop {
            tokio::select! {
                frame = stream.next() => {
                    let frame = match frame {
                        Some(Ok(frame)) => {
                            ack.now();
                            frame
                        }
                        Some(Err(e)) => return Ended::Dropped(e.to_string()),
                        None => return Ended::Dropped("closed by the server".into()),
                    };
                    if let Message::Close(_) = frame {
                        return Ended::Dropped("closed by the server".into());
                    }
                    match framing::decode(&frame) {
                        Ok(Some((channel, msg))) => {
                            if let Some(end) = self.deliver(channel, msg) {
                                return end;
                            }
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(kernel = %self.id, error = ?e.to_string(), "dropping an unreadable message"),
                    }
                }
                next = outbound.recv() => {
                    let Some((channel, msg)) = next else { return Ended::Closed };
                    if let Err(e) = send(&mut sink, channel, msg, framing, unsent).await {
                        return Ended::Dropped(e);
                    }
                }
            }
        }
    }

    /// Routes one message; `Some` ends the connection.
    fn deliver(&self, channel: Channel, msg: JupyterMessage) -> Option<Ended> {
        match channel {
            Channel::Shell => {
                return self
                    .inbound
                    .shell
                    .send(msg)
                    .is_err()
                    .then_some(Ended::Closed);
            }
            Channel::IOPub => {
                if let JupyterMessageContent::Status(s) = &msg.content {
                    match &s.execution_state {
                        ExecutionState::Restarting | ExecutionState::AutoRestarting => {
                            return Some(Ended::KernelGone(
                                "the Jupyter server restarted the kernel (its process ended)"
                                    .into(),
                            ));
                        }
                        ExecutionState::Dead => {
                            return Some(Ended::KernelGone(
                                "the Jupyter server reports the kernel dead".into(),
                            ));
                        }
                        _ => {}
                    }
                }
                if self.inbound.iopub.send(msg).is_err() {
                    return Some(Ended::Closed);
                }
            }
            Channel::Stdin => self.answer_input(msg),
            _ => {}
        }
        None
    }

    fn answer_input(&self, request: JupyterMessage) {
        let JupyterMessageContent::InputRequest(input) = &request.content else {
            return;
        };
        let payload = input.prompt.strip_prefix(PROMPT_PREFIX).map(str::to_string);
        let outbound = self.outbound.clone();
        let reply = move |value: String| {
            let reply = JupyterMessage::new(
                InputReply {
                    value,
                    ..Default::default()
                },
                Some(&request),
            );
            let _ = outbound.send((Channel::Stdin, reply));
        };
        match (payload, &self.input) {
            (Some(payload), Some(handler)) => {
                let answer = handler(payload);
                tokio::spawn(async move { reply(answer.await) });
            }
            // Not ipybox's: user code has no stdin; EOF makes input() raise EOFError.
            _ => reply("\u{4}".into()),
        }
    }
}
