//! A connection's TLS handshake, in a task of its own beside the accept
//! loop (see the parent module).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::Conn;
use crate::peer::Peer;

/// The TLS handshake of one connection, then the connection handed to the
/// server; abandoned at `timeout` or when the server stops.
pub(super) async fn handshake(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    timeout: Duration,
    mut peer: Peer,
    place: OwnedSemaphorePermit,
    stop: CancellationToken,
    handed: mpsc::Sender<Conn>,
) {
    let remote = peer.remote_addr;
    let done = tokio::select! {
        done = tokio::time::timeout(timeout, acceptor.accept(stream)) => done,
        () = stop.cancelled() => return,
    };
    let tls = match done {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(?remote, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(?remote, ?timeout, "TLS handshake timed out");
            return;
        }
    };
    // Verified by the handshake when client certificates are required.
    peer.client_certificate = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(<[_]>::first)
        .map(|leaf| Arc::new(leaf.clone().into_owned()));
    let conn = Conn::new(Either::Right(Box::new(tls)), peer, place, &stop);
    let _ = handed.send(conn).await;
}
