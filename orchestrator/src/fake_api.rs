//! A fake API server for unit tests: a `kube::Client` over a closure that answers
//! `(method, path, body)` with `(status, JSON)`, and counts calls.

use kube::client::Body;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Handler: method, path, request body → status and JSON body.
pub type Handler =
    dyn Fn(&http::Method, &str, &serde_json::Value) -> (u16, serde_json::Value) + Send + Sync;

/// A client whose requests `handler` answers; the counter counts requests.
pub fn client(handler: Arc<Handler>) -> (kube::Client, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let svc = tower::service_fn(move |req: http::Request<Body>| {
        let handler = handler.clone();
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await?;
            let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let (status, out) = handler(&parts.method, parts.uri.path(), &json);
            let resp = http::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&out).unwrap_or_default()))
                .map_err(kube::Error::HttpError)?;
            Ok::<_, kube::Error>(resp)
        }
    });
    (kube::Client::new(svc, "default"), calls)
}

/// A Kubernetes `Status` body for errors.
pub fn status(code: u16, reason: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code})
}
