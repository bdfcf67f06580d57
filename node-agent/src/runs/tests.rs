use super::*;
use crate::podmeta::{NoPodMeta, PodMetaStore};
use crate::sample::{DeviceInfo, SampleError};

const PERIOD_MS: i64 = 1000;

fn cfg(progress: Option<u64>) -> RunConfig {
    RunConfig {
        node: "node-a".into(),
        busy_threshold_percent: 10.0,
        period: Duration::from_millis(PERIOD_MS as u64),
        progress_period: progress.map(Duration::from_secs),
        // These tests end a run at the first listing that lacks it; the grace has its own.
        end_grace: Duration::ZERO,
    }
}

fn cfg_grace(grace_s: u64) -> RunConfig {
    RunConfig {
        end_grace: Duration::from_secs(grace_s),
        ..cfg(None)
    }
}

fn reading(uuid: &str, util: f64) -> DeviceReading {
    DeviceReading {
        info: DeviceInfo {
            index: 0,
            uuid: uuid.into(),
            model: "H100".into(),
            memory_total_bytes: 80 << 30,
        },
        result: Ok(DeviceSample {
            gpu_util_percent: util,
            memory_used_bytes: (util as u64) << 20,
            power_watts: Some(100.0),
            ..Default::default()
        }),
    }
}

fn assign(ids: &[&str]) -> Vec<Assignment> {
    vec![Assignment {
        namespace: "ml".into(),
        pod: "train".into(),
        container: "main".into(),
        device_ids: ids.iter().map(|s| (*s).into()).collect(),
    }]
}

/// Drives `ticks` of (assigned?, util of device a, util of device b); returns all reports.
fn drive(
    t: &mut RunTracker,
    meta: &dyn PodMetaSource,
    ticks: &[(bool, f64, f64)],
) -> Vec<RunReport> {
    let mut out = Vec::new();
    for (i, (assigned, ua, ub)) in ticks.iter().enumerate() {
        let a = if *assigned {
            assign(&["nv-GPU-a", "GPU-b"])
        } else {
            vec![]
        };
        let r = [reading("GPU-a", *ua), reading("GPU-b", *ub)];
        out.extend(t.observe(i as i64 * PERIOD_MS, &a, meta, &r).reports);
    }
    out
}

#[test]
fn assigned_busy_released_gives_one_completed_report_with_busy_time() {
    let mut t = RunTracker::new(cfg(None));
    // 3 idle ticks, 10 busy ticks (only one device busy), 2 idle, then released.
    let mut ticks = vec![(true, 0.0, 0.0); 4];
    ticks.extend(vec![(true, 0.0, 90.0); 10]);
    ticks.extend(vec![(true, 0.0, 0.0); 2]);
    ticks.extend(vec![(false, 0.0, 0.0); 3]);
    let reports = drive(&mut t, &NoPodMeta, &ticks);
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0];
    assert_eq!(r.state, RunState::Completed as i32);
    assert!(
        (r.gpu_busy_seconds - 10.0).abs() <= 1.0,
        "busy {}",
        r.gpu_busy_seconds
    );
    assert_eq!(r.device_ids, vec!["GPU-b", "nv-GPU-a"]);
    assert_eq!(r.device_models, vec!["H100", "H100"]);
    assert_eq!(r.start_unix_ms, 0);
    assert_eq!(r.end_unix_ms, 16 * PERIOD_MS);
    assert_eq!(r.peak_utilization_percent, 90.0);
    assert!((r.mean_utilization_percent - 90.0 * 10.0 / 32.0).abs() < 1e-9);
    assert_eq!(r.peak_memory_bytes, 90 << 20);
    assert!(
        (r.energy_joules - 2.0 * 100.0 * 16.0).abs() < 1e-6,
        "energy {}",
        r.energy_joules
    );
    assert_eq!(r.node, "node-a");
    assert_eq!(r.class, "", "a pod without a class is still reported");
    assert_eq!(t.active(), 0);
}

#[test]
fn long_runs_emit_snapshots_with_one_run_id_and_unique_report_ids() {
    let mut t = RunTracker::new(cfg(Some(5)));
    let mut ticks = vec![(true, 50.0, 50.0); 13];
    ticks.push((false, 0.0, 0.0));
    let reports = drive(&mut t, &NoPodMeta, &ticks);
    let states: Vec<i32> = reports.iter().map(|r| r.state).collect();
    let ip = RunState::InProgress as i32;
    assert_eq!(states, vec![ip, ip, RunState::Completed as i32]);
    assert!(reports.iter().all(|r| r.run_id == reports[0].run_id));
    let ids: HashSet<&str> = reports.iter().map(|r| r.report_id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    // Snapshots grow monotonically so the orchestrator can extrapolate.
    assert!((reports[0].gpu_busy_seconds - 5.0).abs() <= 1.0);
    assert!((reports[1].gpu_busy_seconds - 10.0).abs() <= 1.0);
}

#[test]
fn failed_pod_ends_its_run_once_as_failed_with_metadata() {
    let store = PodMetaStore::default();
    // Pod ml/train (uid u1) of class bert, as its metadata changes.
    let train = |meta: PodMeta| {
        let meta = PodMeta {
            uid: "u1".into(),
            class: "bert".into(),
            ..meta
        };
        store.apply("ml", "train", meta);
    };
    train(PodMeta {
        work: Some(10.0),
        ..Default::default()
    });
    let mut t = RunTracker::new(cfg(None));
    let mut reports = drive(&mut t, &store, &[(true, 80.0, 80.0); 3]);
    train(PodMeta {
        failed: true,
        ended: true,
        ..Default::default()
    });
    // The kubelet still lists the devices for a while after the pod failed.
    for i in 3..6 {
        let r = [reading("GPU-a", 0.0), reading("GPU-b", 0.0)];
        reports.extend(
            t.observe(i * PERIOD_MS, &assign(&["nv-GPU-a", "GPU-b"]), &store, &r)
                .reports,
        );
    }
    assert_eq!(reports.len(), 1, "{reports:#?}");
    assert_eq!(reports[0].state, RunState::Failed as i32);
    assert_eq!(
        (reports[0].pod_uid.as_str(), reports[0].class.as_str()),
        ("u1", "bert")
    );
    assert_eq!(t.active(), 0);
}

#[test]
fn a_failed_device_sample_is_skipped_not_fatal() {
    let mut t = RunTracker::new(cfg(None));
    let a = assign(&["GPU-a"]);
    let bad = DeviceReading {
        result: Err(SampleError::Timeout),
        ..reading("GPU-a", 0.0)
    };
    t.observe(0, &a, &NoPodMeta, &[reading("GPU-a", 90.0)]);
    t.observe(1000, &a, &NoPodMeta, &[bad]);
    t.observe(2000, &a, &NoPodMeta, &[reading("GPU-a", 90.0)]);
    let r = t
        .observe(3000, &[], &NoPodMeta, &[reading("GPU-a", 0.0)])
        .reports;
    assert_eq!(r[0].sample_count, 2);
    assert!((r[0].gpu_busy_seconds - 1.0).abs() < 1e-9);
}

#[test]
fn restored_runs_keep_their_identity_and_totals() {
    let mut t = RunTracker::new(cfg(None));
    drive(&mut t, &NoPodMeta, &[(true, 90.0, 0.0); 6]);
    let saved = t.active_snapshots(5000);
    let mut t2 = RunTracker::new(cfg(None));
    t2.restore(saved.clone());
    let a = assign(&["nv-GPU-a", "GPU-b"]);
    let r = [reading("GPU-a", 90.0), reading("GPU-b", 0.0)];
    // The first tick after a restart does not book the downtime.
    t2.observe(60_000, &a, &NoPodMeta, &r);
    let end = t2.observe(61_000, &[], &NoPodMeta, &r).reports;
    assert_eq!(end.len(), 1);
    assert_eq!(end[0].run_id, saved[0].run_id);
    assert_eq!(end[0].state, RunState::Completed as i32);
    assert!(
        (end[0].gpu_busy_seconds - 6.0).abs() <= 1.0,
        "{}",
        end[0].gpu_busy_seconds
    );

    // A restored run already gone at the first tick ended at an unknown time.
    let mut t3 = RunTracker::new(cfg(None));
    t3.restore(saved);
    let gone = t3.observe(60_000, &[], &NoPodMeta, &r).reports;
    assert_eq!(gone[0].state, RunState::Failed as i32);
}

/// Wall-clock base for the timing tests: the API's times are absolute.
const T0: i64 = 1_700_000_000_000;

fn times(first_start_ms: Option<i64>, finished_ms: Option<i64>, restarts: i32) -> ContainerTimes {
    ContainerTimes {
        first_start_ms,
        finished_ms,
        restarts,
    }
}

/// Pod ml/train whose container `main` has status `c` (none: no status yet).
fn pod_with(store: &PodMetaStore, c: Option<ContainerTimes>, ended: bool) {
    let meta = PodMeta {
        uid: "u1".into(),
        class: "bert".into(),
        ended,
        containers: c.map(|c| ("main".to_owned(), c)).into_iter().collect(),
        ..Default::default()
    };
    store.apply("ml", "train", meta);
}

/// Devices allocated at T0, image pulled until the container starts at T0+5 s, GPU busy until
/// it finishes at T0+8 s; at T0+8 s the pod is seen ended (`tell(s)` sets the metadata before
/// tick `s`) and, when `release`, the kubelet no longer lists the devices. Returns the last
/// tick's output.
fn pull_then_compute(
    t: &mut RunTracker,
    meta: &dyn PodMetaSource,
    release: bool,
    mut tell: impl FnMut(i64),
) -> TickOutput {
    let a = assign(&["GPU-a"]);
    for s in 0..8 {
        tell(s);
        let util = if s >= 5 { 90.0 } else { 0.0 };
        let out = t.observe(T0 + s * 1000, &a, meta, &[reading("GPU-a", util)]);
        assert!(out.reports.is_empty(), "tick {s}: {:#?}", out.reports);
    }
    tell(8);
    let a = if release { vec![] } else { a };
    t.observe(T0 + 8000, &a, meta, &[reading("GPU-a", 0.0)])
}

/// The status of a container that started at T0+5 s, as the pod watch sees it over time.
fn started_at_5_finished_at_8(store: &PodMetaStore) -> impl FnMut(i64) {
    move |s| match s {
        0..5 => pod_with(store, None, false),
        5..8 => pod_with(store, Some(times(Some(T0 + 5000), None, 0)), false),
        _ => pod_with(
            store,
            Some(times(Some(T0 + 5000), Some(T0 + 8000), 0)),
            true,
        ),
    }
}

#[test]
fn a_run_is_timed_from_its_container_start_not_from_device_allocation() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg(None));
    let out = pull_then_compute(&mut t, &store, false, started_at_5_finished_at_8(&store));
    assert_eq!(out.reports.len(), 1, "{:#?}", out.reports);
    let r = &out.reports[0];
    assert_eq!(r.state, RunState::Completed as i32);
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0 + 5000, T0 + 8000));
    assert_eq!(
        r.end_unix_ms - r.start_unix_ms,
        3000,
        "the 5 s pull is not compute time"
    );
    assert!(
        (r.gpu_busy_seconds - 3.0).abs() < 1e-9,
        "{}",
        r.gpu_busy_seconds
    );
    assert_eq!(
        out.ended,
        vec![EndedRun {
            state: RunState::Completed,
            time_source: TimeSource::Container
        }]
    );
}

#[test]
fn without_a_container_status_a_run_is_timed_from_allocation_as_before() {
    // `--pod-metadata none`: the devices' allocation to their release, 8 s.
    let mut t = RunTracker::new(cfg(None));
    let out = pull_then_compute(&mut t, &NoPodMeta, true, |_| {});
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0, T0 + 8000));
    assert_eq!(out.ended[0].time_source, TimeSource::Allocation);

    // Pod metadata without container statuses: the same.
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg(None));
    let out = pull_then_compute(&mut t, &store, false, |s| pod_with(&store, None, s == 8));
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0, T0 + 8000));
    assert_eq!(out.ended[0].time_source, TimeSource::Allocation);
}

#[test]
fn a_pod_deleted_while_running_ends_at_the_release_tick_from_its_container_start() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg(None));
    let out = pull_then_compute(&mut t, &store, true, |s| match s {
        0..5 => pod_with(&store, None, false),
        5..8 => pod_with(&store, Some(times(Some(T0 + 5000), None, 0)), false),
        _ => store.delete("ml", "train"),
    });
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0 + 5000, T0 + 8000));
    assert_eq!((r.pod_uid.as_str(), r.class.as_str()), ("u1", "bert"));
    assert_eq!(out.ended[0].time_source, TimeSource::Container);
}

#[test]
fn snapshots_before_the_container_starts_use_allocation_then_the_container() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg(Some(3)));
    let mut tell = started_at_5_finished_at_8(&store);
    let a = assign(&["GPU-a"]);
    let mut snaps = Vec::new();
    for s in 0..=7 {
        tell(s);
        let out = t.observe(T0 + s * 1000, &a, &store, &[reading("GPU-a", 90.0)]);
        snaps.extend(out.reports);
    }
    let windows: Vec<(i64, i64)> = snaps
        .iter()
        .map(|r| (r.start_unix_ms - T0, r.end_unix_ms - T0))
        .collect();
    assert_eq!(windows, vec![(0, 3000), (5000, 6000)]);
    // The GPU was busy since allocation here, but busy time never exceeds the reported wall
    // time (the orchestrator and scheduler-core refuse such a run).
    assert!((snaps[1].gpu_busy_seconds - 1.0).abs() < 1e-9);
}

#[test]
fn a_restarted_container_counts_from_its_first_start() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg(None));
    // Started at 2 s, restarted twice; the status no longer shows the first start.
    let out = pull_then_compute(&mut t, &store, false, |s| match s {
        0..2 => pod_with(&store, None, false),
        2..5 => pod_with(&store, Some(times(Some(T0 + 2000), None, 0)), false),
        5..8 => pod_with(&store, Some(times(None, None, 2)), false),
        _ => pod_with(&store, Some(times(None, Some(T0 + 7000), 2)), true),
    });
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0 + 2000, T0 + 7000));
    assert_eq!(out.ended[0].time_source, TimeSource::Container);

    // An agent that never saw the first start cannot time the container: allocation.
    let mut t = RunTracker::new(cfg(None));
    let out = pull_then_compute(&mut t, &store, false, |s| {
        pod_with(
            &store,
            Some(times(None, (s == 8).then_some(T0 + 7000), 2)),
            s == 8,
        );
    });
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0, T0 + 8000));
    assert_eq!(out.ended[0].time_source, TimeSource::Allocation);
}

#[test]
fn a_restored_run_keeps_its_container_start() {
    let store = PodMetaStore::default();
    let mut tell = started_at_5_finished_at_8(&store);
    let a = assign(&["GPU-a"]);
    let mut t = RunTracker::new(cfg(None));
    for s in 0..7 {
        tell(s);
        t.observe(T0 + s * 1000, &a, &store, &[reading("GPU-a", 90.0)]);
    }
    let saved = t.active_snapshots(T0 + 6500);
    assert_eq!(saved[0].start_unix_ms, T0 + 5000);
    // The agent restarts; its pod watch has not listed the pods yet at the first tick.
    let mut t2 = RunTracker::new(cfg(None));
    t2.restore(saved);
    tell(7);
    t2.observe(T0 + 7000, &a, &NoPodMeta, &[reading("GPU-a", 90.0)]);
    tell(8);
    let out = t2.observe(T0 + 8000, &a, &store, &[reading("GPU-a", 0.0)]);
    let r = &out.reports[0];
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0 + 5000, T0 + 8000));
    assert_eq!(out.ended[0].time_source, TimeSource::Container);
}

#[test]
fn run_window_never_gives_a_zero_or_negative_duration() {
    let c = |s, f| times(s, f, 0);
    let w = |alloc, now, c: ContainerTimes| {
        let (s, e, src) = run_window(alloc, now, &c);
        (s - T0, e - T0, src)
    };
    use TimeSource::{Allocation as A, Container as C};
    // Started and finished in the same API second: half a second, at most what the agent saw.
    assert_eq!(
        w(T0, T0 + 3000, c(Some(T0 + 2000), Some(T0 + 2000))),
        (2000, 2500, C)
    );
    assert_eq!(
        w(T0, T0 + 2200, c(Some(T0 + 2000), Some(T0 + 2000))),
        (2000, 2200, C)
    );
    // A start at or after the tick (clock skew between the kubelet and the agent): allocation.
    assert_eq!(w(T0, T0 + 3000, c(Some(T0 + 3000), None)), (0, 3000, A));
    assert_eq!(
        w(T0, T0 + 3000, c(Some(T0 + 9000), Some(T0 + 9500))),
        (0, 3000, A)
    );
    // A finish after the tick or before the start is ignored: the tick ends the run.
    assert_eq!(
        w(T0, T0 + 3000, c(Some(T0 + 1000), Some(T0 + 4000))),
        (1000, 3000, C)
    );
    assert_eq!(
        w(T0, T0 + 3000, c(Some(T0 + 1000), Some(T0 + 500))),
        (1000, 3000, C)
    );
    // No start in the status (not started yet, or restarted more than the status shows).
    assert_eq!(w(T0, T0 + 3000, c(None, Some(T0 + 2000))), (0, 3000, A));
    // A container that started before the agent first saw its devices counts from its start.
    assert_eq!(w(T0, T0 + 3000, c(Some(T0 - 1000), None)), (-1000, 3000, C));
    // Exhaustively over a small grid: end > start whenever the tick is after allocation.
    let opts = [
        None,
        Some(-2000),
        Some(0),
        Some(999),
        Some(1000),
        Some(1500),
        Some(3000),
    ];
    for now in [1, 1000, 1500, 2000] {
        for s in opts {
            for f in opts {
                let ct = c(s.map(|x| T0 + x), f.map(|x| T0 + x));
                let (start, end, _) = run_window(T0, T0 + now, &ct);
                assert!(
                    end > start,
                    "now {now} start {s:?} finish {f:?}: {start}..{end}"
                );
                assert!(end <= T0 + now);
            }
        }
    }
}

/// What PodResources answers at one tick of the restart tests.
#[derive(Clone, Copy, Debug)]
enum Listing {
    /// The pod and its device.
    Held,
    /// A successful listing without the pod.
    Lacking,
    /// The call failed (kubelet down).
    Failed,
}

/// Feeds tick `s` (at T0 + `s` seconds, device busy) and returns its reports.
fn feed(t: &mut RunTracker, meta: &dyn PodMetaSource, s: i64, l: Listing) -> Vec<RunReport> {
    let r = [reading("GPU-a", 90.0)];
    let now = T0 + s * 1000;
    match l {
        Listing::Held => t.observe(now, &assign(&["GPU-a"]), meta, &r),
        Listing::Lacking => t.observe(now, &[], meta, &r),
        Listing::Failed => t.observe_unlisted(now, meta, &r),
    }
    .reports
}

/// The kubelet restart of issue 13 as the real kubelet (v1.37.2) does it: the pod is listed,
/// PodResources fails for two ticks, answers once without the pod (not re-synced yet), lists it
/// again, then the container finishes. Before the fix this gave two runs: one ended at the
/// listing without the pod, one started a tick later for the same pod and device.
#[test]
fn a_kubelet_restart_does_not_split_a_run_timed_by_its_container() {
    use Listing::{Failed, Held, Lacking};
    let store = PodMetaStore::default();
    let running = Some(times(Some(T0 + 1000), None, 0));
    let mut t = RunTracker::new(cfg_grace(10));
    let mut reports = Vec::new();
    let mut run_id = None;
    for (s, l) in [Held, Held, Held, Failed, Failed, Lacking, Held, Held]
        .into_iter()
        .enumerate()
    {
        pod_with(&store, if s == 0 { None } else { running }, false);
        reports.extend(feed(&mut t, &store, s as i64, l));
        let id = t.active_snapshots(T0).first().map(|r| r.run_id.clone());
        assert!(id.is_some(), "tick {s} ({l:?}): the run is open");
        assert!(run_id.is_none() || run_id == id, "tick {s}: same run");
        run_id = id;
    }
    assert!(reports.is_empty(), "{reports:#?}");
    // The container finishes at 8 s; the pod has succeeded and its device is released.
    pod_with(
        &store,
        Some(times(Some(T0 + 1000), Some(T0 + 8000), 0)),
        true,
    );
    reports.extend(feed(&mut t, &store, 8, Lacking));
    for s in 9..12 {
        reports.extend(feed(&mut t, &store, s, Lacking));
    }
    assert_eq!(reports.len(), 1, "one run, one report: {reports:#?}");
    let r = &reports[0];
    assert_eq!(Some(&r.run_id), run_id.as_ref());
    assert_eq!(r.state, RunState::Completed as i32);
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0 + 1000, T0 + 8000));
    assert!(
        (r.gpu_busy_seconds - 7.0).abs() < 1e-9,
        "busy throughout the restart"
    );
    assert_eq!(t.active(), 0);
}

/// The same restart without pod metadata: the listing without the pod starts the grace period,
/// the pod listed again continues the run; its true end is reported once the grace has passed,
/// as of the first listing that lacked it.
#[test]
fn without_metadata_a_kubelet_restart_does_not_split_a_run_either() {
    use Listing::{Failed, Held, Lacking};
    let mut t = RunTracker::new(cfg_grace(10));
    let mut reports = Vec::new();
    let ticks = [Held, Held, Held, Failed, Failed, Lacking, Held, Held];
    for (s, l) in ticks.into_iter().enumerate() {
        reports.extend(feed(&mut t, &NoPodMeta, s as i64, l));
    }
    let run_id = t.active_snapshots(T0)[0].run_id.clone();
    // Released at 8 s: nothing is reported during the grace period.
    for s in 8..18 {
        reports.extend(feed(&mut t, &NoPodMeta, s, Lacking));
        assert!(reports.is_empty(), "tick {s}: {reports:#?}");
    }
    reports.extend(feed(&mut t, &NoPodMeta, 18, Lacking));
    assert_eq!(reports.len(), 1, "{reports:#?}");
    let r = &reports[0];
    assert_eq!(r.run_id, run_id);
    assert_eq!(r.state, RunState::Completed as i32);
    assert_eq!((r.start_unix_ms, r.end_unix_ms), (T0, T0 + 8000));
    assert!((r.gpu_busy_seconds - 8.0).abs() < 1e-9);
    assert!(
        (r.energy_joules - 800.0).abs() < 1e-6,
        "the grace period is not accounted: {}",
        r.energy_joules
    );
}

/// A pod that truly ended, without metadata: the run ends once it has been missing from every
/// listing for the grace period, counted only since PodResources last came back, and is reported
/// as it stood at the first listing that lacked it.
#[test]
fn without_metadata_a_released_run_ends_after_the_grace_period() {
    use Listing::{Failed, Held, Lacking};
    let mut t = RunTracker::new(cfg_grace(10));
    let mut ended_at = None;
    for s in 0..40 {
        // Released at 5 s; the kubelet is down from 9 s to 11 s (its first listing back is
        // one more without the pod).
        let l = match s {
            0..5 => Held,
            9..12 => Failed,
            _ => Lacking,
        };
        let out = feed(&mut t, &NoPodMeta, s, l);
        if !out.is_empty() {
            assert!(ended_at.is_none(), "one report: {out:#?}");
            assert_eq!(out.len(), 1);
            assert_eq!((out[0].start_unix_ms, out[0].end_unix_ms), (T0, T0 + 5000));
            assert_eq!(out[0].state, RunState::Completed as i32);
            assert!((out[0].gpu_busy_seconds - 5.0).abs() < 1e-9);
            ended_at = Some(s);
        }
    }
    assert_eq!(
        ended_at,
        Some(22),
        "10 s after PodResources came back at 12 s"
    );
    assert_eq!(t.active(), 0);

    // With no failure in between, 10 s after the first listing that lacked it.
    let mut t = RunTracker::new(cfg_grace(10));
    let l = |s| if s < 5 { Held } else { Lacking };
    let n: Vec<usize> = (0..20)
        .map(|s| feed(&mut t, &NoPodMeta, s, l(s)).len())
        .collect();
    assert_eq!(n.iter().position(|n| *n == 1), Some(15), "{n:?}");
    assert_eq!(n.iter().sum::<usize>(), 1);
}

/// With metadata, listings that lack a run do not end it, however many, while the pod shows its
/// container running; the container's finish (or the pod's deletion) does.
#[test]
fn with_metadata_only_the_pod_ends_a_run_missing_from_the_listings() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg_grace(10));
    pod_with(&store, Some(times(Some(T0 + 1000), None, 0)), false);
    for s in 0..3 {
        assert!(feed(&mut t, &store, s, Listing::Held).is_empty());
    }
    for s in 3..60 {
        assert!(
            feed(&mut t, &store, s, Listing::Lacking).is_empty(),
            "tick {s}"
        );
    }
    // Terminated (its restart policy keeps the pod running, say): the run ends at its finish.
    pod_with(
        &store,
        Some(times(Some(T0 + 1000), Some(T0 + 59_000), 0)),
        false,
    );
    let r = feed(&mut t, &store, 60, Listing::Lacking);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(
        (r[0].start_unix_ms, r[0].end_unix_ms),
        (T0 + 1000, T0 + 59_000)
    );

    // Deleted without a finish in its status: reported as of the first listing without it.
    let mut t = RunTracker::new(cfg_grace(10));
    pod_with(&store, Some(times(Some(T0 + 1000), None, 0)), false);
    for s in 0..3 {
        feed(&mut t, &store, s, Listing::Held);
    }
    for s in 3..6 {
        assert!(feed(&mut t, &store, s, Listing::Lacking).is_empty());
    }
    store.delete("ml", "train");
    let r = feed(&mut t, &store, 6, Listing::Lacking);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(
        (r[0].start_unix_ms, r[0].end_unix_ms),
        (T0 + 1000, T0 + 3000)
    );
    assert_eq!(r[0].pod_uid, "u1");

    // Failed later, its status without a finish: a failed run, as of the first listing
    // without it.
    let mut t = RunTracker::new(cfg_grace(10));
    pod_with(&store, Some(times(Some(T0 + 1000), None, 0)), false);
    for s in 0..6 {
        let l = if s < 3 {
            Listing::Held
        } else {
            Listing::Lacking
        };
        assert!(feed(&mut t, &store, s, l).is_empty());
    }
    store.apply(
        "ml",
        "train",
        PodMeta {
            uid: "u1".into(),
            failed: true,
            ended: true,
            ..Default::default()
        },
    );
    let r = feed(&mut t, &store, 6, Listing::Lacking);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].state, RunState::Failed as i32);
    assert_eq!(
        (r[0].start_unix_ms, r[0].end_unix_ms),
        (T0 + 1000, T0 + 3000)
    );
}

/// A pod re-created under the same name (another UID) is another run, even on the same device.
#[test]
fn a_pod_recreated_under_the_same_name_is_a_new_run() {
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg_grace(10));
    pod_with(&store, Some(times(Some(T0), None, 0)), false);
    for s in 0..3 {
        feed(&mut t, &store, s, Listing::Held);
    }
    let first = t.active_snapshots(T0)[0].run_id.clone();
    store.apply(
        "ml",
        "train",
        PodMeta {
            uid: "u2".into(),
            containers: [("main".to_owned(), times(Some(T0 + 3000), None, 0))].into(),
            ..Default::default()
        },
    );
    let r = feed(&mut t, &store, 4, Listing::Held);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(
        (r[0].run_id.as_str(), r[0].pod_uid.as_str()),
        (first.as_str(), "u1")
    );
    let now = t.active_snapshots(T0 + 4000);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].run_id, first);
    assert_eq!(now[0].pod_uid, "u2");
}

/// Seen in CI on a real kubelet: the listing lacks the pod for one tick just as its container
/// finishes (the run ends, timed by the container), then lists its device again while the pod
/// is not yet marked ended. Before the fix that started a second run of the same finished
/// container, and the job was reported twice.
#[test]
fn a_finished_container_listed_again_does_not_start_a_second_run() {
    use Listing::{Held, Lacking};
    let store = PodMetaStore::default();
    let mut t = RunTracker::new(cfg_grace(10));
    let mut reports = Vec::new();
    for s in 0..3 {
        pod_with(&store, Some(times(Some(T0), None, 0)), false);
        reports.extend(feed(&mut t, &store, s, Held));
    }
    let finished = Some(times(Some(T0), Some(T0 + 2500), 0));
    pod_with(&store, finished, false);
    reports.extend(feed(&mut t, &store, 3, Lacking));
    assert_eq!(reports.len(), 1, "the run ended: {reports:#?}");
    for s in 4..6 {
        reports.extend(feed(&mut t, &store, s, Held));
        assert_eq!(
            t.active(),
            0,
            "tick {s}: no second run of the finished attempt"
        );
    }
    // The same container restarted (OnFailure): that attempt is a run of its own.
    pod_with(&store, Some(times(None, None, 1)), false);
    reports.extend(feed(&mut t, &store, 6, Held));
    assert_eq!(t.active(), 1, "a restarted container starts a run");
    assert_eq!(reports.len(), 1, "{reports:#?}");
}
