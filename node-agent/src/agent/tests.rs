use super::*;
use crate::attribution::tests::{FakeKubelet, pod, serve, serve_stoppable};
use crate::attribution::{PodResources, StaticAssignments};
use crate::podmeta::{ContainerTimes, NoPodMeta, PodMeta, PodMetaStore};
use crate::runs::RunConfig;
use crate::sample::{FakeGpus, GpuBackend};
use kudos_nvml::fake::FakeNvml;

const PERIOD: Duration = Duration::from_millis(100);

async fn tick_for<A: AssignmentSource>(agent: &mut Agent<A>, d: Duration) {
    for _ in 0..d.as_millis() / PERIOD.as_millis() {
        agent.tick().await;
        tokio::time::sleep(PERIOD).await;
    }
}

/// A tracker that ends a run at the first listing that lacks it (no grace period).
/// `ml/train` (class `resnet50`) with one container, `main`, started and finished as given.
fn train_meta(first_start_ms: Option<i64>, finished_ms: Option<i64>, ended: bool) -> PodMeta {
    PodMeta {
        uid: "uid-1".into(),
        class: "resnet50".into(),
        ended,
        containers: [(
            "main".to_owned(),
            ContainerTimes {
                first_start_ms,
                finished_ms,
                restarts: 0,
            },
        )]
        .into(),
        ..Default::default()
    }
}

fn tracker() -> RunTracker {
    tracker_with_grace(Duration::ZERO)
}

fn tracker_with_grace(end_grace: Duration) -> RunTracker {
    RunTracker::new(RunConfig {
        node: "node-a".into(),
        busy_threshold_percent: 10.0,
        period: PERIOD,
        progress_period: None,
        end_grace,
    })
}

/// Assigned (image pull) → container started, busy → container finished → released through a
/// kubelet stand-in, with `set(device, util, memory)` changing the GPUs under the running agent
/// and the pod's status telling when the container ran.
async fn scenario(
    backend: Arc<dyn GpuBackend>,
    u0: String,
    model: &str,
    mut set: impl FnMut(usize, u32, u64),
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    serve(kubelet.clone(), &sock);
    let sampler = Sampler::new(backend, Duration::from_secs(1))
        .await
        .expect("sampler");
    let pr = PodResources::new(&sock, vec!["kudos.dev/gpu".into()], Duration::from_secs(1));
    let meta = PodMetaStore::default();
    let status = |first_start_ms, finished_ms| train_meta(first_start_ms, finished_ms, false);
    meta.apply("ml", "train", status(None, None));
    let outbox = Arc::new(Outbox::open(&dir.path().join("outbox"), 1000).expect("outbox"));
    let metrics = Metrics::new("node-a");
    let health = Arc::new(DeviceHealth::default());
    let mut agent = Agent::new(
        "node-a".into(),
        sampler,
        pr,
        Arc::new(meta.clone()),
        tracker(),
        outbox.clone(),
        metrics.clone(),
        health.clone(),
    );

    let t0 = Instant::now();
    let held = format!("nv-{u0}");
    *kubelet.pods.lock().expect("lock") = vec![pod(
        "ml",
        "train",
        &[("main", "kudos.dev/gpu", &[held.as_str()])],
    )];
    // The devices are allocated while the image is pulled; then the container starts.
    tick_for(&mut agent, Duration::from_millis(300)).await;
    let started = crate::now_ms();
    meta.apply("ml", "train", status(Some(started), None));
    set(0, 95, 3 << 30);
    set(1, 95, 1 << 30); // busy, but not this pod's device
    let busy_start = Instant::now();
    tick_for(&mut agent, Duration::from_millis(1000)).await;
    set(0, 0, 0);
    let busy = busy_start.elapsed();
    let finished = crate::now_ms();
    meta.apply("ml", "train", status(Some(started), Some(finished)));
    tick_for(&mut agent, Duration::from_millis(300)).await;
    assert!(
        metrics
            .render()
            .contains(r#"pod="train",namespace="ml",container="main""#)
    );
    assert_eq!(health.healthy.load(Ordering::Relaxed), 2);
    kubelet.pods.lock().expect("lock").clear();
    tick_for(&mut agent, Duration::from_millis(300)).await;
    let total = t0.elapsed();

    let reports = outbox.pending(None, 100).expect("pending");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0].1;
    assert_eq!(r.state, RunState::Completed as i32);
    assert_eq!(r.device_ids, vec![held.clone()]);
    assert_eq!(r.device_models, vec![model]);
    let who = (r.pod_uid.as_str(), r.class.as_str(), r.node.as_str());
    assert_eq!(who, ("uid-1", "resnet50", "node-a"));
    // Real clocks on a shared machine: ticks can be late, so allow three periods here; the
    // one-period bound is asserted with a controlled clock in `runs::tests`.
    let slack = PERIOD.as_secs_f64() * 3.0;
    let err = (r.gpu_busy_seconds - busy.as_secs_f64()).abs();
    assert!(err <= slack, "busy {} vs {busy:?}", r.gpu_busy_seconds);
    assert_eq!(r.peak_memory_bytes, 3 << 30);
    assert_eq!(r.peak_utilization_percent, 95.0);
    assert!(r.energy_joules > 0.0);
    // The container's own run time, not the devices' whole allocation (~1.9 s here).
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (started, finished));
    let dur = (r.end_unix_ms - r.start_unix_ms) as f64 / 1000.0;
    assert!(
        dur < total.as_secs_f64() - 0.5,
        "duration {dur} of {total:?}"
    );
    let ended = r#"kudos_runs_ended_total{state="completed",time_source="container"} 1"#;
    assert!(metrics.render().contains(ended), "{}", metrics.render());
    assert!(
        !metrics.render().contains(r#"pod="train""#),
        "labels follow the release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_kubelet_api_with_in_memory_gpus() {
    let fake = Arc::new(FakeGpus::new(2));
    let f = fake.clone();
    scenario(
        fake,
        FakeGpus::uuid(0),
        "Kudos Fake GPU 80GB",
        move |i, util, mem| {
            f.set(&FakeGpus::uuid(i as u32), f64::from(util), mem);
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_kubelet_api_with_the_fake_nvml_library() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = FakeNvml::new(dir.path(), 2).expect("fake nvml");
    let backend = crate::nvml::NvmlBackend::new(Some(fake.library())).expect("nvml");
    let u0 = fake.devices[0].uuid.clone();
    scenario(
        Arc::new(backend),
        u0,
        "NVIDIA H100 80GB HBM3",
        move |i, util, mem| {
            fake.devices[i].gpu_utilization_percent = util;
            fake.devices[i].memory_used_bytes = mem;
            fake.write().expect("write fake config");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_outbox_refuses_a_completed_run_with_an_error_metric() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outbox = Arc::new(Outbox::open(dir.path(), 1).expect("outbox"));
    let old = RunReport {
        report_id: "old".into(),
        state: RunState::Completed as i32,
        ..Default::default()
    };
    outbox.push(&[old]).expect("fill");
    let gpus = Arc::new(FakeGpus::new(1));
    let sampler = Sampler::new(gpus, Duration::from_secs(1))
        .await
        .expect("sampler");
    let assignments = StaticAssignments::default();
    let metrics = Metrics::new("node-a");
    let mut agent = Agent::new(
        "node-a".into(),
        sampler,
        assignments,
        Arc::new(NoPodMeta),
        tracker(),
        outbox.clone(),
        metrics.clone(),
        Arc::new(DeviceHealth::default()),
    );
    agent.assignments.set(vec![Assignment {
        namespace: "ml".into(),
        pod: "p".into(),
        container: "c".into(),
        device_ids: vec![FakeGpus::uuid(0)],
    }]);
    agent.tick().await;
    agent.assignments.set(vec![]);
    agent.tick().await;
    let text = metrics.render();
    let line = r#"kudos_outbox_dropped_reports_total{state="completed",reason="full"} 1"#;
    assert!(text.contains(line), "{text}");
    let ended = r#"kudos_runs_ended_total{state="completed",time_source="allocation"} 1"#;
    assert!(text.contains(ended), "{text}");
    // What was stored before is untouched.
    let kept = outbox.pending(None, 10).expect("pending");
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].1.report_id, "old");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_survives_an_agent_restart_under_the_same_run_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = Arc::new(FakeGpus::new(1));
    gpus.set(&FakeGpus::uuid(0), 90.0, 1 << 30);
    let held = vec![Assignment {
        namespace: "ml".into(),
        pod: "p".into(),
        container: "c".into(),
        device_ids: vec![format!("nv-{}", FakeGpus::uuid(0))],
    }];
    let start = |outbox: Arc<Outbox>| {
        let gpus = gpus.clone();
        async move {
            let sampler = Sampler::new(gpus, Duration::from_secs(1))
                .await
                .expect("sampler");
            Agent::new(
                "node-a".into(),
                sampler,
                StaticAssignments::default(),
                Arc::new(NoPodMeta),
                tracker(),
                outbox,
                Metrics::new("node-a"),
                Arc::new(DeviceHealth::default()),
            )
        }
    };
    let first_run_id;
    {
        let outbox = Arc::new(Outbox::open(dir.path(), 100).expect("outbox"));
        let mut agent = start(outbox).await;
        agent.assignments.set(held.clone());
        tick_for(&mut agent, Duration::from_millis(500)).await;
        first_run_id = agent.tracker.active_snapshots(0)[0].run_id.clone();
        // SIGTERM path: the loop saves the active runs and the process exits.
        let (stop_tx, stop) = watch::channel(true);
        agent.run(PERIOD, stop).await;
        drop(stop_tx);
    }
    let outbox = Arc::new(Outbox::open(dir.path(), 100).expect("reopen"));
    let mut agent = start(outbox.clone()).await;
    agent.assignments.set(held);
    tick_for(&mut agent, Duration::from_millis(300)).await;
    agent.assignments.set(vec![]);
    agent.tick().await;
    let reports = outbox.pending(None, 10).expect("pending");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0].1;
    assert_eq!(r.run_id, first_run_id, "the resumed run keeps its identity");
    assert_eq!(r.state, RunState::Completed as i32);
    assert!(
        r.gpu_busy_seconds >= 0.5,
        "busy time before the restart is kept: {}",
        r.gpu_busy_seconds
    );
}

/// A kubelet restart while a job runs (issue 13, measured on real kubelets v1.37.2): the
/// PodResources socket goes away, then the restarted kubelet answers `List` before it has
/// re-synced its pods (without the running pod), then lists it again; later the container
/// finishes. One run, one report, timed by the container where its status is known
/// (`with_meta`), else by the ticks that saw the devices held and released.
async fn kubelet_restart_mid_run(with_meta: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    let held = format!("nv-{}", FakeGpus::uuid(0));
    let listed = vec![pod(
        "ml",
        "train",
        &[("main", "kudos.dev/gpu", &[held.as_str()])],
    )];
    *kubelet.pods.lock().expect("lock") = listed.clone();
    let serving = serve_stoppable(kubelet.clone(), &sock);
    let gpus = Arc::new(FakeGpus::new(1));
    gpus.set(&FakeGpus::uuid(0), 90.0, 1 << 30);
    let sampler = Sampler::new(gpus, Duration::from_secs(1))
        .await
        .expect("sampler");
    let pr = PodResources::new(&sock, vec!["kudos.dev/gpu".into()], Duration::from_secs(1));
    let store = PodMetaStore::default();
    let status = |first_start_ms, finished_ms: Option<i64>| {
        train_meta(first_start_ms, finished_ms, finished_ms.is_some())
    };
    let meta: Arc<dyn PodMetaSource> = if with_meta {
        Arc::new(store.clone())
    } else {
        Arc::new(NoPodMeta)
    };
    let outbox = Arc::new(Outbox::open(&dir.path().join("outbox"), 1000).expect("outbox"));
    let metrics = Metrics::new("node-a");
    let mut agent = Agent::new(
        "node-a".into(),
        sampler,
        pr,
        meta,
        // Ten periods: the restart's listing without the pod is within it, the release is not.
        tracker_with_grace(PERIOD * 10),
        outbox.clone(),
        metrics.clone(),
        Arc::new(DeviceHealth::default()),
    );

    let started = crate::now_ms();
    store.apply("ml", "train", status(Some(started), None));
    tick_for(&mut agent, Duration::from_millis(300)).await;
    // The kubelet stops: its socket goes away.
    serving.stop().await;
    tick_for(&mut agent, Duration::from_millis(300)).await;
    assert!(
        metrics.podresources_errors.get() > 0,
        "PodResources failed while the kubelet was down"
    );
    // It is back, and its first listings lack the pod.
    kubelet.pods.lock().expect("lock").clear();
    let serving = serve_stoppable(kubelet.clone(), &sock);
    tick_for(&mut agent, Duration::from_millis(200)).await;
    // Re-synced: the pod and its device are listed again.
    *kubelet.pods.lock().expect("lock") = listed;
    tick_for(&mut agent, Duration::from_millis(300)).await;
    // The container finishes; the kubelet releases the device.
    let finished = crate::now_ms();
    store.apply("ml", "train", status(Some(started), Some(finished)));
    kubelet.pods.lock().expect("lock").clear();
    let released = crate::now_ms();
    tick_for(&mut agent, Duration::from_millis(1500)).await;
    serving.stop().await;

    let reports = outbox.pending(None, 100).expect("pending");
    let summary: Vec<_> = reports
        .iter()
        .map(|(_, r)| (r.run_id.as_str(), r.state, r.start_unix_ms, r.end_unix_ms))
        .collect();
    assert_eq!(reports.len(), 1, "one run, one report: {summary:#?}");
    let r = &reports[0].1;
    assert_eq!(r.state, RunState::Completed as i32);
    if with_meta {
        assert_eq!((r.start_unix_ms, r.end_unix_ms), (started, finished));
    } else {
        // Timed by the ticks: the end is the first listing without the pod after the restart,
        // within a few (late) periods of the release.
        let late = i64::try_from(PERIOD.as_millis()).expect("ms") * 4;
        assert!(r.start_unix_ms <= started + late, "{summary:?}");
        let end = r.end_unix_ms;
        assert!(
            end >= released && end <= released + late,
            "{summary:?} released {released}"
        );
    }
    // The device was busy throughout, the restart included.
    let wall = (r.end_unix_ms - r.start_unix_ms) as f64 / 1000.0;
    assert!(
        r.gpu_busy_seconds >= wall * 0.6,
        "busy {} of {wall}",
        r.gpu_busy_seconds
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_does_not_split_a_run_timed_by_its_container() {
    kubelet_restart_mid_run(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restart_does_not_split_a_run_without_pod_metadata() {
    kubelet_restart_mid_run(false).await;
}
