//! Raw frames (the `conformance` feature): a connection that has left the
//! protocol's state machine. [`super::Connection::raw`] asks the driver to
//! stop feeding the machine; the driver then runs [`pump`] on the same
//! socket, moving bytes both ways, and the caller's [`RawConnection`]
//! sends any frame or bytes and reads the peer's frames as they come.
//!
//! The pump only moves bytes (and shows them to the transcript recorder);
//! the frames are decoded on the caller's side, one at a time, so that what
//! does not decode comes back as a [`RawError`] with its bytes. Every wait
//! is bounded: input the caller has not taken pauses reading at
//! [`READ_AHEAD`] bytes, output waits in a bounded queue, and every call of
//! a [`RawConnection`] has a deadline ([`RawConnection::set_timeout`]).
//!
//! It must never import the driver, a handle's module or `state` (whose
//! command carries this module's parts).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use acemq_codec::{Frame, FrameDecoder, FRAME_END, FRAME_METHOD, FRAME_OVERHEAD};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use super::transcript::{Recorder, Transcript, TranscriptLog};
use crate::proto::CloseReason;

/// How many bytes read from the socket may wait for the caller to take
/// them before the pump stops reading.
pub const READ_AHEAD: usize = 4 << 20;

/// How many bytes the pump takes from the caller's sends before the socket
/// has taken those already there.
const WRITE_AHEAD: usize = 1 << 20;

/// How many sends may wait for the pump.
const SEND_QUEUE: usize = 64;

/// How long a [`RawConnection`]'s calls wait by default.
pub const DEFAULT_RAW_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a [`RawConnection`] call gave no frame.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RawError {
    /// A whole frame (its size known from its frame header) that does not
    /// decode: an unknown method, a payload too short or too long, a bad
    /// end byte. Reading goes on with the next frame.
    #[error("undecodable frame ({} bytes): {error}", .bytes.len())]
    Undecodable {
        /// What the codec found wrong.
        error: acemq_codec::Error,
        /// The whole frame, frame header and end byte included.
        bytes: Bytes,
    },
    /// Bytes that are no frame: an unknown frame type, a size over
    /// [`RawConnection::frame_max`], or a partial frame at the end of the
    /// input. The framing is lost: every later read gives what came as
    /// `Unframed` too (with `error: None`).
    #[error("input that is no frame ({} bytes){}", .bytes.len(), .error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Unframed {
        /// Why the framing was lost (on the first such error).
        error: Option<acemq_codec::Error>,
        /// The bytes, as they came.
        bytes: Bytes,
    },
    /// The socket ended: the peer closed it (`error: None`), it failed, or
    /// this side hung up. Everything read before was handed out first.
    #[error("the connection ended{}", .error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Ended {
        /// The socket's error, if it failed.
        error: Option<Arc<std::io::Error>>,
    },
    /// Nothing came (or the send could not be queued) within the deadline.
    #[error("nothing within {0:?}")]
    TimedOut(Duration),
    /// The frame cannot be encoded at all (a string over 255 bytes, a
    /// payload over 4 GiB); send the bytes you mean with
    /// [`RawConnection::send_bytes`].
    #[error(transparent)]
    Encode(#[from] acemq_codec::EncodeError),
}

/// What the pump hands over, besides the caller's bytes.
#[derive(Debug)]
enum Input {
    Bytes(Bytes),
    End(Option<Arc<std::io::Error>>),
}

/// Bytes handed to the caller and not yet taken, and the wake-up of a
/// pump that waits for the caller to take some.
#[derive(Debug, Default)]
struct Flow {
    queued: AtomicUsize,
    took: Notify,
}

/// What the driver hands [`super::Connection::raw`]'s caller.
#[derive(Debug)]
pub(crate) struct RawParts {
    out: mpsc::Sender<Bytes>,
    input: mpsc::UnboundedReceiver<Input>,
    flow: Arc<Flow>,
    frame_max: u32,
}

/// The pump's ends of what [`RawParts`] holds.
#[derive(Debug)]
pub(crate) struct PumpEnds {
    out: mpsc::Receiver<Bytes>,
    input: mpsc::UnboundedSender<Input>,
    flow: Arc<Flow>,
}

/// The two ends of a raw connection's queues; `frame_max` bounds the
/// frames the caller's side decodes.
pub(crate) fn pair(frame_max: u32) -> (RawParts, PumpEnds) {
    let (out_tx, out_rx) = mpsc::channel(SEND_QUEUE);
    let (in_tx, in_rx) = mpsc::unbounded_channel();
    let flow = Arc::new(Flow::default());
    (
        RawParts {
            out: out_tx,
            input: in_rx,
            flow: flow.clone(),
            frame_max,
        },
        PumpEnds {
            out: out_rx,
            input: in_tx,
            flow,
        },
    )
}

impl PumpEnds {
    fn hand_over(&self, bytes: Bytes) {
        self.flow.queued.fetch_add(bytes.len(), Ordering::SeqCst);
        let _ = self.input.send(Input::Bytes(bytes));
    }

    fn end(&self, error: Option<std::io::Error>) {
        let _ = self.input.send(Input::End(error.map(Arc::new)));
    }
}

/// What woke one turn of the pump.
enum Step {
    Read(usize),
    /// The socket's input ended (EOF, or the error).
    Eof(Option<std::io::Error>),
    /// A write found the socket closed or failed.
    WriteFailed(Option<std::io::Error>),
    /// The caller hung up (what it sent is written on the way out).
    Close,
    /// The caller took input: reading may go on.
    Took,
}

/// Runs a raw connection on `stream` until the caller hangs up or the
/// socket ends. `read_buf` holds what was read and not yet parsed (handed
/// to the caller first); `write_buf` what waits to be written (written
/// first). Says how the connection ended.
pub(crate) async fn pump<S>(
    mut stream: Pin<&mut S>,
    read_buf: &mut BytesMut,
    write_buf: &mut BytesMut,
    mut recorder: Option<&mut Recorder>,
    mut ends: PumpEnds,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite,
{
    if !read_buf.is_empty() {
        ends.hand_over(read_buf.split().freeze());
    }
    let mut closing = false;
    loop {
        if read_buf.capacity() - read_buf.len() < 16 * 1024 {
            read_buf.reserve(64 * 1024);
        }
        let reading = ends.flow.queued.load(Ordering::SeqCst) < READ_AHEAD;
        let flow = ends.flow.clone();
        let mut took = std::pin::pin!(flow.took.notified());
        let step = std::future::poll_fn(|cx| loop {
            while !write_buf.is_empty() {
                match stream.as_mut().poll_write(cx, &write_buf[..]) {
                    Poll::Ready(Ok(n)) if n > 0 => write_buf.advance(n),
                    Poll::Ready(ended) => return Poll::Ready(Step::WriteFailed(ended.err())),
                    Poll::Pending => break,
                }
            }
            let mut sent = false;
            while !closing && write_buf.len() < WRITE_AHEAD {
                match ends.out.poll_recv(cx) {
                    Poll::Ready(Some(bytes)) => {
                        if let Some(recorder) = recorder.as_deref_mut() {
                            recorder.sent(&bytes);
                        }
                        write_buf.extend_from_slice(&bytes);
                        sent = true;
                    }
                    Poll::Ready(None) => closing = true,
                    Poll::Pending => break,
                }
            }
            if sent {
                // Written at the top, in this same poll.
                continue;
            }
            if closing {
                // What is left is written by `hang_up`, within its bound.
                return Poll::Ready(Step::Close);
            }
            if reading {
                let mut reader = stream.as_mut();
                let read = std::pin::pin!(reader.read_buf(read_buf)).poll(cx);
                match read {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Step::Eof(None)),
                    Poll::Ready(Ok(n)) => return Poll::Ready(Step::Read(n)),
                    Poll::Ready(Err(err)) => return Poll::Ready(Step::Eof(Some(err))),
                    Poll::Pending => {}
                }
            } else if took.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Step::Took);
            }
            return Poll::Pending;
        })
        .await;
        match step {
            Step::Read(n) => {
                if let Some(recorder) = recorder.as_deref_mut() {
                    recorder.received(&read_buf[read_buf.len() - n..]);
                }
                ends.hand_over(read_buf.split().freeze());
            }
            Step::Took => {}
            Step::Eof(err) => {
                ends.end(err);
                hang_up(stream, write_buf).await;
                return CloseReason::ConnectionLost;
            }
            Step::WriteFailed(err) => {
                ends.end(err);
                return CloseReason::ConnectionLost;
            }
            Step::Close => {
                // Hung up by the caller; what the peer still sends is not read.
                ends.end(None);
                hang_up(stream, write_buf).await;
                return CloseReason::ByClient;
            }
        }
    }
}

/// Writes what is left and shuts the socket, a second at most each.
async fn hang_up<S: AsyncWrite>(mut stream: Pin<&mut S>, write_buf: &BytesMut) {
    if !write_buf.is_empty() {
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(write_buf)).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}

/// A connection that has left the protocol's state machine (from
/// [`super::Connection::raw`], feature `conformance`): send any frame or
/// any bytes, read the peer's frames as they come. Nothing answers for you
/// any more: not heartbeats (send [`Frame::Heartbeat`] yourself within the
/// negotiated interval), not `close-ok`.
///
/// Every call waits at most [`RawConnection::timeout`] (30 s unless set),
/// and every wait is cancel-safe: a `recv` dropped before it returns loses
/// nothing. Dropping it hangs up (after writing what was sent).
///
/// ```no_run
/// # async fn demo(conn: acemq_core::amqp::Connection) -> Result<(), Box<dyn std::error::Error>> {
/// use acemq_codec::{Frame, Method};
/// use acemq_core::amqp::{RawConnection, RawError};
///
/// let mut raw = conn.raw().await?;
/// // class 999 names no method
/// raw.send_bytes(RawConnection::method_bytes(1, 999, 10, &[])).await?;
/// loop {
///     match raw.recv().await {
///         Ok(Frame::Method(0, Method::ConnectionClose(close))) => {
///             println!("closed with {} {}", close.reply_code, close.reply_text);
///             break;
///         }
///         Ok(_) => continue,
///         // RabbitMQ hangs up without a word.
///         Err(RawError::Ended { .. }) => break,
///         Err(other) => return Err(other.into()),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RawConnection {
    out: mpsc::Sender<Bytes>,
    input: mpsc::UnboundedReceiver<Input>,
    flow: Arc<Flow>,
    /// What came and is not yet a frame handed out.
    buf: BytesMut,
    decoder: FrameDecoder,
    /// The framing of the input is lost.
    unframed: bool,
    /// The socket ended (with its error, if any).
    ended: Option<Option<Arc<std::io::Error>>>,
    timeout: Duration,
    /// The connection's transcript, when it records one.
    transcript: Option<Arc<TranscriptLog>>,
}

impl RawConnection {
    pub(crate) fn new(parts: RawParts, transcript: Option<Arc<TranscriptLog>>) -> Self {
        RawConnection {
            out: parts.out,
            input: parts.input,
            flow: parts.flow,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(parts.frame_max),
            unframed: false,
            ended: None,
            timeout: DEFAULT_RAW_TIMEOUT,
            transcript,
        }
    }

    /// Sends one frame as it is: whatever its channel, its method, and
    /// whatever its size (a body frame over `frame_max` is sent as one
    /// frame). Waits at most [`RawConnection::timeout`] for room in the
    /// send queue, not for the socket to take it.
    pub async fn send(&self, frame: &Frame) -> Result<(), RawError> {
        let mut bytes = BytesMut::new();
        frame.encode(&mut bytes)?;
        self.send_bytes(bytes).await
    }

    /// Sends several frames, in order, as one write.
    pub async fn send_all(&self, frames: &[Frame]) -> Result<(), RawError> {
        let mut bytes = BytesMut::new();
        for frame in frames {
            frame.encode(&mut bytes)?;
        }
        self.send_bytes(bytes).await
    }

    /// Sends bytes as they are: a frame laid out by hand, half a frame,
    /// anything. Waits at most [`RawConnection::timeout`] for room in the
    /// send queue; [`RawError::Ended`] once the socket has ended.
    pub async fn send_bytes(&self, bytes: impl Into<Bytes>) -> Result<(), RawError> {
        let bytes = bytes.into();
        match self.out.send_timeout(bytes, self.timeout).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => Err(RawError::TimedOut(self.timeout)),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(self.ended_error()),
        }
    }

    /// The next frame the peer sent, waiting at most
    /// [`RawConnection::timeout`]. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Frame, RawError> {
        let timeout = self.timeout;
        self.recv_timeout(timeout).await
    }

    /// The next frame the peer sent, waiting at most `timeout`
    /// ([`RawError::TimedOut`] after). Cancel-safe.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Result<Frame, RawError> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(result) => result,
            Err(_) => Err(RawError::TimedOut(timeout)),
        }
    }

    /// A frame already read, without waiting: `None` if none is whole yet.
    pub fn try_recv(&mut self) -> Option<Result<Frame, RawError>> {
        loop {
            if let Some(item) = self.decode_next() {
                return Some(item);
            }
            if self.ended.is_some() {
                return Some(self.ended_item());
            }
            match self.input.try_recv() {
                Ok(input) => self.take(Some(input)),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => self.take(None),
            }
        }
    }

    async fn next(&mut self) -> Result<Frame, RawError> {
        loop {
            if let Some(item) = self.decode_next() {
                return item;
            }
            if self.ended.is_some() {
                return self.ended_item();
            }
            // Cancel-safe: nothing changes until a value is received.
            let input = self.input.recv().await;
            self.take(input);
        }
    }

    fn take(&mut self, input: Option<Input>) {
        match input {
            Some(Input::Bytes(bytes)) => {
                self.flow.queued.fetch_sub(bytes.len(), Ordering::SeqCst);
                self.flow.took.notify_one();
                self.buf.extend_from_slice(&bytes);
            }
            Some(Input::End(error)) => self.ended = Some(error),
            None => self.ended = Some(None),
        }
    }

    /// After the end: a partial frame left is given as `Unframed`, then
    /// `Ended` for ever.
    fn ended_item(&mut self) -> Result<Frame, RawError> {
        if !self.buf.is_empty() {
            let needed = match self.frame_len() {
                Some(total) => total.saturating_sub(self.buf.len()),
                None => 7 - self.buf.len(),
            };
            let error = (!self.unframed).then_some(acemq_codec::Error::Incomplete { needed });
            self.unframed = true;
            return Err(RawError::Unframed {
                error,
                bytes: self.buf.split().freeze(),
            });
        }
        Err(self.ended_error())
    }

    fn ended_error(&self) -> RawError {
        RawError::Ended {
            error: self.ended.clone().flatten(),
        }
    }

    /// The size of the frame whose header starts the buffer.
    fn frame_len(&self) -> Option<usize> {
        let size = self.buf.get(3..7)?;
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
        Some(size as usize + FRAME_OVERHEAD)
    }

    /// The next frame in the buffer, or the error for what is there instead.
    fn decode_next(&mut self) -> Option<Result<Frame, RawError>> {
        if self.buf.is_empty() {
            return None;
        }
        if self.unframed {
            return Some(Err(RawError::Unframed {
                error: None,
                bytes: self.buf.split().freeze(),
            }));
        }
        let total = self.frame_len()?;
        // The frame header alone: a known type, and a size within frame_max.
        let head = Bytes::copy_from_slice(&self.buf[..7]);
        match self.decoder.decode_slice(&head) {
            Err(acemq_codec::Error::Incomplete { .. }) => {}
            Ok(_) => {}
            Err(error) => {
                self.unframed = true;
                return Some(Err(RawError::Unframed {
                    error: Some(error),
                    bytes: self.buf.split().freeze(),
                }));
            }
        }
        if self.buf.len() < total {
            return None;
        }
        let bytes = self.buf.split_to(total).freeze();
        Some(match self.decoder.decode_slice(&bytes) {
            Ok((frame, _)) => Ok(frame),
            Err(error) => Err(RawError::Undecodable { error, bytes }),
        })
    }

    /// How long each call waits at most.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets how long each call waits at most.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The largest frame read as a frame (the whole frame, in bytes): the
    /// negotiated `frame_max` unless set. A larger one is
    /// [`RawError::Unframed`] with `FrameTooLarge`.
    pub fn frame_max(&self) -> u32 {
        self.decoder.frame_max()
    }

    /// Sets [`RawConnection::frame_max`] (0: no limit, and no bound on
    /// what one frame may make this side buffer).
    pub fn set_frame_max(&mut self, frame_max: u32) {
        self.decoder.set_frame_max(frame_max);
    }

    /// The connection's transcript so far, when it records one
    /// ([`super::Config::transcript`]): raw frames both ways are in it too.
    pub fn transcript(&self) -> Option<Transcript> {
        self.transcript.as_ref().map(|log| log.snapshot())
    }

    /// A frame laid out by hand: the frame header (`frame_type`, `channel`,
    /// the payload's size), `payload` as it is, and the end byte.
    pub fn frame_bytes(frame_type: u8, channel: u16, payload: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(payload.len() + FRAME_OVERHEAD);
        out.put_u8(frame_type);
        out.put_u16(channel);
        out.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
        out.put_slice(payload);
        out.put_u8(FRAME_END);
        out.freeze()
    }

    /// A method frame with any class and method ids (known or not) and
    /// `arguments` as they are.
    pub fn method_bytes(channel: u16, class_id: u16, method_id: u16, arguments: &[u8]) -> Bytes {
        let mut payload = Vec::with_capacity(4 + arguments.len());
        payload.extend_from_slice(&class_id.to_be_bytes());
        payload.extend_from_slice(&method_id.to_be_bytes());
        payload.extend_from_slice(arguments);
        RawConnection::frame_bytes(FRAME_METHOD, channel, &payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_codec::{encode_method, ConnectionClose, Method};
    use tokio::io::AsyncReadExt;

    /// A raw connection pumping over one end of a duplex; the other end is
    /// the peer.
    fn raw_pair(
        frame_max: u32,
    ) -> (
        RawConnection,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<CloseReason>,
    ) {
        let (ours, peer) = tokio::io::duplex(64 * 1024);
        let (parts, ends) = pair(frame_max);
        let raw = RawConnection::new(parts, None);
        let task = tokio::spawn(async move {
            let stream = std::pin::pin!(ours);
            let (mut read_buf, mut write_buf) = (BytesMut::new(), BytesMut::new());
            pump(stream, &mut read_buf, &mut write_buf, None, ends).await
        });
        (raw, peer, task)
    }

    #[tokio::test]
    async fn frames_both_ways_and_an_unknown_method_is_a_typed_error_with_its_bytes() {
        let (mut raw, mut peer, _task) = raw_pair(4096);
        raw.send(&Frame::Heartbeat).await.unwrap();
        let mut got = [0u8; 8];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [8, 0, 0, 0, 0, 0, 0, 0xCE]);

        let unknown = RawConnection::method_bytes(3, 999, 10, &[1, 2]);
        let mut wire = BytesMut::from(&unknown[..]);
        encode_method(0, &Method::ConnectionClose(ConnectionClose::default()), &mut wire).unwrap();
        // Byte by byte: frames are whole whatever the reads.
        for byte in wire.iter() {
            peer.write_all(&[*byte]).await.unwrap();
        }
        match raw.recv_timeout(Duration::from_secs(5)).await {
            Err(RawError::Undecodable { error, bytes }) => {
                assert_eq!(error, acemq_codec::Error::UnknownMethod { class: 999, method: 10 });
                assert_eq!(bytes, unknown);
            }
            other => panic!("{other:?}"),
        }
        let close = raw.recv_timeout(Duration::from_secs(5)).await.unwrap();
        assert!(
            matches!(close, Frame::Method(0, Method::ConnectionClose(_))),
            "{close:?}"
        );
    }

    #[tokio::test]
    async fn bytes_that_are_no_frame_lose_the_framing_then_the_end_is_typed() {
        let (mut raw, mut peer, task) = raw_pair(4096);
        peer.write_all(b"HTTP/1.1 400 Bad Request\r\n").await.unwrap();
        match raw.recv_timeout(Duration::from_secs(5)).await {
            Err(RawError::Unframed {
                error: Some(acemq_codec::Error::UnknownFrameType(b'H')),
                bytes,
            }) => {
                assert!(bytes.starts_with(b"HTTP"));
            }
            other => panic!("{other:?}"),
        }
        peer.write_all(&[1, 0, 0, 0, 0, 0, 4]).await.unwrap();
        let more = raw.recv_timeout(Duration::from_secs(5)).await;
        assert!(matches!(more, Err(RawError::Unframed { error: None, .. })), "{more:?}");
        drop(peer);
        let end = raw.recv_timeout(Duration::from_secs(5)).await;
        assert!(matches!(end, Err(RawError::Ended { error: None })), "{end:?}");
        assert_eq!(task.await.unwrap(), CloseReason::ConnectionLost);
        // Sending after the end fails typed, at once.
        let sent = raw.send(&Frame::Heartbeat).await;
        assert!(matches!(sent, Err(RawError::Ended { .. })), "{sent:?}");
    }

    #[tokio::test]
    async fn a_frame_over_frame_max_is_unframed_without_buffering_its_payload() {
        let (mut raw, mut peer, _task) = raw_pair(4096);
        // A header announcing 4 GiB: refused from its 7 bytes.
        peer.write_all(&[3, 0, 1, 0xFF, 0xFF, 0xFF, 0xF0, 0]).await.unwrap();
        match raw.recv_timeout(Duration::from_secs(5)).await {
            Err(RawError::Unframed {
                error: Some(acemq_codec::Error::FrameTooLarge { frame_max: 4096, .. }),
                bytes,
            }) => assert_eq!(bytes.len(), 8),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_partial_frame_at_the_end_is_unframed_incomplete() {
        let (mut raw, mut peer, _task) = raw_pair(4096);
        peer.write_all(&[1, 0, 1, 0, 0, 0, 20, 0, 10]).await.unwrap();
        drop(peer);
        match raw.recv_timeout(Duration::from_secs(5)).await {
            Err(RawError::Unframed {
                error: Some(acemq_codec::Error::Incomplete { needed: 19 }),
                bytes,
            }) => assert_eq!(bytes.len(), 9),
            other => panic!("{other:?}"),
        }
        assert!(matches!(raw.recv().await, Err(RawError::Ended { .. })));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out_and_a_cancelled_recv_loses_nothing() {
        let (mut raw, mut peer, _task) = raw_pair(4096);
        let waited = raw.recv_timeout(Duration::from_millis(50)).await;
        assert!(matches!(waited, Err(RawError::TimedOut(_))), "{waited:?}");
        peer.write_all(&[8, 0, 0, 0, 0]).await.unwrap();
        // Half a frame came: this wait ends empty-handed, keeping it.
        assert!(raw.recv_timeout(Duration::from_millis(50)).await.is_err());
        peer.write_all(&[0, 0, 0xCE]).await.unwrap();
        let heartbeat = raw.recv_timeout(Duration::from_secs(5)).await.unwrap();
        assert_eq!(heartbeat, Frame::Heartbeat);
    }

    #[tokio::test]
    async fn a_caller_that_does_not_read_pauses_reading_and_the_pump_stays_bounded() {
        let (mut raw, mut peer, _task) = raw_pair(0);
        let chunk = [8u8, 0, 0, 0, 0, 0, 0, 0xCE].repeat(8192);
        // The pump takes READ_AHEAD and then stops: the peer's writes
        // stall rather than grow a buffer.
        let wrote: Result<(), _> = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                peer.write_all(&chunk).await.unwrap();
            }
        })
        .await;
        assert!(wrote.is_err(), "the peer's writes stall");
        assert!(raw.flow.queued.load(Ordering::SeqCst) <= READ_AHEAD + 128 * 1024);
        // Reading resumes once taken.
        for _ in 0..10 {
            assert_eq!(
                raw.recv_timeout(Duration::from_secs(5)).await.unwrap(),
                Frame::Heartbeat
            );
        }
        drop(raw);
    }
}
