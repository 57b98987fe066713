//! `/metrics` over HTTP/1.1 on its own listener, for Prometheus to scrape.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Metrics;

/// The content type of what `prometheus-client` writes: OpenMetrics text
/// (its `info` type and `# EOF` are not in Prometheus' older text format,
/// whose parser would refuse the whole scrape).
const TEXT_FORMAT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `metrics` on `listener` until `stop` is cancelled: `GET /metrics`
/// the text format, anything else 404.
pub async fn serve(listener: TcpListener, metrics: Metrics, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let metrics = metrics.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let response = if request.uri().path() == "/metrics" {
                    http::Response::builder()
                        .header(http::header::CONTENT_TYPE, TEXT_FORMAT)
                        .body(Full::new(Bytes::from(metrics.encode())))
                } else {
                    http::Response::builder()
                        .status(http::StatusCode::NOT_FOUND)
                        .body(Full::new(Bytes::from_static(b"only /metrics is here\n")))
                };
                std::future::ready(Ok::<_, Infallible>(
                    response.unwrap_or_else(|_| http::Response::new(Full::new(Bytes::new()))),
                ))
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stop.cancelled() => {}
            }
        });
    }
}
