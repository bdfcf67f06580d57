use super::*;
use kudos_proto::pluginregistration::v1 as api;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The path the kubelet sends as `:authority` when it registers a plugin.
const SOCKET_PATH: &str = "/var/lib/kubelet/plugins_registry/gpu.kudos.dev-reg.sock";

/// An HPACK string literal without Huffman coding.
fn lit(s: &[u8]) -> Vec<u8> {
    assert!(s.len() < 127);
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s);
    v
}

/// A grpc-go request header block for `path` with `authority` as a literal with incremental
/// indexing of the static `:authority` name (what grpc-go's encoder writes).
fn block(path: &str, authority: &[u8]) -> Vec<u8> {
    let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
    b.push(0x44); // :path, literal with incremental indexing
    b.extend(lit(path.as_bytes()));
    b.push(0x41); // :authority, literal with incremental indexing
    b.extend_from_slice(authority);
    b.extend([0x0f, 0x10]); // content-type (static 31), literal without indexing
    b.extend(lit(b"application/grpc"));
    b.push(0x00); // te, literal with a new name
    b.extend(lit(b"te"));
    b.extend(lit(b"trailers"));
    b
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn a_socket_path_authority_becomes_localhost_and_nothing_else_changes() {
    let path = "/pluginregistration.Registration/GetInfo";
    let got = rewrite_block(&block(path, &lit(SOCKET_PATH.as_bytes())));
    assert_eq!(got, Some(block(path, &lit(b"localhost"))));
}

#[test]
fn a_huffman_coded_value_is_replaced_only_when_it_decodes_to_at_least_nine_bytes() {
    let path = "/p";
    // 34 Huffman bytes decode to at least 9 characters (codes are at most 30 bits).
    let mut long = vec![0x80 | 34];
    long.extend([0xaa; 34]);
    assert_eq!(
        rewrite_block(&block(path, &long)),
        Some(block(path, &lit(b"localhost")))
    );
    let mut short = vec![0x80 | 33];
    short.extend([0xaa; 33]);
    assert_eq!(rewrite_block(&block(path, &short)), None);
}

#[test]
fn a_real_authority_is_left_alone() {
    for a in [
        &b"127.0.0.1:8080"[..],
        b"localhost",
        b"kudos-orchestrator.kudos-system.svc",
    ] {
        assert_eq!(rewrite_block(&block("/p", &lit(a))), None, "{a:?}");
    }
}

#[test]
fn padding_and_priority_survive_and_the_frame_length_follows() {
    let b = block("/p", &lit(SOCKET_PATH.as_bytes()));
    let mut payload = vec![3u8]; // pad length
    payload.extend([0, 0, 0, 0, 15]); // priority: dependency, weight
    payload.extend_from_slice(&b);
    payload.extend([0, 0, 0]);
    let f = frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &payload);
    let fixed = rewrite_headers(&f).expect("rewritten");
    let want_block = block("/p", &lit(b"localhost"));
    let mut want = vec![3u8, 0, 0, 0, 0, 15];
    want.extend_from_slice(&want_block);
    want.extend([0, 0, 0]);
    assert_eq!(
        fixed,
        frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &want)
    );
}

#[test]
fn blocks_continued_elsewhere_or_broken_pass_unchanged() {
    let b = block("/p", &lit(SOCKET_PATH.as_bytes()));
    assert_eq!(rewrite_headers(&frame(HEADERS, 0, 1, &b)), None);
    assert_eq!(rewrite_block(&b[..b.len() - 40]), None);
    assert_eq!(
        rewrite_block(&[0x41, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        None
    );
    assert_eq!(
        rewrite_headers(&frame(HEADERS, END_HEADERS | PADDED, 1, &[200])),
        None
    );
}

/// What a server answered a raw HTTP/2 client on stream 1.
#[derive(Debug, PartialEq)]
enum Answer {
    /// Response headers and the gRPC message (length-prefixed protobuf).
    Message(Vec<u8>),
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// Calls `Registration/GetInfo` on `socket` as the kubelet does: grpc-go, `:authority` = the
/// socket path, one byte at a time so every frame arrives split.
async fn get_info_as_the_kubelet(socket: &std::path::Path) -> Answer {
    let mut c = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    let b = block(
        "/pluginregistration.Registration/GetInfo",
        &lit(SOCKET_PATH.as_bytes()),
    );
    out.extend(frame(HEADERS, END_HEADERS, 1, &b));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA, END_STREAM: empty request
    for byte in out {
        c.write_all(&[byte]).await.expect("write");
    }
    let mut message = Vec::new();
    let read = async {
        loop {
            let mut h = [0u8; 9];
            c.read_exact(&mut h).await.expect("frame header");
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let mut p = vec![0u8; len];
            c.read_exact(&mut p).await.expect("frame payload");
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            match (h[3], stream) {
                (0x4, 0) if h[4] & 1 == 0 => {
                    c.write_all(&frame(0x4, 1, 0, &[])).await.expect("ack");
                }
                (0x3, 1) => return Answer::Reset(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
                (0x0, 1) => message.extend(p),
                (0x1, 1) if h[4] & 1 != 0 => return Answer::Message(message),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer")
}

fn registration() -> tonic::service::Routes {
    let svc = crate::dra::registration::RegistrationService::new(
        std::path::Path::new("/var/lib/kubelet/plugins/gpu.kudos.dev/dra.sock"),
        Arc::new(tokio::sync::Notify::new()),
        crate::metrics::Metrics::new(),
    );
    tonic::service::Routes::new(api::registration_server::RegistrationServer::new(svc))
}

#[tokio::test]
async fn the_kubelets_get_info_is_answered_where_plain_tonic_resets_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Plain tonic on a Unix socket: h2 refuses the path as an authority.
    let plain = dir.path().join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&plain).expect("bind");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(registration())
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    assert_eq!(
        get_info_as_the_kubelet(&plain).await,
        Answer::Reset(0x1),
        "h2 no longer rejects a path :authority: this workaround can go"
    );
    server.abort();

    // The plugin's sockets: answered.
    let fixed = dir.path().join("fixed.sock");
    let served = crate::dra::registration::serve(&fixed, registration())
        .await
        .expect("serve");
    let Answer::Message(m) = get_info_as_the_kubelet(&fixed).await else {
        panic!("GetInfo was not answered");
    };
    // A gRPC message (uncompressed, its length) holding the PluginInfo's strings.
    assert_eq!(m[0], 0);
    assert_eq!(
        usize::try_from(u32::from_be_bytes([m[1], m[2], m[3], m[4]])),
        Ok(m.len() - 5)
    );
    let has = |s: &str| m.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(has("DRAPlugin") && has(kudos_api::dra::DRIVER), "{m:?}");
    served.stop().await;
}
