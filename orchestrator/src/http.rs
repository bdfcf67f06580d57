//! The HTTP server: extender verbs under the configured prefix (default `/kudos/v1`), plus
//! `/healthz`, `/readyz`, `/metrics`, `GET /explain/{namespace}/{pod}` and `GET /state`.
//!
//! Limits are tower layers: a body limit (extender requests carry whole node lists), a
//! timeout (bind has its own, longer one: it calls the API server), a concurrency limit and
//! request tracing. [`AppError`] is the one place errors become HTTP responses.

use crate::extender::Extender;
use crate::extender::types::{ExtenderArgs, ExtenderBindingArgs};
use crate::index::SharedIndex;
use crate::metrics::{Metrics, OutcomeLabels, VerbLabels};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// Shared state of the HTTP handlers.
pub struct HttpState {
    /// The extender.
    pub extender: Extender,
    /// The index (read only).
    pub index: SharedIndex,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// Router limits.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Extender prefix (`""` or `/x/y`).
    pub prefix: String,
    /// Body limit, bytes.
    pub max_body_bytes: usize,
    /// Timeout of everything but bind.
    pub timeout: Duration,
    /// Timeout of bind.
    pub bind_timeout: Duration,
    /// Requests in flight at once.
    pub max_concurrent: usize,
}

/// HTTP errors: what the caller sees, and what is logged.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request body is not what the route expects.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Nothing known under that name.
    #[error("{0}")]
    NotFound(String),
    /// The index has not synced yet.
    #[error("not ready: the node index has not synced yet")]
    NotReady,
    /// A bug or an I/O failure.
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Serialize)]
struct ErrorBody {
    error: String,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = match &self {
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        (
            status,
            axum::Json(ErrorBody {
                error: self.to_string(),
            }),
        )
            .into_response()
    }
}

type St = State<Arc<HttpState>>;

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AppError> {
    serde_json::from_slice(body).map_err(|e| AppError::BadRequest(format!("invalid JSON: {e}")))
}

fn json<T: Serialize>(v: &T) -> Result<Response, AppError> {
    let body = serde_json::to_vec(v).map_err(|e| AppError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn ready(s: &HttpState) -> bool {
    s.index.read().map(|i| i.ready()).unwrap_or(false)
}

fn observe(s: &HttpState, verb: &'static str, start: Instant, ok: bool) {
    s.metrics
        .extender_duration
        .get_or_create(&VerbLabels { verb })
        .observe(start.elapsed().as_secs_f64());
    s.metrics
        .extender_requests
        .get_or_create(&OutcomeLabels {
            verb,
            outcome: if ok { "ok" } else { "error" },
        })
        .inc();
}

async fn filter(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let start = Instant::now();
    if !ready(&s) {
        observe(&s, "filter", start, false);
        return Err(AppError::NotReady);
    }
    let args: ExtenderArgs = parse(&body)?;
    let r = s.extender.filter(args);
    observe(&s, "filter", start, r.error.is_empty());
    json(&r)
}

async fn prioritize(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let start = Instant::now();
    if !ready(&s) {
        observe(&s, "prioritize", start, false);
        return Err(AppError::NotReady);
    }
    let args: ExtenderArgs = parse(&body)?;
    let r = s.extender.prioritize(args).map_err(AppError::BadRequest);
    observe(&s, "prioritize", start, r.is_ok());
    json(&r?)
}

async fn bind(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let start = Instant::now();
    let args: ExtenderBindingArgs = parse(&body)?;
    let r = s.extender.bind(args).await;
    observe(&s, "bind", start, r.error.is_empty());
    json(&r)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): St) -> Result<&'static str, AppError> {
    if ready(&s) {
        Ok("ok")
    } else {
        Err(AppError::NotReady)
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else Prometheus text 0.0.4.
async fn metrics(State(s): St, headers: axum::http::HeaderMap) -> Result<Response, AppError> {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (ct, text) = if openmetrics {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            s.metrics.encode(),
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            s.metrics.encode_prometheus_text(),
        )
    };
    let text = text.map_err(|e| AppError::Internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, ct)], text).into_response())
}

async fn explain(
    State(s): St,
    Path((namespace, pod)): Path<(String, String)>,
) -> Result<Response, AppError> {
    let e = s.extender.explain.get(&namespace, &pod).ok_or_else(|| {
        AppError::NotFound(format!(
            "no ranking for pod {namespace}/{pod} since this orchestrator started; \
             rankings are kept for pods that request the unified resource"
        ))
    })?;
    // The third queue: nodes re-scored by the class's latest run feedback.
    let third_queue = e.ranking.class.as_deref().and_then(|c| {
        let index = s.index.read().ok()?;
        index.third_queue(c).cloned()
    });
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct WithThird<'a> {
        #[serde(flatten)]
        explained: &'a crate::extender::Explained,
        third_queue: Option<crate::index::ThirdQueue>,
    }
    json(&WithThird {
        explained: &e,
        third_queue,
    })
}

async fn get_state(State(s): St) -> Result<Response, AppError> {
    let now = crate::extender::unix_now();
    let view = s
        .index
        .read()
        .map_err(|_| AppError::Internal("index lock poisoned".into()))?
        .view(now);
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Full<'a> {
        #[serde(flatten)]
        view: &'a crate::index::StateView,
        gang_reservations: std::collections::BTreeMap<String, crate::extender::ledger::Reservation>,
    }
    json(&Full {
        view: &view,
        gang_reservations: s.extender.ledger.reservations(now).into_iter().collect(),
    })
}

/// Builds the router; testable with `tower::ServiceExt::oneshot`.
pub fn router(state: Arc<HttpState>, limits: &HttpLimits) -> Router {
    let p = &limits.prefix;
    let fast = Router::new()
        .route(&format!("{p}/filter"), post(filter))
        .route(&format!("{p}/prioritize"), post(prioritize))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/explain/{namespace}/{pod}", get(explain))
        .route("/state", get(get_state))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            limits.timeout,
        ));
    let slow = Router::new().route(&format!("{p}/bind"), post(bind)).layer(
        TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, limits.bind_timeout),
    );
    fast.merge(slow).with_state(state).layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(DefaultBodyLimit::max(limits.max_body_bytes))
            .layer(ConcurrencyLimitLayer::new(limits.max_concurrent)),
    )
}
