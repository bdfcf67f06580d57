//! Leader election over a `coordination.k8s.io/v1` Lease, so several replicas can run: every
//! replica answers the extender, the holder of the Lease alone writes.
//!
//! Leader and followers: a replica that does not hold the Lease follows the shared state (see
//! [`crate::follow`]) and answers `filter`, `prioritize` and `bind` from it; `/readyz` names the
//! leader. The leader also serves gRPC (run and plugin reports), writes the ConfigMap store,
//! rolls out and prunes, and labels its own pod `kudos.dev/role=leader`: the chart's Service
//! for device plugins and node agents selects that label, while its extender Service selects
//! every ready replica (with client-IP affinity, so one kube-scheduler's calls for a pod reach
//! one replica, whose gang reservations and recent rankings `bind` checks). A follower removes
//! the label from its pod before anything else (a restarted container keeps its pod's
//! labels), and the leader removes it before it releases or after it loses the Lease. Every
//! acknowledged report is in the store before the ack, so the follower that takes over has all
//! of them.
//!
//! The algorithm is client-go's: a candidate takes the Lease when nobody holds it, or when the
//! holder's record has not changed for `lease_duration` as measured by the candidate's own
//! clock (no clock comparison across machines); writes are compare-and-swap on
//! `resourceVersion`. The leader renews every `retry_period` and steps down (the process exits,
//! so its restart rejoins as a follower) when it could not renew for `renew_deadline`, which is
//! shorter than `lease_duration`, so it has stopped writing before anyone else may take over.
//! On shutdown the leader releases the Lease and a follower takes over within one
//! `retry_period`.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Timing and names of the election.
#[derive(Clone, Debug)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity (written as the holder).
    pub identity: String,
    /// How long a holder's record must stay unchanged before a candidate takes the Lease.
    pub lease_duration: Duration,
    /// How long the leader keeps serving without a successful renewal.
    pub renew_deadline: Duration,
    /// Between two attempts to acquire or renew.
    pub retry_period: Duration,
}

/// A unique identity: the pod's name (`POD_NAME`, from the downward API) or the host name,
/// then the process ID and a few random bits (two replicas on one host, or a restarted
/// container, are different candidates).
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "kudos-orchestrator".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{base}_{}_{nanos:08x}", std::process::id())
}

/// The `kudos.dev/role` label on this replica's own pod (`POD_NAME`, `POD_NAMESPACE` from the
/// downward API); nothing to label when the process does not run in a pod.
#[derive(Clone)]
pub struct PodRole {
    pods: Option<(Api<k8s_openapi::api::core::v1::Pod>, String)>,
}

impl PodRole {
    /// This process's pod, from the environment.
    pub fn from_env(client: kube::Client) -> Self {
        let var = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
        let pods = match (var("POD_NAME"), var("POD_NAMESPACE")) {
            (Some(name), Some(ns)) => Some((Api::namespaced(client, &ns), name)),
            _ => {
                tracing::info!(
                    "POD_NAME/POD_NAMESPACE not set: no kudos.dev/role label (not in a pod)"
                );
                None
            }
        };
        Self { pods }
    }

    /// Sets (`leader`) or removes the label.
    pub async fn set(&self, leader: bool) -> Result<(), kube::Error> {
        let Some((pods, name)) = &self.pods else {
            return Ok(());
        };
        let value = if leader {
            serde_json::Value::from(kudos_api::labels::ROLE_LEADER)
        } else {
            serde_json::Value::Null
        };
        let patch = serde_json::json!({"metadata": {"labels": {kudos_api::labels::ORCHESTRATOR_ROLE: value}}});
        pods.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// Removes the label, logging a failure (the Service would keep sending here until the
    /// pod is gone or restarted).
    pub async fn clear(&self) {
        if let Err(e) = self.set(false).await {
            tracing::warn!(error = %e, "cannot remove the kudos.dev/role=leader label from this pod");
        }
    }
}

/// Held leadership: renewed in the background until released or lost.
pub struct Leadership {
    lost: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Resolves when the Lease was lost (not renewed within `renew_deadline`, or taken).
    pub async fn lost(&mut self) {
        if self.lost.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the Lease was lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Stops renewing and, if still held, releases the Lease so a follower takes over at once.
    pub async fn release(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// What a candidate saw of someone else's record, and when (by its own clock).
struct Observed {
    record: (String, Option<MicroTime>),
    at: Instant,
}

/// Outcome of one attempt.
enum Attempt {
    /// This replica holds the Lease now.
    Held,
    /// Someone else does.
    HeldBy(String),
}

/// Waits until this replica holds the Lease; `waiting` is called with the holder's identity
/// whenever it changes (for `/readyz` and logs). Errors of the API server are logged and
/// retried: a follower waits out an API outage.
pub async fn acquire(
    api: Api<Lease>,
    cfg: ElectionConfig,
    role: PodRole,
    waiting: impl Fn(&str),
) -> Leadership {
    let mut observed: Option<Observed> = None;
    let mut last_holder = String::new();
    loop {
        match attempt(&api, &cfg, &mut observed).await {
            Ok(Attempt::Held) => break,
            Ok(Attempt::HeldBy(h)) => {
                if h != last_holder {
                    tracing::info!(lease = %cfg.lease_name, holder = %h, "follower: another replica leads");
                    waiting(&h);
                    last_holder = h;
                }
            }
            Err(e) => {
                tracing::warn!(lease = %cfg.lease_name, error = %e, "leader election: cannot read or write the Lease; retrying")
            }
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
    tracing::info!(lease = %cfg.lease_name, identity = %cfg.identity, "acquired the leader Lease");
    let (lost_tx, lost) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(renew_loop(api, cfg, role, lost_tx, stop_rx));
    Leadership { lost, stop, task }
}

async fn renew_loop(
    api: Api<Lease>,
    cfg: ElectionConfig,
    role: PodRole,
    lost: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut renewed = Instant::now();
    let mut observed = None;
    loop {
        tokio::select! {
            // A send, or the sender dropped: either way, stop.
            _ = stop.changed() => {
                role.clear().await;
                release(&api, &cfg).await;
                return;
            }
            _ = tokio::time::sleep(cfg.retry_period) => {}
        }
        match attempt(&api, &cfg, &mut observed).await {
            Ok(Attempt::Held) => renewed = Instant::now(),
            Ok(Attempt::HeldBy(h)) => {
                tracing::error!(lease = %cfg.lease_name, holder = %h, "LEADERSHIP LOST: another replica holds the Lease");
                let _ = lost.send(true);
                role.clear().await;
                return;
            }
            Err(e) => {
                tracing::warn!(lease = %cfg.lease_name, error = %e, "cannot renew the leader Lease")
            }
        }
        if renewed.elapsed() > cfg.renew_deadline {
            tracing::error!(lease = %cfg.lease_name, deadline = ?cfg.renew_deadline, "LEADERSHIP LOST: the Lease was not renewed in time");
            let _ = lost.send(true);
            role.clear().await;
            return;
        }
    }
}

/// One try to take or renew the Lease (compare-and-swap on `resourceVersion`).
async fn attempt(
    api: &Api<Lease>,
    cfg: &ElectionConfig,
    observed: &mut Option<Observed>,
) -> Result<Attempt, kube::Error> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let duration_secs = i32::try_from(cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(lease) = api.get_opt(&cfg.lease_name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.lease_name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(duration_secs),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Held),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Ok(Attempt::HeldBy("(just created by another replica)".into()))
            }
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let ours = holder == cfg.identity;
    if !ours && !holder.is_empty() {
        let record = (holder.clone(), spec.renew_time.clone());
        let theirs = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(duration_secs).max(1)).unwrap_or(1),
        );
        match observed {
            Some(o) if o.record == record => {
                if o.at.elapsed() < theirs {
                    return Ok(Attempt::HeldBy(holder));
                }
            }
            _ => {
                *observed = Some(Observed {
                    record,
                    at: Instant::now(),
                });
                return Ok(Attempt::HeldBy(holder));
            }
        }
        tracing::warn!(lease = %cfg.lease_name, previous = %holder, "the leader's Lease expired; taking over");
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    let next = Lease {
        metadata: lease.metadata.clone(),
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: if ours {
                spec.acquire_time
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..spec
        }),
    };
    match api
        .replace(&cfg.lease_name, &PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(Attempt::Held),
        // Someone wrote in between: look again next time. For our own renewal that is not a
        // loss (an edit of the object's labels conflicts too): an error, which the renew
        // deadline bounds, instead of `HeldBy` ourselves.
        Err(kube::Error::Api(e)) if e.code == 409 && !ours => Ok(Attempt::HeldBy(holder)),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if this replica still holds it: no holder, so a follower takes it on its
/// next try instead of waiting `lease_duration`.
async fn release(api: &Api<Lease>, cfg: &ElectionConfig) {
    let lease = match api.get_opt(&cfg.lease_name).await {
        Ok(Some(l)) => l,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "cannot release the leader Lease; a follower takes over when it expires");
            return;
        }
    };
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    let next = Lease {
        metadata: lease.metadata.clone(),
        spec: Some(LeaseSpec {
            holder_identity: None,
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..spec
        }),
    };
    match api
        .replace(&cfg.lease_name, &PostParams::default(), &next)
        .await
    {
        Ok(_) => tracing::info!(lease = %cfg.lease_name, "released the leader Lease"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot release the leader Lease; a follower takes over when it expires")
        }
    }
}

// === configuration ===

/// `leaderElection` in the config file.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderElectionFile {
    /// Run leader election (`--leader-elect`), default false.
    pub enabled: Option<bool>,
    /// The Lease's name, default `kudos-orchestrator`.
    pub lease_name: Option<String>,
    /// The Lease's namespace, default the store's.
    pub namespace: Option<String>,
    /// Seconds a holder's record must stay unchanged before another replica takes over,
    /// default 10.
    pub lease_duration_seconds: Option<f64>,
    /// Seconds the leader keeps serving without renewing, default 7 (below the lease).
    pub renew_deadline_seconds: Option<f64>,
    /// Seconds between tries to acquire or renew, default 2 (below the deadline).
    pub retry_period_seconds: Option<f64>,
}

/// The election settings, or `None` when it is off. Checks what would break it: the timings'
/// order, and a file store (each replica would learn alone, and a takeover would lose every
/// report the old leader acknowledged).
pub fn resolve(
    file: &LeaderElectionFile,
    flag: Option<bool>,
    store: crate::config::StoreKind,
    store_namespace: &str,
) -> Result<Option<ElectionConfig>, crate::config::ConfigError> {
    use crate::config::ConfigError;
    if !flag.or(file.enabled).unwrap_or(false) {
        return Ok(None);
    }
    if store != crate::config::StoreKind::ConfigMap {
        return Err(ConfigError::Invalid {
            field: "leaderElection.enabled",
            reason: "needs the shared store (store.kind: configMap, --store=config-map): with a file store each replica keeps its own state, and a takeover would lose what the old leader acknowledged".into(),
        });
    }
    let secs = |field: &'static str, v: Option<f64>, default: f64| {
        let v = v.unwrap_or(default);
        if v.is_finite() && (0.1..=3600.0).contains(&v) {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(ConfigError::Invalid {
                field,
                reason: format!("{v} must be between 0.1 and 3600 seconds"),
            })
        }
    };
    let lease_duration = secs(
        "leaderElection.leaseDurationSeconds",
        file.lease_duration_seconds,
        10.0,
    )?;
    let renew_deadline = secs(
        "leaderElection.renewDeadlineSeconds",
        file.renew_deadline_seconds,
        7.0,
    )?;
    let retry_period = secs(
        "leaderElection.retryPeriodSeconds",
        file.retry_period_seconds,
        2.0,
    )?;
    if !(retry_period < renew_deadline && renew_deadline < lease_duration) {
        return Err(ConfigError::Invalid {
            field: "leaderElection",
            reason: format!(
                "needs retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds (got {} < {} < {}): the leader must give up before another replica may take over",
                retry_period.as_secs_f64(),
                renew_deadline.as_secs_f64(),
                lease_duration.as_secs_f64()
            ),
        });
    }
    let lease_name = file
        .lease_name
        .clone()
        .unwrap_or_else(|| "kudos-orchestrator".into());
    let namespace = file
        .namespace
        .clone()
        .unwrap_or_else(|| store_namespace.to_owned());
    for (field, v) in [
        ("leaderElection.leaseName", &lease_name),
        ("leaderElection.namespace", &namespace),
    ] {
        if !kudos_api::bounds::is_dns_subdomain(v) {
            return Err(ConfigError::Invalid {
                field,
                reason: format!("{v:?} is not an object name (a lowercase DNS subdomain)"),
            });
        }
    }
    Ok(Some(ElectionConfig {
        namespace,
        lease_name,
        identity: default_identity(),
        lease_duration,
        renew_deadline,
        retry_period,
    }))
}

// === the election a replica takes part in ===

/// What a replica needs to take part: the Lease, the timings and its pod's label.
pub struct Election {
    /// The Lease's API (its namespace).
    pub api: Api<Lease>,
    /// Names and timings.
    pub config: ElectionConfig,
    /// This replica's pod label.
    pub role: PodRole,
}

impl Election {
    /// The election of `config` through `client`, with this process's pod from the
    /// environment.
    pub fn new(client: kube::Client, config: ElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client.clone(), &config.namespace),
            role: PodRole::from_env(client),
            config,
        }
    }

    /// Labels this replica's pod the leader, trying four times `retry_period` apart.
    pub async fn label_leader(&self) -> anyhow::Result<()> {
        let mut labelled = self.role.set(true).await;
        for _ in 0..3 {
            if labelled.is_ok() {
                break;
            }
            tokio::time::sleep(self.config.retry_period).await;
            labelled = self.role.set(true).await;
        }
        labelled.map_err(|e| {
            anyhow::anyhow!(
                "cannot label this pod {}={} (needs pods patch in its namespace): {e}",
                kudos_api::labels::ORCHESTRATOR_ROLE,
                kudos_api::labels::ROLE_LEADER
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreKind;

    #[test]
    fn off_by_default_and_refused_with_a_file_store() {
        let f = LeaderElectionFile::default();
        assert!(resolve(&f, None, StoreKind::File, "ns").unwrap().is_none());
        let e = resolve(&f, Some(true), StoreKind::File, "ns").unwrap_err();
        assert!(e.to_string().contains("store.kind: configMap"), "{e}");
        let c = resolve(&f, Some(true), StoreKind::ConfigMap, "kudos-system")
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.lease_name.as_str()),
            ("kudos-system", "kudos-orchestrator")
        );
        assert_eq!(c.lease_duration, Duration::from_secs(10));
        assert!(c.identity.contains(&std::process::id().to_string()));
    }

    #[test]
    fn timings_must_let_the_leader_step_down_first() {
        let f = LeaderElectionFile {
            enabled: Some(true),
            lease_duration_seconds: Some(5.0),
            renew_deadline_seconds: Some(5.0),
            ..Default::default()
        };
        let e = resolve(&f, None, StoreKind::ConfigMap, "ns").unwrap_err();
        assert!(
            e.to_string()
                .contains("retryPeriodSeconds < renewDeadlineSeconds"),
            "{e}"
        );
        let f = LeaderElectionFile {
            enabled: Some(true),
            retry_period_seconds: Some(f64::NAN),
            ..Default::default()
        };
        assert!(resolve(&f, None, StoreKind::ConfigMap, "ns").is_err());
        let f = LeaderElectionFile {
            enabled: Some(true),
            lease_name: Some("Not_A_Name".into()),
            ..Default::default()
        };
        assert!(resolve(&f, None, StoreKind::ConfigMap, "ns").is_err());
    }
}
