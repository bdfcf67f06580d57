//! The HTTP server: extender verbs under the configured prefix (default `/kudos/v1`), plus
//! `/healthz`, `/readyz`, `/metrics`, `GET /explain/{namespace}/{pod}` and `GET /state`.
//!
//! Limits are tower layers: a body limit (extender requests carry whole node lists), a
//! timeout (bind has its own, longer one: it calls the API server), a concurrency limit and
//! request tracing. [`AppError`] is the one place errors become HTTP responses.
//!
//! A timeout cannot stop CPU-bound work, so work per request is bounded by its input (body
//! size, [`crate::limits::MAX_NODE_NAMES`]) and the heavy read endpoints (`/state`,
//! `/explain`, `/metrics`) have their own small concurrency limit, answer 503 beyond it, and
//! build `/state` on a blocking thread: they never take the workers kube-scheduler's calls
//! need. [`serve`] (`listener.rs`) owns the accept loop: a connection cap, the TLS handshake,
//! HTTP/2 or HTTP/1.1 by what the client negotiated, and the header or first-request timeout.

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
use tokio::sync::Semaphore;
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

mod listener;
pub use listener::{ALPN, ConnLimits, Protocol, serve};

/// Shared state of the HTTP handlers.
pub struct HttpState {
    /// The extender.
    pub extender: Extender,
    /// The index (read only).
    pub index: SharedIndex,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Permits of the heavy read endpoints (`/state`, `/explain`, `/metrics`).
    pub heavy: Semaphore,
    /// Whether the index answers reads (see [`crate::health`]).
    pub watchdog: Arc<crate::health::IndexWatchdog>,
    /// Who may call the extender verbs and the read endpoints.
    pub access: crate::access::AccessPolicy,
    /// The scheduler the admission webhook gives GPU pods; `None`: no webhook route.
    pub pod_scheduler_name: Option<String>,
    /// What `/readyz` says of this replica's part in leader election.
    pub role: Arc<parking_lot::RwLock<Role>>,
}

/// A replica's part in leader election, as `/readyz` tells it.
#[derive(Clone, Debug, Default)]
pub struct Role {
    /// A follower names the leader here; empty for the leader, or without election (`ok`).
    pub text: String,
    /// Why a follower's state is stale (it cannot follow the store): `/readyz` answers 503 with
    /// it, so that kube-scheduler's calls go to another replica.
    pub behind: Option<String>,
}

impl HttpState {
    /// State with the default heavy-endpoint limit and a watchdog that has not probed yet.
    pub fn new(extender: Extender, index: SharedIndex, metrics: Arc<Metrics>) -> Self {
        Self {
            extender,
            index,
            metrics,
            heavy: Semaphore::new(crate::limits::DEFAULT_MAX_HEAVY_REQUESTS),
            watchdog: Arc::new(crate::health::IndexWatchdog::new(
                crate::health::DEFAULT_STALL_AFTER,
            )),
            access: crate::access::AccessPolicy::default(),
            pod_scheduler_name: None,
            role: Arc::default(),
        }
    }
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
    /// The index has not answered a read for this long: a writer is stuck holding it.
    #[error("the index has not answered a read for {0:.1} s")]
    Stalled(f64),
    /// A follower cannot follow the state store.
    #[error("not ready: {0}")]
    Behind(String),
    /// Too many heavy read requests at once.
    #[error(
        "busy: {0} heavy read requests (/state, /explain, /metrics) are in progress; retry later"
    )]
    Busy(usize),
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
            AppError::NotReady | AppError::Stalled(_) | AppError::Busy(_) | AppError::Behind(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
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

fn parse<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, AppError> {
    serde_json::from_slice(body).map_err(invalid_json)
}

/// A filter or prioritize request (see [`ExtenderArgs::from_json`]).
fn parse_args(body: &[u8]) -> Result<ExtenderArgs<'_>, AppError> {
    ExtenderArgs::from_json(body).map_err(invalid_json)
}

fn invalid_json(e: serde_json::Error) -> AppError {
    AppError::BadRequest(format!("invalid JSON: {e}"))
}

fn json<T: Serialize>(v: &T) -> Result<Response, AppError> {
    let body = serde_json::to_vec(v).map_err(|e| AppError::Internal(e.to_string()))?;
    Ok(json_body(body))
}

/// An answer already written as JSON.
fn json_body(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn ready(s: &HttpState) -> bool {
    s.index.read().ready()
}

/// A permit for a heavy read endpoint, or 503 at once (never a queue behind the extender).
fn heavy(s: &HttpState) -> Result<tokio::sync::SemaphorePermit<'_>, AppError> {
    s.heavy.try_acquire().map_err(|_| {
        s.metrics.heavy_requests_refused.inc();
        AppError::Busy(crate::limits::DEFAULT_MAX_HEAVY_REQUESTS)
    })
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
    let args = parse_args(&body)?;
    let r = s.extender.filter(args);
    observe(&s, "filter", start, r.error.is_empty());
    Ok(json_body(crate::extender::types::filter_result_json(&r)))
}

async fn prioritize(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let start = Instant::now();
    if !ready(&s) {
        observe(&s, "prioritize", start, false);
        return Err(AppError::NotReady);
    }
    let args = parse_args(&body)?;
    let r = s.extender.prioritize(args).map_err(AppError::BadRequest);
    observe(&s, "prioritize", start, r.is_ok());
    Ok(json_body(crate::extender::types::host_priorities_json(&r?)))
}

async fn bind(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let start = Instant::now();
    let args: ExtenderBindingArgs = parse(&body)?;
    let r = s.extender.bind(args).await;
    observe(&s, "bind", start, r.error.is_empty());
    json(&r)
}

/// The admission webhook (see [`crate::admission`]); registered only when configured.
async fn mutate_pods(State(s): St, body: Bytes) -> Result<Response, AppError> {
    let scheduler = s.pod_scheduler_name.as_deref().unwrap_or_default();
    let counted = |decision| {
        s.metrics
            .admission_pods
            .get_or_create(&crate::metrics::DecisionLabels { decision })
            .inc();
    };
    let review: crate::admission::AdmissionReview =
        parse(&body).inspect_err(|_| counted("error"))?;
    match crate::admission::review(&review, &s.extender.unified, scheduler) {
        Ok((answer, decision)) => {
            counted(decision.as_str());
            if decision == crate::admission::Decision::Mutated {
                let pod = &review.request.as_ref().map(|r| &r.object);
                tracing::info!(
                    pod = pod
                        .and_then(|p| p["metadata"]["name"].as_str())
                        .unwrap_or(""),
                    namespace = pod
                        .and_then(|p| p["metadata"]["namespace"].as_str())
                        .unwrap_or(""),
                    scheduler,
                    "GPU pod given Kudos' scheduler"
                );
            }
            json(&answer)
        }
        Err(e) => {
            counted("error");
            Err(AppError::BadRequest(e))
        }
    }
}

/// Liveness: fails while the index is stalled, so the kubelet restarts the process.
async fn healthz(State(s): St) -> Result<&'static str, AppError> {
    match s.watchdog.stalled_for() {
        Some(d) => Err(AppError::Stalled(d.as_secs_f64())),
        None => Ok("ok"),
    }
}

/// Readiness: the index synced and answers reads. Checked without the index lock, so a
/// stuck writer cannot also stall the probe.
async fn readyz(State(s): St) -> Result<String, AppError> {
    if let Some(d) = s.watchdog.stalled_for() {
        return Err(AppError::Stalled(d.as_secs_f64()));
    }
    let index = s.index.clone();
    let synced = tokio::task::spawn_blocking(move || {
        index
            .try_read_for(crate::health::DEFAULT_STALL_AFTER)
            .map(|i| i.ready())
    })
    .await
    .map_err(|e| AppError::Internal(e.to_string()))?;
    match synced {
        Some(true) => {
            let role = s.role.read();
            match (&role.behind, role.text.is_empty()) {
                (Some(why), _) => Err(AppError::Behind(why.clone())),
                (None, true) => Ok("ok".to_owned()),
                (None, false) => Ok(role.text.clone()),
            }
        }
        Some(false) => Err(AppError::NotReady),
        None => Err(AppError::Stalled(
            crate::health::DEFAULT_STALL_AFTER.as_secs_f64(),
        )),
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else Prometheus text 0.0.4.
async fn metrics(State(s): St, headers: axum::http::HeaderMap) -> Result<Response, AppError> {
    let _permit = heavy(&s)?;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let openmetrics = s
        .metrics
        .encode()
        .map_err(|e| AppError::Internal(e.to_string()))?;
    let (ct, text) = kudos_common::exposition::negotiate(accept, openmetrics);
    Ok(([(header::CONTENT_TYPE, ct)], text).into_response())
}

async fn explain(
    State(s): St,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<Response, AppError> {
    // axum's own rejection is plain text; every error here is JSON (found by fuzzing: a
    // percent-encoded namespace that is not UTF-8).
    let Path((namespace, pod)) =
        path.map_err(|e| AppError::BadRequest(format!("invalid path: {}", e.body_text())))?;
    let _permit = heavy(&s)?;
    let e = s.extender.explain.get(&namespace, &pod).ok_or_else(|| {
        AppError::NotFound(format!(
            "no ranking for pod {namespace}/{pod} since this orchestrator started; \
             rankings are kept for pods that request the unified resource"
        ))
    })?;
    // The third queue: nodes re-scored by the class's latest run feedback.
    let third_queue = e.ranking.class().and_then(|c| {
        let index = s.index.read();
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

/// `GET /state`: the view is built and serialised on a blocking thread (it is proportional
/// to the whole index), under the heavy-endpoint limit.
async fn get_state(State(s): St) -> Result<Response, AppError> {
    let _permit = heavy(&s)?;
    let st = s.clone();
    tokio::task::spawn_blocking(move || {
        let now = crate::extender::unix_now();
        let view = st.index.read().view(now);
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Full<'a> {
            #[serde(flatten)]
            view: &'a crate::index::StateView,
            gang_reservations:
                std::collections::BTreeMap<String, crate::extender::ledger::Reservation>,
        }
        json(&Full {
            view: &view,
            gang_reservations: st.extender.ledger.reservations(now).into_iter().collect(),
        })
    })
    .await
    .map_err(|e| AppError::Internal(e.to_string()))?
}

/// `GET /status`: the operator's page (see [`crate::status`]), built on a blocking thread
/// under the heavy-endpoint limit like `/state`.
async fn get_status(State(s): St) -> Result<Response, AppError> {
    let _permit = heavy(&s)?;
    let st = s.clone();
    tokio::task::spawn_blocking(move || {
        let now = crate::extender::unix_now();
        let (view, model) = {
            let index = st.index.read();
            (index.view(now), index.model())
        };
        let recent = st.extender.explain.recent(30);
        let page = crate::status::render(&crate::status::StatusInputs {
            view: &view,
            model: &model,
            recent: &recent,
            now,
        });
        ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
    })
    .await
    .map_err(|e| AppError::Internal(e.to_string()))
}

/// Builds the router; testable with `tower::ServiceExt::oneshot`. Three groups of routes,
/// each behind its own gate (see [`crate::access`]): the extender verbs, the read endpoints,
/// and the probes, which stay open.
pub fn router(state: Arc<HttpState>, limits: &HttpLimits) -> Router {
    use axum::middleware::from_fn_with_state;
    let p = &limits.prefix;
    let timeout = |d| TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, d);
    let extender = Router::new()
        .route(&format!("{p}/filter"), post(filter))
        .route(&format!("{p}/prioritize"), post(prioritize))
        .layer(timeout(limits.timeout))
        .merge(
            Router::new()
                .route(&format!("{p}/bind"), post(bind))
                .layer(timeout(limits.bind_timeout)),
        )
        .route_layer(from_fn_with_state(
            state.clone(),
            crate::access::extender_gate,
        ));
    let read = Router::new()
        .route("/metrics", get(metrics))
        .route("/explain/{namespace}/{pod}", get(explain))
        .route("/state", get(get_state))
        .route("/status", get(get_status))
        .layer(timeout(limits.timeout))
        .route_layer(from_fn_with_state(state.clone(), crate::access::read_gate));
    let mut probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    if state.pod_scheduler_name.is_some() {
        probes = probes.route("/mutate/pods", post(mutate_pods));
    }
    let probes = probes.layer(timeout(limits.timeout));
    extender.merge(read).merge(probes).with_state(state).layer(
        ServiceBuilder::new()
            .layer(TraceLayer::new_for_http())
            .layer(DefaultBodyLimit::max(limits.max_body_bytes))
            .layer(ConcurrencyLimitLayer::new(limits.max_concurrent)),
    )
}
