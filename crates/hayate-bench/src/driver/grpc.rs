//! gRPC driver (`grpc://HOST:PORT`, default port 0 = a free port): the no-broker reference of
//! `bench rpc`, unary calls through `tonic` 0.14 (HTTP/2 over plain TCP) and `prost`.
//!
//! gRPC has no publish/subscribe, so there is no [`crate::driver::Conn`] for it: `bench thr`
//! and `bench lat` refuse `grpc://` targets. Records say mode "peer-to-peer" (no broker).
//!
//! There is no `.proto` file and no build script, so no `protoc` is needed to build it: the
//! two messages are written with prost's derive, and the server and the client are written by
//! hand the way tonic-build's generated code is (a `tower` service that routes on the method
//! path and serves it through `tonic::server::Grpc::unary`; a client that calls
//! `tonic::client::Grpc::unary`; both with `tonic_prost::ProstCodec`). The proto they
//! implement:
//!
//! ```text
//! syntax = "proto3";
//! package hayate.bench;
//! message CallRequest { bytes payload = 1; }
//! message CallReply { bytes payload = 1; }
//! service Rpc { rpc Call(CallRequest) returns (CallReply); }
//! ```
//!
//! rpc-bench's method, as for every system: the request's payload is the number in decimal,
//! the server answers with the number plus one, the caller checks every reply. Each caller has
//! its own `Channel`, that is its own HTTP/2 connection, with one call in flight; the server is
//! one tonic server on one listener. TCP_NODELAY on both sides, no compression, no TLS.

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "tonic 0.14";

/// The service's name (`package.Service`).
const SERVICE: &str = "hayate.bench.Rpc";
/// The path of the one method, `Call`.
const CALL_PATH: &str = "/hayate.bench.Rpc/Call";

/// `message CallRequest { bytes payload = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CallRequest {
    /// The number, in decimal.
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) payload: Bytes,
}

/// `message CallReply { bytes payload = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CallReply {
    /// The answer (the number plus one), in decimal.
    #[prost(bytes = "bytes", tag = "1")]
    pub(crate) payload: Bytes,
}

/// The server side of `service Rpc`, as tonic-build would generate it for a service whose
/// one method answers with `handler`.
#[derive(Clone)]
struct RpcServer {
    handler: fn(&[u8]) -> Bytes,
}

/// The `Call` method as a unary service.
struct CallSvc(fn(&[u8]) -> Bytes);

impl tonic::server::UnaryService<CallRequest> for CallSvc {
    type Response = CallReply;
    type Future = std::future::Ready<Result<tonic::Response<CallReply>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<CallRequest>) -> Self::Future {
        let payload = (self.0)(&request.get_ref().payload);
        std::future::ready(Ok(tonic::Response::new(CallReply { payload })))
    }
}

impl<B> Service<http::Request<B>> for RpcServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == CALL_PATH {
            let handler = self.handler;
            Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<CallReply, CallRequest>::default();
                let mut grpc = tonic::server::Grpc::new(codec);
                Ok(grpc.unary(CallSvc(handler), req).await)
            })
        } else {
            let path = req.uri().path().to_string();
            Box::pin(async move {
                Ok(tonic::Status::unimplemented(format!("no method {path}")).into_http())
            })
        }
    }
}

impl tonic::server::NamedService for RpcServer {
    const NAME: &'static str = SERVICE;
}

/// The RPC server: a tonic server on a listener bound on the target's HOST:PORT (port 0: a
/// free port) answering `Call` with `handler`. Returns its endpoint (`http://HOST:PORT`) and
/// its task (aborting it stops accepting).
pub(crate) async fn rpc_serve(
    target: &Target,
    handler: fn(&[u8]) -> Bytes,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(target.addr())
        .await
        .with_context(|| format!("grpc: binding {}", target.addr()))?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder()
            .serve_with_incoming(RpcServer { handler }, incoming)
            .await
        {
            tracing::warn!("grpc server on {addr}: {e}");
        }
    });
    Ok((format!("http://{addr}"), task))
}

/// An RPC caller: one `Channel` (one HTTP/2 connection) to the server.
pub(crate) struct RpcCaller(tonic::client::Grpc<Channel>);

impl RpcCaller {
    pub(crate) async fn connect(endpoint: &str) -> anyhow::Result<RpcCaller> {
        let channel = Endpoint::from_shared(endpoint.to_string())
            .with_context(|| format!("grpc: bad endpoint {endpoint:?}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .with_context(|| format!("grpc: connecting to {endpoint}"))?;
        Ok(RpcCaller(tonic::client::Grpc::new(channel)))
    }

    /// One unary `Call`; returns the reply's payload.
    pub(crate) async fn call(&mut self, payload: Bytes) -> anyhow::Result<Bytes> {
        self.0
            .ready()
            .await
            .context("grpc: the channel is not ready")?;
        let codec = tonic_prost::ProstCodec::<CallRequest, CallReply>::default();
        let path = http::uri::PathAndQuery::from_static(CALL_PATH);
        let reply = self
            .0
            .unary(tonic::Request::new(CallRequest { payload }), path, codec)
            .await
            .context("grpc: Call")?;
        Ok(reply.into_inner().payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_protobuf() {
        use prost::Message;
        let m = CallRequest {
            payload: Bytes::from_static(b"41"),
        };
        // field 1, wire type 2 (length-delimited), length 2, "41"
        assert_eq!(m.encode_to_vec(), b"\x0a\x0241");
        let r = CallReply::decode(&b"\x0a\x0242"[..]).unwrap();
        assert_eq!(&r.payload[..], b"42");
    }

    #[test]
    fn unary_calls_over_http2() {
        crate::with_runtime(|rt| {
            rt.block_on(async {
                let t = Target::parse("grpc://127.0.0.1:0")?;
                let (ep, task) = rpc_serve(&t, crate::rpc::add_one).await?;
                assert!(ep.starts_with("http://127.0.0.1:"), "{ep}");
                let mut c = RpcCaller::connect(&ep).await?;
                for i in 0..10u64 {
                    let r = c.call(Bytes::from(i.to_string())).await?;
                    crate::rpc::check_reply(i, &r)?;
                }
                // An unknown method is answered with UNIMPLEMENTED.
                let codec = tonic_prost::ProstCodec::<CallRequest, CallReply>::default();
                c.0.ready().await?;
                let err =
                    c.0.unary(
                        tonic::Request::new(CallRequest::default()),
                        http::uri::PathAndQuery::from_static("/hayate.bench.Rpc/Nope"),
                        codec,
                    )
                    .await
                    .unwrap_err();
                assert_eq!(err.code(), tonic::Code::Unimplemented);
                task.abort();
                Ok(())
            })
        })
        .unwrap();
    }
}
