//! The rollout reconciler: configuration view in, derived images and applied DaemonSets out.
//!
//! [`reconcile`] makes one idempotent pass in the kube-rs shape
//! (`reconcile(Arc<K>, Arc<Ctx>) -> Result<Action, Error>` plus [`error_policy`]):
//! 1. split the view into plugin groups;
//! 2. derive and push an image for every group whose configuration slice or base image
//!    changed (with the push retry policy), continuing past failures of single groups;
//! 3. hand the new images to the [`ImageRecorder`] — the orchestrator stores them in its
//!    configuration; if that fails nothing is applied;
//! 4. render and server-side apply the DaemonSets, prune those of departed groups (or, in
//!    dry-run mode, print the manifests instead of pushing and applying anything);
//! 5. return an error if any group failed, so [`error_policy`] requeues with backoff; else
//!    requeue after the resync period, which repairs drift and missed changes.
//!
//! The configuration is not a Kubernetes object the orchestrator watches, so besides the
//! kube-rs-shaped functions there is [`run`], a loop that reconciles on every new view from
//! a `tokio::sync::watch` channel and on requeue. Run it on the lease holder only.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::runtime::controller::Action;
use tracing::{Instrument, error, info, info_span, warn};

use crate::apply::{ApplyError, apply};
use crate::metrics::RolloutMetrics;
use crate::registry::{DeriveError, ImageDeriver};
use crate::render::{RenderError, RolloutSettings, render_yaml_from};
use crate::retry::RetryPolicy;
use kudos_api::{DerivedImage, PluginConfig, PluginConfigError};

/// Boxed error of an [`ImageRecorder`].
pub type RecordError = Box<dyn std::error::Error + Send + Sync>;

/// Stores derived images in the orchestrator's plugin configuration.
pub trait ImageRecorder: Send + Sync {
    /// Records `images` (group → image) derived from the view of `generation`. Implementations
    /// persist them so the next view carries them in [`PluginConfig::images`].
    fn record(
        &self,
        generation: u64,
        images: &BTreeMap<String, DerivedImage>,
    ) -> Result<(), RecordError>;
}

/// Prints dry-run manifests.
pub type DryRunSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Apply for real, or print what would be applied.
#[derive(Clone)]
pub enum Mode {
    /// Derive, push and apply.
    Apply,
    /// Render only and hand the YAML to the sink; nothing is pushed or applied.
    DryRun(DryRunSink),
}

impl Mode {
    /// Dry run printing to stdout (logs go to stderr, so stdout stays clean YAML).
    pub fn dry_run_stdout() -> Self {
        Self::DryRun(Arc::new(|yaml: &str| print!("{yaml}")))
    }
}

/// Errors of a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration view is invalid; retrying will not help until it changes.
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    /// Deriving an image failed (after retries) for at least one group.
    #[error("deriving plugin images failed for {failed} group(s)")]
    Derive {
        /// Number of groups that failed.
        failed: usize,
        /// The first failure.
        #[source]
        first: Box<DeriveError>,
    },
    /// The orchestrator could not record the derived images.
    #[error("recording derived images in the configuration")]
    Record(#[source] RecordError),
    /// Applying or pruning failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Rendering the dry-run manifests failed.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// Apply mode without a Kubernetes client.
    #[error("apply mode needs a Kubernetes client")]
    NoClient,
}

/// Everything a reconcile pass needs.
pub struct Ctx {
    /// Kubernetes client (needed in apply mode, and for Secret credentials).
    pub kube: Option<kube::Client>,
    /// Image deriver; `None` disables derivation (images come from elsewhere).
    pub deriver: Option<ImageDeriver>,
    /// DaemonSet settings.
    pub settings: RolloutSettings,
    /// Where derived images are recorded.
    pub recorder: Arc<dyn ImageRecorder>,
    /// Metrics.
    pub metrics: RolloutMetrics,
    /// Requeue period after a successful pass.
    pub resync: Duration,
    /// Backoff of failed passes.
    pub retry: RetryPolicy,
    /// Apply or dry run.
    pub mode: Mode,
    failures: AtomicU32,
}

impl Ctx {
    /// A context in apply mode with a 5-minute resync and the default retry policy.
    pub fn new(
        settings: RolloutSettings,
        recorder: Arc<dyn ImageRecorder>,
        metrics: RolloutMetrics,
    ) -> Self {
        Self {
            kube: None,
            deriver: None,
            settings,
            recorder,
            metrics,
            resync: Duration::from_secs(300),
            retry: RetryPolicy::default(),
            mode: Mode::Apply,
            failures: AtomicU32::new(0),
        }
    }

    /// Sets the Kubernetes client.
    pub fn with_kube(mut self, client: kube::Client) -> Self {
        self.kube = Some(client);
        self
    }

    /// Sets the image deriver; its registry retry policy also paces failed passes.
    pub fn with_deriver(mut self, deriver: ImageDeriver) -> Self {
        self.retry = deriver.settings().retry.clone();
        self.deriver = Some(deriver);
        self
    }

    /// Sets the mode.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Consecutive failed passes so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// One idempotent pass; see the module docs.
pub async fn reconcile(view: Arc<PluginConfig>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    reconcile_pass(&view, &ctx).await.map(Action::requeue)
}

/// Requeue with exponential backoff in the number of consecutive failures.
pub fn error_policy(_view: Arc<PluginConfig>, error: &Error, ctx: Arc<Ctx>) -> Action {
    Action::requeue(failure_delay(error, &ctx))
}

fn failure_delay(error: &Error, ctx: &Ctx) -> Duration {
    let failures = ctx
        .failures
        .fetch_add(1, Ordering::Relaxed)
        .saturating_add(1);
    ctx.metrics.reconcile_failures.inc();
    let delay = ctx.retry.requeue_after(failures);
    warn!(error = %error, failures, ?delay, "rollout reconcile failed; requeueing");
    delay
}

async fn reconcile_pass(view: &PluginConfig, ctx: &Ctx) -> Result<Duration, Error> {
    let span = info_span!("rollout_reconcile", generation = view.generation);
    async move {
        let groups = view.groups()?;
        let mut new_images = BTreeMap::new();
        let mut failures: Vec<DeriveError> = Vec::new();
        if let (Some(deriver), Mode::Apply) = (&ctx.deriver, &ctx.mode) {
            for group in &groups {
                if !deriver.needs_derivation(view, group).map_err(|e| match e {
                    DeriveError::Config(c) => Error::Config(c),
                    other => Error::Derive { failed: 1, first: Box::new(other) },
                })? {
                    continue;
                }
                match deriver.derive_with_retry(view, group, ctx.kube.as_ref()).await {
                    Ok(image) => {
                        new_images.insert(group.name.clone(), image);
                    }
                    Err(e) => {
                        error!(group = %group.name, error = %e, "plugin image derivation failed; configuration unchanged");
                        failures.push(e);
                    }
                }
            }
        }
        let mut effective = view.clone();
        if !new_images.is_empty() {
            ctx.recorder
                .record(view.generation, &new_images)
                .map_err(Error::Record)?;
            effective.images.extend(new_images);
        }
        match &ctx.mode {
            Mode::DryRun(sink) => {
                let mut out = String::new();
                if let Some(deriver) = &ctx.deriver {
                    for group in &groups {
                        if deriver.needs_derivation(view, group).unwrap_or(true) {
                            out.push_str(&format!(
                                "# group {}: configuration changed; an image would be derived and pushed\n",
                                group.name
                            ));
                        }
                    }
                }
                // The template is read when there is a cluster to read it from.
                let template = match &ctx.kube {
                    Some(client) => crate::template::fetch(client, &ctx.settings)
                        .await
                        .map_err(ApplyError::from)?,
                    None => None,
                };
                out.push_str(&render_yaml_from(&effective, &ctx.settings, template.as_ref())?);
                sink(&out);
            }
            Mode::Apply => {
                let client = ctx.kube.as_ref().ok_or(Error::NoClient)?;
                let report = apply(client, &effective, &ctx.settings, &ctx.metrics).await?;
                info!(applied = report.applied.len(), deleted = report.deleted.len(), "plugin DaemonSets reconciled");
            }
        }
        let failed = failures.len();
        if let Some(first) = failures.into_iter().next() {
            return Err(Error::Derive {
                failed,
                first: Box::new(first),
            });
        }
        ctx.failures.store(0, Ordering::Relaxed);
        Ok(ctx.resync)
    }
    .instrument(span)
    .await
}

/// Reconciles every new view from `views` and on requeue until `shutdown` completes or the
/// sender is dropped. Run it on the lease holder only.
pub async fn run(
    mut views: tokio::sync::watch::Receiver<Arc<PluginConfig>>,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let view = views.borrow_and_update().clone();
        let delay = match reconcile_pass(&view, &ctx).await {
            Ok(d) => d,
            Err(e) => failure_delay(&e, &ctx),
        };
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(delay) => {}
            changed = views.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::mk_view;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<u64>>);

    impl ImageRecorder for Recorded {
        fn record(
            &self,
            generation: u64,
            _: &BTreeMap<String, DerivedImage>,
        ) -> Result<(), RecordError> {
            self.0.lock().map_err(|e| e.to_string())?.push(generation);
            Ok(())
        }
    }

    fn dry_ctx(out: Arc<Mutex<String>>) -> Arc<Ctx> {
        let sink: DryRunSink = Arc::new(move |s: &str| out.lock().unwrap().push_str(s));
        Arc::new(
            Ctx::new(
                RolloutSettings::default(),
                Arc::new(Recorded::default()),
                RolloutMetrics::default(),
            )
            .with_mode(Mode::DryRun(sink)),
        )
    }

    #[tokio::test]
    async fn dry_run_prints_manifests_and_requeues_after_resync() {
        let out = Arc::new(Mutex::new(String::new()));
        let ctx = dry_ctx(out.clone());
        let mut view = mk_view();
        view.images.insert(
            "amd".into(),
            DerivedImage {
                reference: "r/p@sha256:1".into(),
                digest: "sha256:1".into(),
                tag: "amd-g1".into(),
                generation: 1,
                base_image: "b".into(),
                config_layer_diff_id: "sha256:2".into(),
            },
        );
        let action = reconcile(Arc::new(view), ctx.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(300)));
        let text = out.lock().unwrap().clone();
        assert_eq!(text.matches("kind: DaemonSet").count(), 1);
        assert!(text.contains("name: kudos-device-plugin-amd\n"));
        assert!(text.contains("# group nvidia: no derived image yet"));
    }

    #[tokio::test]
    async fn dry_run_with_a_deriver_names_images_it_would_push_and_pushes_nothing() {
        let out = Arc::new(Mutex::new(String::new()));
        let sink_out = out.clone();
        let sink: DryRunSink = Arc::new(move |s: &str| sink_out.lock().unwrap().push_str(s));
        let recorder = Arc::new(Recorded::default());
        // Port 1 on loopback: any push attempt would fail the pass.
        let deriver = ImageDeriver::new(
            crate::RegistrySettings {
                base_image: "127.0.0.1:1/kudos/device-plugin:base".into(),
                repository: "127.0.0.1:1/kudos/device-plugin-derived".into(),
                plain_http: crate::PlainHttp::Loopback,
                credentials: Default::default(),
                retry: RetryPolicy::default(),
                connect_timeout: Duration::from_secs(1),
                read_timeout: Duration::from_secs(1),
            },
            RolloutMetrics::default(),
        )
        .unwrap();
        let ctx = Arc::new(
            Ctx::new(
                RolloutSettings::default(),
                recorder.clone(),
                RolloutMetrics::default(),
            )
            .with_deriver(deriver)
            .with_mode(Mode::DryRun(sink)),
        );
        reconcile(Arc::new(mk_view()), ctx).await.unwrap();
        let text = out.lock().unwrap().clone();
        for g in ["amd", "amd-nvidia", "nvidia"] {
            assert!(
                text.contains(&format!("# group {g}: configuration changed")),
                "{text}"
            );
        }
        assert!(recorder.0.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn error_policy_backs_off_and_success_resets() {
        let ctx = dry_ctx(Arc::new(Mutex::new(String::new())));
        let view = Arc::new(mk_view());
        let err = Error::NoClient;
        let delays: Vec<Action> = (0..3)
            .map(|_| error_policy(view.clone(), &err, ctx.clone()))
            .collect();
        assert_eq!(
            delays,
            [1, 2, 4].map(|s| Action::requeue(Duration::from_secs(s)))
        );
        assert_eq!(ctx.consecutive_failures(), 3);
        reconcile(view, ctx.clone()).await.unwrap();
        assert_eq!(ctx.consecutive_failures(), 0);
    }

    #[tokio::test]
    async fn run_reconciles_each_new_view_until_shutdown() {
        let (out_tx, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let sink: DryRunSink = Arc::new(move |s: &str| {
            let _ = out_tx.send(s.to_string());
        });
        let ctx = Arc::new(
            Ctx::new(
                RolloutSettings::default(),
                Arc::new(Recorded::default()),
                RolloutMetrics::default(),
            )
            .with_mode(Mode::DryRun(sink)),
        );
        let (views, rx) = tokio::sync::watch::channel(Arc::new(mk_view()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(rx, ctx, async {
            let _ = stopped.await;
        }));
        let first = out_rx.recv().await.unwrap();
        assert_eq!(first.matches("no derived image yet").count(), 3);
        let mut v = mk_view();
        v.generation += 1;
        v.images.insert(
            "nvidia".into(),
            DerivedImage {
                reference: "r/p@sha256:1".into(),
                digest: "sha256:1".into(),
                tag: "nvidia-g8".into(),
                generation: 8,
                base_image: "b".into(),
                config_layer_diff_id: "sha256:2".into(),
            },
        );
        views.send(Arc::new(v)).unwrap();
        let second = out_rx.recv().await.unwrap();
        assert!(second.contains("name: kudos-device-plugin-nvidia\n"));
        stop.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn apply_mode_without_client_fails_typed() {
        let ctx = Arc::new(Ctx::new(
            RolloutSettings::default(),
            Arc::new(Recorded::default()),
            RolloutMetrics::default(),
        ));
        let err = reconcile(Arc::new(mk_view()), ctx).await.unwrap_err();
        assert!(matches!(err, Error::NoClient));
        let mut bad = mk_view();
        bad.unified_resource_name = "x".into();
        let ctx = dry_ctx(Arc::new(Mutex::new(String::new())));
        assert!(matches!(
            reconcile(Arc::new(bad), ctx).await,
            Err(Error::Config(_))
        ));
    }
}
