//! gRPC channels over a Unix socket: the kubelet serves every API in this crate on one (and a
//! plugin serves the kubelet on one), while tonic's endpoints dial TCP. The endpoint's URI is
//! required by tonic but never dialled: the connector opens the socket instead.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Error, Uri};

/// The placeholder URI tonic's endpoint needs.
const UNUSED_URI: &str = "http://[::1]:0";

/// Connects now: fails when nothing listens on `path`.
pub async fn connect(path: &Path) -> Result<Channel, Error> {
    Endpoint::from_static(UNUSED_URI)
        .connect_with_connector(connector(path))
        .await
}

/// Connects on first use and reconnects after the server restarts (a kubelet restart replaces
/// its socket): each attempt gives up after `connect_timeout`.
pub fn connect_lazy(path: &Path, connect_timeout: Duration) -> Channel {
    Endpoint::from_static(UNUSED_URI)
        .connect_timeout(connect_timeout)
        .connect_with_connector_lazy(connector(path))
}

fn connector(
    path: &Path,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<UnixStream>>> + Send,
> + Clone
+ Send
+ 'static {
    let path = path.to_owned();
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connecting_to_a_missing_socket_fails_now_and_lazily_on_first_use() {
        let missing = std::env::temp_dir().join(format!("kudos-proto-{}.sock", std::process::id()));
        assert!(connect(&missing).await.is_err());
        let mut client =
            crate::podresources::v1::pod_resources_lister_client::PodResourcesListerClient::new(
                connect_lazy(&missing, Duration::from_millis(200)),
            );
        let err = client
            .list(crate::podresources::v1::ListPodResourcesRequest {})
            .await
            .expect_err("no server");
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }
}
