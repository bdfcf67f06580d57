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
