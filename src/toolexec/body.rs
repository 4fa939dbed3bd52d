//! Response bodies: a whole one, or a stream fed by the request driver that
//! reports every byte hyper takes, so the core can hand out read credit.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub struct ChanBody(Kind);

enum Kind {
    Full(Option<Bytes>),
    Chan { rx: mpsc::UnboundedReceiver<Frame<Bytes>>, took: mpsc::UnboundedSender<u64> },
}

/// The driver's end of a streaming body.
pub struct Frames {
    tx: mpsc::UnboundedSender<Frame<Bytes>>,
    took: mpsc::UnboundedReceiver<u64>,
}

impl ChanBody {
    pub fn full(bytes: Bytes) -> Self {
        ChanBody(Kind::Full(if bytes.is_empty() { None } else { Some(bytes) }))
    }

    /// A streaming body and its feeding end. The channel is unbounded
    /// because the core bounds it: no read credit while a window's worth
    /// of bytes has not been taken.
    pub fn channel() -> (Self, Frames) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (took_tx, took_rx) = mpsc::unbounded_channel();
        (ChanBody(Kind::Chan { rx, took: took_tx }), Frames { tx, took: took_rx })
    }
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.0 {
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Chan { rx, took } => match rx.poll_recv(cx) {
                Poll::Ready(Some(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let _ = took.send(data.len() as u64);
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.0, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Chan { .. } => SizeHint::default(),
        }
    }
}

impl Frames {
    pub fn data(&self, bytes: Bytes) {
        let _ = self.tx.send(Frame::data(bytes));
    }

    /// The last chunk, with the exit code as trailer.
    pub fn finish(self, exit_code: i32) {
        let mut trailers = hyper::HeaderMap::new();
        if let Ok(v) = hyper::header::HeaderValue::from_str(&exit_code.to_string()) {
            trailers.insert("x-exit-code", v);
        }
        let _ = self.tx.send(Frame::trailers(trailers));
    }

    /// Bytes hyper took since the last call; `None` once hyper dropped the
    /// body (the connection is gone).
    pub async fn took(&mut self) -> Option<u64> {
        let mut n = self.took.recv().await?;
        while let Ok(more) = self.took.try_recv() {
            n = n.saturating_add(more);
        }
        Some(n)
    }
}
