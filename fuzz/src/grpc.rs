//! The orchestrator's gRPC services (device plugins' `ReportPlugin`, node agents'
//! `ReportRuns` stream and `Heartbeat`), through tonic's server exactly as a connection reaches
//! it: HTTP/2 request in, gRPC frames decoded, messages validated and ingested into a fresh
//! index and store.
//!
//! Input: the first byte picks the method (low bits) and the framing (high bit). Framed, the
//! rest is a list of messages, each `u16` big-endian length then bytes, and each becomes one
//! well-formed gRPC frame, so the fuzzer works on message contents; raw, the rest is the
//! request body as is, so it works on the framing too. The caller is authenticated as node
//! `gpu-a` (token `t-gpu-a`).
//!
//! Checked besides "no panic": every call is answered with HTTP 200 and a `grpc-status`, a
//! report stream acknowledges at most one report per message sent, and every accepted run is
//! learned without a panic in the model (the learner catches one and leaves the run out, so
//! the target waits for the learner and checks that it left nothing out).

use http_body_util::BodyExt;
use kudos_orchestrator::auth::StaticAuthenticator;
use kudos_orchestrator::grpc::{Ingest, Services, registry_server, telemetry_server};
use kudos_orchestrator::learn::{Learner, RunWriter};
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::store::{FileStore, Store};
use kudos_proto::kudos::v1 as pb;
use prost::Message;
use std::sync::Arc;
use tower::ServiceExt;

/// The authenticated caller.
pub const NODE: &str = "gpu-a";
const TOKEN: &str = "t-gpu-a";
const METHODS: [&str; 3] = [
    "/kudos.v1.RegistryService/ReportPlugin",
    "/kudos.v1.TelemetryService/ReportRuns",
    "/kudos.v1.TelemetryService/Heartbeat",
];
/// Messages per framed input at most.
pub const MAX_MESSAGES: usize = 64;

/// Wraps each message in a gRPC frame (uncompressed flag, big-endian length).
pub fn frames<M: AsRef<[u8]>>(messages: &[M]) -> Vec<u8> {
    let mut body = Vec::new();
    for m in messages {
        let m = m.as_ref();
        body.push(0);
        body.extend_from_slice(&(m.len() as u32).to_be_bytes());
        body.extend_from_slice(m);
    }
    body
}

/// Splits a framed input's rest into messages (`u16` BE length, bytes), at most [`MAX_MESSAGES`].
fn messages(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < MAX_MESSAGES && rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let end = (2 + len).min(rest.len());
        out.push(&rest[2..end]);
        rest = &rest[end..];
    }
    out
}

/// An input for the framed form: method index (0 plugin, 1 runs, 2 heartbeat) and messages.
pub fn encode_input<M: Message>(method: u8, msgs: &[M]) -> Vec<u8> {
    let mut out = vec![method];
    for m in msgs {
        let b = m.encode_to_vec();
        out.extend_from_slice(&(b.len() as u16).to_be_bytes());
        out.extend_from_slice(&b);
    }
    out
}

/// One input; see the module docs.
pub fn run(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(first & 0x7f) % METHODS.len()];
    let (body, sent) = if first & 0x80 != 0 {
        (rest.to_vec(), None)
    } else {
        let m = messages(rest);
        (frames(&m), Some(m.len()))
    };
    let dir = crate::scratch();
    let rt = crate::runtime();
    rt.block_on(async move {
        let store: Arc<dyn Store> = match FileStore::open(&dir.path().join("s.redb")) {
            Ok(s) => Arc::new(s),
            Err(e) => panic!("cannot open a new store: {e}"),
        };
        let index = crate::extender::index();
        let metrics = Arc::new(Metrics::new());
        let learned = metrics.clone();
        let (_drain, draining) = tokio::sync::watch::channel(false);
        let ingest = Arc::new(Ingest {
            runs: RunWriter::spawn(
                store.clone(),
                Learner::spawn(index.clone(), metrics.clone(), None),
            ),
            index,
            store,
            auth: Arc::new(StaticAuthenticator::new(
                [(TOKEN.to_owned(), NODE.to_owned())].into(),
            )),
            metrics,
            unified: "kudos.dev/gpu".into(),
            heartbeat_max_age: 120.0,
            lock: tokio::sync::Mutex::new(()),
            draining,
            plugin_updates: tokio::sync::watch::Sender::new(Default::default()),
        });
        let req = http::Request::post(method)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header(http::header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(axum::body::Body::from(body));
        let req = match req {
            Ok(r) => r,
            Err(e) => panic!("cannot build the request: {e}"),
        };
        let services = Services(ingest);
        let resp = if method.starts_with("/kudos.v1.Registry") {
            registry_server(services).oneshot(req).await
        } else {
            telemetry_server(services).oneshot(req).await
        };
        let resp = match resp {
            Ok(r) => r,
            Err(never) => match never {},
        };
        assert_eq!(
            resp.status(),
            http::StatusCode::OK,
            "{method}: not a gRPC answer"
        );
        let header_status = resp.headers().contains_key("grpc-status");
        let answer = match resp.into_body().collect().await {
            Ok(a) => a,
            Err(e) => panic!("{method}: the answer's body failed: {e}"),
        };
        let trailer_status = answer
            .trailers()
            .is_some_and(|t| t.contains_key("grpc-status"));
        assert!(
            header_status || trailer_status,
            "{method}: the answer carries no grpc-status"
        );
        let (acks, accepted) = count_acks(&answer.to_bytes());
        if let (Some(sent), "/kudos.v1.TelemetryService/ReportRuns") = (sent, method) {
            assert!(
                acks <= sent,
                "{method}: {acks} acknowledgements for {sent} reports"
            );
        }
        // The learner learns accepted runs after their ack: wait for it (bounded).
        let done = || learned.learned_runs.get() + learned.runs_left_out.get() >= accepted;
        for _ in 0..5_000 {
            if done() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(
            learned.runs_left_out.get(),
            0,
            "{method}: learning an accepted run panicked in the model (see the panic above)"
        );
    });
}

/// The acknowledgements in an answer's frames, and how many of them accept a run.
fn count_acks(mut rest: &[u8]) -> (usize, u64) {
    let (mut acks, mut accepted) = (0, 0);
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let end = (5 + len).min(rest.len());
        if let Ok(ack) = pb::RunAck::decode(&rest[5..end]) {
            acks += 1;
            if ack.status == pb::AckStatus::Accepted as i32 {
                accepted += 1;
            }
        }
        rest = &rest[end..];
    }
    (acks, accepted)
}
