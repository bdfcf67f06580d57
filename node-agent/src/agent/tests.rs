use super::*;
use crate::attribution::PodResources;
use crate::attribution::tests::{FakeKubelet, pod, serve};
use crate::podmeta::{PodMeta, PodMetaStore};
use crate::runs::RunConfig;
use crate::sample::FakeGpus;

async fn tick_for(agent: &mut Agent<PodResources>, d: Duration, period: Duration) {
    for _ in 0..d.as_millis() / period.as_millis() {
        agent.tick().await;
        tokio::time::sleep(period).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigned_busy_released_through_the_kubelet_api_gives_one_completed_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    serve(kubelet.clone(), &sock);
    let fake = Arc::new(FakeGpus::new(2));
    let (u0, u1) = (FakeGpus::uuid(0), FakeGpus::uuid(1));
    let period = Duration::from_millis(100);
    let sampler = Sampler::new(fake.clone(), Duration::from_millis(50))
        .await
        .expect("sampler");
    let pr = PodResources::new(&sock, vec!["kudos.dev/gpu".into()], Duration::from_secs(1))
        .expect("client");
    let meta = PodMetaStore::default();
    meta.apply(
        "ml",
        "train",
        PodMeta {
            uid: "uid-1".into(),
            class: "resnet50".into(),
            ..Default::default()
        },
    );
    let outbox = Arc::new(Outbox::open(&dir.path().join("outbox"), 1000).expect("outbox"));
    let metrics = Metrics::new("node-a");
    let tracker = RunTracker::new(RunConfig {
        node: "node-a".into(),
        busy_threshold_percent: 10.0,
        period,
        progress_period: None,
    });
    let health = Arc::new(DeviceHealth::default());
    let mut agent = Agent::new(
        "node-a".into(),
        sampler,
        pr,
        Arc::new(meta),
        tracker,
        outbox.clone(),
        metrics.clone(),
        health.clone(),
    );

    let t0 = Instant::now();
    *kubelet.pods.lock().expect("lock") = vec![pod(
        "ml",
        "train",
        &[("main", "kudos.dev/gpu", &[&format!("nv-{u0}")])],
    )];
    tick_for(&mut agent, Duration::from_millis(300), period).await;
    fake.set(&u0, 95.0, 3 << 30);
    fake.set(&u1, 95.0, 1 << 30); // busy, but not this pod's device
    let busy_start = Instant::now();
    tick_for(&mut agent, Duration::from_millis(1000), period).await;
    fake.set(&u0, 0.0, 0);
    let busy = busy_start.elapsed();
    tick_for(&mut agent, Duration::from_millis(300), period).await;
    assert!(
        metrics
            .render()
            .contains(r#"pod="train",namespace="ml",container="main""#)
    );
    assert_eq!(health.healthy.load(Ordering::Relaxed), 2);
    kubelet.pods.lock().expect("lock").clear();
    tick_for(&mut agent, Duration::from_millis(300), period).await;
    let total = t0.elapsed();

    let reports = outbox.pending(None, 100).expect("pending");
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0].1;
    assert_eq!(r.state, RunState::Completed as i32);
    assert_eq!(r.device_ids, vec![format!("nv-{u0}")]);
    assert_eq!(r.device_models, vec!["Kudos Fake GPU 80GB"]);
    assert_eq!(
        (r.pod_uid.as_str(), r.class.as_str(), r.node.as_str()),
        ("uid-1", "resnet50", "node-a")
    );
    // Busy time within one period (plus scheduling slack of the shared test machine).
    let slack = period.as_secs_f64() * 1.5;
    assert!(
        (r.gpu_busy_seconds - busy.as_secs_f64()).abs() <= slack,
        "busy {} vs {:?}",
        r.gpu_busy_seconds,
        busy
    );
    assert_eq!(r.peak_memory_bytes, 3 << 30);
    let dur = (r.end_unix_ms - r.start_unix_ms) as f64 / 1000.0;
    assert!(
        dur <= total.as_secs_f64() + 0.1 && dur >= 1.5,
        "duration {dur}"
    );
    assert!(
        !metrics.render().contains(r#"pod="train""#),
        "labels follow the release"
    );
}
