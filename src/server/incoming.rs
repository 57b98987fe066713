//! The connections the server accepts: TCP_NODELAY on, and a connection whose
//! client has not sent a byte yet is closed as soon as the server stops.
//!
//! hyper's HTTP/2 server (1.5.1 and later) leaves a connection that is still
//! waiting for the client's preface out of a graceful shutdown
//! (hyperium/hyper#4170, open): a load balancer's TCP check, a port scan or a
//! client stuck before its first write, holding a connection open without a
//! byte, kept the drain waiting for the whole grace period (10 s by default)
//! and ended it with a warning about calls in flight when there were none.
//! Such a connection carries no call, so it loses nothing by being closed:
//! its reads end (end of stream) once the server stops, and hyper lets it go.
//! A connection whose client has spoken is left to hyper's own drain
//! (GOAWAY, then calls in flight finish).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// The connections `listener` accepts; `stop` is cancelled when the server
/// stops accepting.
///
/// TCP_NODELAY is set as tonic's own `serve` sets it (a listener handed in
/// keeps the kernel's default). With Nagle's algorithm on, a small response
/// written while another is still unacknowledged waits for the client's
/// delayed ACK: stalls of about 40 ms, seen as the p99.9 of the durable
/// benchmark (`benches/run.sh`).
pub(super) fn incoming(
    listener: TcpListener,
    stop: CancellationToken,
) -> impl Stream<Item = io::Result<Conn>> {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .map(move |accepted| {
            accepted.map(|stream| Conn {
                stream,
                silent: Some(Box::pin(stop.clone().cancelled_owned())),
            })
        })
}

/// An accepted connection.
pub(super) struct Conn {
    stream: TcpStream,
    /// Until the client's first byte: resolves when the server stops, which
    /// then ends this connection's reads.
    silent: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl Conn {
    #[cfg(test)]
    pub(super) fn stream(&self) -> &TcpStream {
        &self.stream
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(stop) = this.silent.as_mut() else {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        match read {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.silent = None;
                read
            }
            Poll::Pending if stop.as_mut().poll(cx).is_ready() => {
                // The server stops and the client never spoke: end of stream.
                this.silent = None;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn accept_one() -> (Conn, TcpStream, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let accepted = incoming(listener, stop.clone());
        tokio::pin!(accepted);
        let client = TcpStream::connect(addr).await.unwrap();
        let conn = accepted.next().await.unwrap().unwrap();
        (conn, client, stop)
    }

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let (conn, _client, _stop) = accept_one().await;
        assert!(conn.stream().nodelay().unwrap());
    }

    #[tokio::test]
    async fn a_silent_connection_ends_when_the_server_stops() {
        let (mut conn, _client, stop) = accept_one().await;
        let mut buf = [0u8; 16];
        let read = tokio::spawn(async move { conn.read(&mut buf).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read.is_finished(), "no byte, no stop: the read waits");
        stop.cancel();
        let n = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the read ends once the server stops")
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "end of stream");
    }

    #[tokio::test]
    async fn a_connection_that_spoke_is_left_to_hyper() {
        let (mut conn, mut client, stop) = accept_one().await;
        client.write_all(b"PRI").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 3);
        stop.cancel();
        let read = tokio::spawn(async move {
            let n = conn.read(&mut buf).await.unwrap();
            (n, buf)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!read.is_finished(), "stopping does not end its reads");
        client.write_all(b" * HTTP/2.0").await.unwrap();
        let (n, buf) = read.await.unwrap();
        assert_eq!(&buf[..n], b" * HTTP/2.0");
    }
}
