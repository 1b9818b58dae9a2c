//! The connector of [`super::HttpClient`]'s pool: hyper-util's
//! `HttpConnector` for TCP (address resolution, connect timeout, no
//! Nagle), then, for a client built with a rustls config, a TLS handshake
//! over that stream naming the peer by its host (an IP address gives an
//! IP-address server name, as the replicas' certificates carry), or by the
//! name the client was built with (a host the caller resolved itself).
//!
//! Written here rather than taken from hyper-rustls: a match over two
//! stream kinds is all it takes with tokio-rustls (already in the build),
//! and hyper-rustls would add its own feature set over rustls (native or
//! webpki roots, aws-lc-rs by default) to keep off.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Why no connection was made (nothing was sent).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The TCP connection could not be opened.
    #[error("tcp: {0}")]
    Tcp(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The host is no name a certificate can be checked against.
    #[error("{host:?} is not a TLS server name")]
    Name {
        /// The URI's host.
        host: String,
    },
    /// The TLS handshake failed (e.g. "invalid peer certificate: UnknownIssuer").
    #[error("tls: {0}")]
    Tls(#[source] std::io::Error),
}

/// Opens plain TCP, or TLS over it when built with a [`TlsConnector`].
#[derive(Clone)]
pub(super) struct Connector {
    tcp: HttpConnector,
    tls: Option<TlsConnector>,
    /// The name the certificate must carry; `None`: the URI's host.
    name: Option<ServerName<'static>>,
}

impl Connector {
    pub(super) fn new(
        tcp: HttpConnector,
        tls: Option<TlsConnector>,
        name: Option<ServerName<'static>>,
    ) -> Self {
        Self { tcp, tls, name }
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<Stream, ConnectError>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = Stream;
    type Error = ConnectError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp
            .poll_ready(cx)
            .map_err(|e| ConnectError::Tcp(e.into()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut tcp = self.tcp.clone();
        let tls = self.tls.clone();
        let fixed_name = self.name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let io = tcp
                .call(uri)
                .await
                .map_err(|e| ConnectError::Tcp(e.into()))?;
            let Some(tls) = tls else {
                return Ok(Stream::Plain(io));
            };
            let name = match fixed_name {
                Some(name) => name,
                None => {
                    ServerName::try_from(host.clone()).map_err(|_| ConnectError::Name { host })?
                }
            };
            let stream = tls
                .connect(name, io.into_inner())
                .await
                .map_err(ConnectError::Tls)?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

/// A connection of the pool.
pub(super) enum Stream {
    /// Plain HTTP.
    Plain(TokioIo<TcpStream>),
    /// HTTP over TLS (boxed: its session state is ~1 KiB).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(s) => s.connected(),
            Stream::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
