//! Prometheus metrics (prometheus-client, OpenMetrics text on `GET /metrics`), base units only.

use kudos_scheduler_core::RejectionKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set `{verb}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize`, `bind`, or a gRPC method.
    pub verb: &'static str,
}

/// Label set `{verb, outcome}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Verb or RPC.
    pub verb: &'static str,
    /// `ok`, `error`, or a gRPC code / ack status.
    pub outcome: &'static str,
}

/// Label set `{reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why, as a short identifier.
    pub reason: &'static str,
}

/// Label set `{protocol}`: `h2` or `http/1.1` ([`crate::http::Protocol::as_str`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    /// The protocol a connection speaks.
    pub protocol: &'static str,
}

/// The reasons of `run_report_rejections_total` (see `grpc::check_run_report`).
pub const REJECTION_REASONS: [&str; 3] = ["name_too_long", "too_many_devices", "implausible_time"];

/// Label set `{decision}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `mutated`, `unchanged` or `error`.
    pub decision: &'static str,
}

/// The reasons of `extender_bind_refused_total` (see `extender::BindRefusal`).
pub const BIND_REFUSAL_REASONS: [&str; 3] = ["notRanked", "stale", "nodeDidNotPass"];
/// The reasons of `http_requests_refused_total` (see `access::Refusal`).
pub const ACCESS_REFUSAL_REASONS: [&str; 6] = [
    "noClientCertificate",
    "clientNotAllowed",
    "noToken",
    "tokenRefused",
    "forbidden",
    "unavailable",
];

/// The reason of `extender_nodes_rejected_total` for nodes without known accelerators or
/// excluded by node monitoring; the other reasons are scheduler-core's rejection kinds
/// ([`kudos_scheduler_core::RejectionKind::as_str`]).
pub const UNKNOWN_NODE_METRIC_REASON: &str = "unknown";

/// A counter family by `{reason}` with every reason at 0 from the start, so dashboards and
/// alerts see each series before its first increment (a family without children is not
/// exposed at all).
fn reason_counter(
    registry: &mut Registry,
    name: &str,
    help: &str,
    reasons: &[&'static str],
) -> Family<ReasonLabels, Counter> {
    let family = Family::<ReasonLabels, Counter>::default();
    for &reason in reasons {
        let _ = family.get_or_create(&ReasonLabels { reason });
    }
    registry.register(name, help, family.clone());
    family
}

/// All metrics of the process.
pub struct Metrics {
    registry: Registry,
    /// Extender request latency.
    pub extender_duration: Family<VerbLabels, Histogram>,
    /// Extender requests by outcome.
    pub extender_requests: Family<OutcomeLabels, Counter>,
    /// gRPC calls / reports by outcome.
    pub grpc: Family<OutcomeLabels, Counter>,
    /// Unary gRPC call latency (ReportPlugin, Heartbeat).
    pub grpc_duration: Family<VerbLabels, Histogram>,
    /// Durable append latency (the wait before an ack).
    pub store_append_duration: Histogram,
    /// Plugin configuration generation.
    pub plugin_generation: Gauge,
    /// 1 while this replica writes the state (it holds the Lease, or runs without election), 0
    /// while it follows.
    pub leader: Gauge,
    /// Nodes in the index (from the Node watch).
    pub nodes: Gauge,
    /// Pod rankings the extender keeps (`/explain`, `bind`'s check).
    pub explanations: Gauge,
    /// Node lines over the rankings kept (what bounds their memory).
    pub explanation_node_lines: Gauge,
    /// Nodes re-scored by run feedback (third-queue entries), in total.
    pub feedback_rescored_nodes: Counter,
    /// Rollout: image pushes, DaemonSet applies/deletes, failed passes
    /// (`kudos_orchestrator_rollout_*`).
    pub rollout: kudos_rollout::RolloutMetrics,
    /// Node monitoring gauges per configured node (`kudos_orchestrator_node_*`).
    pub monitor: kudos_rollout::MonitorMetrics,
    /// Extender binds refused because Kudos did not place the pod there, by reason.
    pub bind_refused: Family<ReasonLabels, Counter>,
    /// Candidate nodes left out of rankings, by reason.
    pub nodes_rejected: Family<ReasonLabels, Counter>,
    /// Pods the admission webhook saw, by decision.
    pub admission_pods: Family<DecisionLabels, Counter>,
    /// HTTP requests refused by authentication or authorization, by reason.
    pub access_refused: Family<ReasonLabels, Counter>,
    /// Run reports refused by a bound, by reason.
    pub report_rejections: Family<ReasonLabels, Counter>,
    /// HTTP connections closed at accept because the connection cap was reached.
    pub http_connections_refused: Counter,
    /// HTTP connections accepted (with TLS on, each one a handshake).
    pub http_connections_accepted: Counter,
    /// HTTP connections served (TLS handshake done), by protocol.
    pub http_connections_served: Family<ProtocolLabels, Counter>,
    /// Heavy read requests (`/state`, `/explain`, `/metrics`) refused with 503.
    pub heavy_requests_refused: Counter,
    /// Store files found damaged or empty and moved aside at start.
    pub store_recoveries: Family<ReasonLabels, Counter>,
    /// Seconds the index has not answered a read (0 while it answers).
    pub index_stalled_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Time to learn one batch of runs on a copy of the model and publish it.
    pub learn_batch_duration: Histogram,
    /// Runs learned from, in batches.
    pub learned_runs: Counter,
    /// Copies of the model published to the extender (at most one per `learn::PUBLISH_EVERY`).
    pub model_publishes: Counter,
    /// Stored runs left out of the model because learning them panicked.
    pub runs_left_out: Counter,
}

/// A gauge registered in `registry` as `name`.
fn registered_gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers everything under the `kudos_orchestrator` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kudos_orchestrator");
        let extender_duration = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        });
        registry.register(
            "extender_request_duration_seconds",
            "Time to answer a kube-scheduler extender call",
            extender_duration.clone(),
        );
        let extender_requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "extender_requests",
            "Extender calls by verb and outcome",
            extender_requests.clone(),
        );
        let grpc = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "grpc_events",
            "gRPC calls and run reports by method and outcome",
            grpc.clone(),
        );
        let grpc_duration = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        });
        registry.register(
            "grpc_request_duration_seconds",
            "Time to answer a unary gRPC call (authentication and persistence included)",
            grpc_duration.clone(),
        );
        let store_append_duration = Histogram::new(exponential_buckets(0.000_1, 2.0, 16));
        registry.register(
            "store_append_duration_seconds",
            "Time to durably store one run report",
            store_append_duration.clone(),
        );
        let plugin_generation = registered_gauge(
            &mut registry,
            "plugin_config_generation",
            "Current plugin configuration generation",
        );
        let leader = registered_gauge(
            &mut registry,
            "leader",
            "1 while this replica writes the state (holds the leader Lease, or runs without election), 0 while it follows",
        );
        let nodes = registered_gauge(&mut registry, "index_nodes", "Nodes in the index");
        let explanations = registered_gauge(
            &mut registry,
            "explanations",
            "Pod rankings kept for /explain and bind (the newest, at most 4,096)",
        );
        let explanation_node_lines = registered_gauge(
            &mut registry,
            "explanation_node_lines",
            "Node lines (ranked, rejected, unknown) over the rankings kept, at most 1,000,000 (about 106 bytes each)",
        );
        let feedback_rescored_nodes = Counter::default();
        registry.register(
            "feedback_rescored_nodes",
            "Nodes re-scored by run feedback (entries of the third queue)",
            feedback_rescored_nodes.clone(),
        );
        let rollout = kudos_rollout::RolloutMetrics::default();
        rollout.register(registry.sub_registry_with_prefix("rollout"));
        let monitor = kudos_rollout::MonitorMetrics::default();
        monitor.register(registry.sub_registry_with_prefix("node"));
        let report_rejections = reason_counter(
            &mut registry,
            "run_report_rejections",
            "Run reports refused by a bound (implausible times, oversized names), by reason",
            &REJECTION_REASONS,
        );
        let bind_refused = reason_counter(
            &mut registry,
            "extender_bind_refused",
            "Extender binds refused because Kudos did not just rank the pod onto that node, by reason",
            &BIND_REFUSAL_REASONS,
        );
        let admission_pods = Family::<DecisionLabels, Counter>::default();
        for decision in ["mutated", "unchanged", "error"] {
            let _ = admission_pods.get_or_create(&DecisionLabels { decision });
        }
        registry.register(
            "admission_pods",
            "Pods the admission webhook saw: mutated (schedulerName set to Kudos'), unchanged, error",
            admission_pods.clone(),
        );
        let access_refused = reason_counter(
            &mut registry,
            "http_requests_refused",
            "HTTP requests refused by authentication (client certificate, bearer token) or authorization, by reason",
            &ACCESS_REFUSAL_REASONS,
        );
        let nodes_rejected = reason_counter(
            &mut registry,
            "extender_nodes_rejected",
            "Candidate nodes the extender left out of a GPU pod's ranking, by reason (vendorNotAllowed: the pod's image cannot use the node's vendor)",
            &RejectionKind::ALL
                .map(RejectionKind::as_str)
                .into_iter()
                .chain([UNKNOWN_NODE_METRIC_REASON])
                .collect::<Vec<_>>(),
        );
        let http_connections_refused = Counter::default();
        registry.register(
            "http_connections_refused",
            "HTTP connections closed at accept because the connection cap was reached",
            http_connections_refused.clone(),
        );
        let http_connections_accepted = Counter::default();
        registry.register(
            "http_connections_accepted",
            "HTTP connections accepted, each a TLS handshake where TLS is on (over HTTP/1.1 \
             kube-scheduler's client keeps at most two idle connections per extender, so \
             concurrent binds open new ones; over HTTP/2 it multiplexes one)",
            http_connections_accepted.clone(),
        );
        let http_connections_served = Family::<ProtocolLabels, Counter>::default();
        for p in [crate::http::Protocol::Http2, crate::http::Protocol::Http1] {
            let protocol = p.as_str();
            let _ = http_connections_served.get_or_create(&ProtocolLabels { protocol });
        }
        registry.register(
            "http_connections_served",
            "HTTP connections served after the TLS handshake, by protocol (h2: negotiated over \
             TLS through ALPN; http/1.1: every plain-HTTP connection and TLS clients that did \
             not offer h2)",
            http_connections_served.clone(),
        );
        let heavy_requests_refused = Counter::default();
        registry.register(
            "heavy_requests_refused",
            "Requests to /state, /explain or /metrics refused because too many were in progress",
            heavy_requests_refused.clone(),
        );
        let store_recoveries = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "store_recoveries",
            "Store files found empty or damaged at start and moved aside, by reason",
            store_recoveries.clone(),
        );
        let index_stalled_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "index_stalled_seconds",
            "Seconds the index has not answered a read (0 while it answers)",
            index_stalled_seconds.clone(),
        );
        let learn_batch_duration = Histogram::new(exponential_buckets(0.000_1, 2.0, 18));
        registry.register(
            "learn_batch_duration_seconds",
            "Time to learn one batch of accepted runs on a copy of the model and publish it",
            learn_batch_duration.clone(),
        );
        let learned_runs = Counter::default();
        registry.register(
            "learned_runs",
            "Accepted runs the model learned from",
            learned_runs.clone(),
        );
        let runs_left_out = Counter::default();
        registry.register(
            "runs_left_out",
            "Stored runs left out of the model because learning them panicked (a defect: see the error log)",
            runs_left_out.clone(),
        );
        let model_publishes = Counter::default();
        registry.register(
            "model_publishes",
            "Copies of the learned model published to the extender (runs arriving close together share one)",
            model_publishes.clone(),
        );
        Self {
            registry,
            bind_refused,
            nodes_rejected,
            admission_pods,
            access_refused,
            report_rejections,
            http_connections_refused,
            http_connections_accepted,
            http_connections_served,
            heavy_requests_refused,
            store_recoveries,
            index_stalled_seconds,
            learn_batch_duration,
            learned_runs,
            model_publishes,
            runs_left_out,
            extender_duration,
            extender_requests,
            grpc,
            grpc_duration,
            store_append_duration,
            plugin_generation,
            leader,
            nodes,
            explanations,
            explanation_node_lines,
            feedback_rescored_nodes,
            rollout,
            monitor,
        }
    }

    /// Counts a gRPC event.
    pub fn grpc_event(&self, verb: &'static str, outcome: &'static str) {
        self.grpc
            .get_or_create(&OutcomeLabels { verb, outcome })
            .inc();
    }

    /// OpenMetrics text (what Prometheus asks for with `Accept: application/openmetrics-text`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
