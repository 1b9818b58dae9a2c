//! A replica's requests to its peer replicas (an invocation forwarded
//! because no hosting agent is linked here, `crate::dashboard`'s activity
//! parts), over the one pooled client
//! ([`gshare_core::net::http_client`]): one pool per peer, kept for the
//! process, over TLS when the replica's API speaks it (`[http_tls]`: the
//! replicas of a region serve alike; a peer's certificate must chain to
//! the CA and name its IP address).
//!
//! ```text
//!   open(peer, tls, method, path, headers, body)
//!     │ PeerClients::client(peer, tls): the peer's pooled HttpClient
//!     ▼
//!   Ok((ReplyHead, Incoming)) ─▶ read_reply(body, max): whole, at most max bytes
//!   Err(ForwardError::NotSent) : nothing left this replica (connect or TLS failed)
//!   Err(ForwardError::Lost)    : sent; the peer may have run it
//! ```

use gshare_core::net::http_client::{read_body, HttpClient, HttpError, Incoming, RequestBody};
use gshare_core::protocol::ReplyHead;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

/// Why a forward got no usable answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// Nothing was sent: the peer's address is unusable, or the
    /// connection or its TLS handshake failed. Another peer may be asked.
    #[error("replica {peer}: cannot connect: {detail}")]
    NotSent {
        /// The peer's HTTP address, as the membership has it.
        peer: String,
        /// Why.
        detail: String,
    },
    /// The request may have reached the peer, but no usable answer came
    /// back (it may have run): asking another peer could run it twice.
    #[error("replica {peer}: {source}")]
    Lost {
        /// The peer's HTTP address.
        peer: String,
        /// What went wrong after the request left.
        source: HttpError,
    },
}

/// The pooled clients of the peer replicas, one per peer address and TLS
/// config (a config is told apart by its `Arc`, which the client keeps,
/// so its address is never reused while listed). Entries are never
/// removed: a region has a handful of replicas.
#[derive(Debug, Default)]
pub(crate) struct PeerClients {
    clients: Mutex<HashMap<(SocketAddr, Option<usize>), HttpClient>>,
}

impl PeerClients {
    /// The process's pool (what every forward uses).
    pub(crate) fn shared() -> &'static PeerClients {
        static SHARED: OnceLock<PeerClients> = OnceLock::new();
        SHARED.get_or_init(PeerClients::default)
    }

    /// The pooled client of `peer` (over TLS with `tls`, else plain).
    pub(crate) fn client(
        &self,
        peer: SocketAddr,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> HttpClient {
        let key = (peer, tls.as_ref().map(|c| Arc::as_ptr(c) as usize));
        // A poisoned lock only means another forward panicked mid-insert:
        // the map is still a valid map.
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(key)
            .or_insert_with(|| HttpClient::for_addr(peer, tls))
            .clone()
    }
}

/// Sends `method path` with `headers` and `body` to the peer replica whose
/// HTTP address is `peer` (an IP address and port), over TLS when `tls` is
/// set, on the process's pooled connections; returns the answer's head
/// and its body unread (read it with [`read_reply`], or stream it with a
/// limit of the caller's). A streamed `body` goes out as it comes (the
/// answer may start before it all left). No time limit: the caller's.
pub(crate) async fn open(
    peer: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: impl Into<RequestBody>,
) -> Result<(ReplyHead, Incoming), ForwardError> {
    let addr = peer
        .parse::<SocketAddr>()
        .map_err(|e| ForwardError::NotSent {
            peer: peer.to_string(),
            detail: format!("not an IP address and port: {e}"),
        })?;
    let client = PeerClients::shared().client(addr, tls);
    client
        .open_body(method, path, headers, body.into())
        .await
        .map_err(|e| match e {
            HttpError::Connect(detail) => ForwardError::NotSent {
                peer: peer.to_string(),
                detail,
            },
            // Refused before anything was written: nothing sent either.
            HttpError::Request(detail) => ForwardError::NotSent {
                peer: peer.to_string(),
                detail,
            },
            source => ForwardError::Lost {
                peer: peer.to_string(),
                source,
            },
        })
}

/// Reads a peer's answer body whole, at most `max_bytes` (a longer one is
/// [`ForwardError::Lost`] with [`HttpError::TooLarge`]).
pub(crate) async fn read_reply(
    peer: &str,
    body: Incoming,
    max_bytes: usize,
) -> Result<Vec<u8>, ForwardError> {
    read_body(body, max_bytes)
        .await
        .map_err(|source| ForwardError::Lost {
            peer: peer.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A hang guard, not a timing assert.
    const GUARD: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn an_unreachable_or_unusable_peer_is_not_sent_to() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        for peer in [addr.as_str(), "replica-2:8080"] {
            let got = tokio::time::timeout(GUARD, open(peer, None, "POST", "/", &[], Vec::new()))
                .await
                .unwrap();
            assert!(
                matches!(got, Err(ForwardError::NotSent { .. })),
                "{peer}: {got:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_peer_answer_is_streamed_and_read_within_the_limit() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // One answer per connection, then the server closes it (so each
        // request below is answered whichever connection it goes on).
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = s.read(&mut head).await;
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 5\r\n\
                              Connection: close\r\nX-Gshare-Error: rate_limited\r\n\r\nslow!",
                        )
                        .await;
                    let _ = s.shutdown().await;
                    let mut sink = [0u8; 1024];
                    while s.read(&mut sink).await.unwrap_or(0) > 0 {}
                });
            }
        });
        let ask = || {
            tokio::time::timeout(
                GUARD,
                open(&addr, None, "POST", "/v1/invoke/t/f", &[], b"{}".to_vec()),
            )
        };
        let (head, body) = ask().await.unwrap().unwrap();
        assert_eq!(head.status, 429);
        assert!(head
            .headers
            .iter()
            .any(|(k, v)| k == "x-gshare-error" && v == b"rate_limited"));
        assert_eq!(read_reply(&addr, body, 5).await.unwrap(), b"slow!");
        // Over the limit: refused by its Content-Length, before the body.
        let (_, body) = ask().await.unwrap().unwrap();
        let got = read_reply(&addr, body, 4).await;
        assert!(
            matches!(
                got,
                Err(ForwardError::Lost {
                    source: HttpError::TooLarge(4),
                    ..
                })
            ),
            "{got:?}"
        );
    }
}
