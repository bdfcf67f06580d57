//! The index lock and the probes: a panic under the lock does not wedge the process, and a
//! writer that never lets go turns `/healthz` and `/readyz` to 503 so the pod is restarted;
//! learning runs off the lock, so the extender answers while a refit is in progress; a
//! follower that cannot follow the state store is not ready, so kube-scheduler calls another
//! replica.

use crate::common;

use axum::http::StatusCode;
use common::*;
use kudos_orchestrator::health::IndexWatchdog;
use kudos_orchestrator::http::{HttpState, Role, router};
use kudos_orchestrator::learn::{LearnHook, Learner};
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{RunOutcome, StoredRun};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

#[tokio::test]
async fn readiness_names_the_leader_and_refuses_a_follower_that_cannot_follow() {
    let index = standard_index();
    let metrics = Arc::new(Metrics::new());
    let role = Arc::new(parking_lot::RwLock::new(Role::default()));
    let state = Arc::new(HttpState {
        role: role.clone(),
        ..HttpState::new(
            mk_extender(index.clone(), metrics.clone()),
            index.clone(),
            metrics,
        )
    });
    let app = router(state, &limits());
    assert_eq!(
        get(&app, "/readyz").await,
        (StatusCode::OK, serde_json::json!("ok")),
        "the leader, or a replica without election"
    );
    role.write().text = "follower: replica a leads".into();
    assert_eq!(
        get(&app, "/readyz").await,
        (
            StatusCode::OK,
            serde_json::json!("follower: replica a leads")
        )
    );
    role.write().behind = Some("follower: cannot follow the state store for 31 s".into());
    let (status, body) = get(&app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot follow the state store")),
        "{body}"
    );
    // The extender still answers (stale is better than failing the pod's scheduling cycle).
    let args = serde_json::json!({"Pod": pod_json("p", Some("llm"), 1), "NodeNames": ["gpu-a"]});
    let (status, answer) = post(&app, "/kudos/v1/prioritize", args.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_stuck_index_fails_the_probes_and_a_panic_does_not_poison_it() {
    let index = standard_index();
    let metrics = Arc::new(Metrics::new());
    let watchdog = Arc::new(IndexWatchdog::new(Duration::from_millis(50)));
    let state = Arc::new(HttpState {
        watchdog: watchdog.clone(),
        ..HttpState::new(
            mk_extender(index.clone(), metrics.clone()),
            index.clone(),
            metrics,
        )
    });
    let app = router(state, &limits());

    // A panic while holding the write lock: the lock is released, not poisoned.
    let i2 = index.clone();
    let panicked = std::thread::spawn(move || {
        let _g = i2.write();
        panic!("a bug under the index lock");
    })
    .join();
    assert!(panicked.is_err());
    assert!(watchdog.probe(&index));
    assert_eq!(get(&app, "/readyz").await.0, StatusCode::OK);
    assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);

    // A writer that never lets go: the probe fails, and so do liveness and readiness.
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (free_tx, free_rx) = mpsc::channel::<()>();
    let i4 = index.clone();
    let holder = std::thread::spawn(move || {
        let _g = i4.write();
        held_tx.send(()).unwrap();
        let _ = free_rx.recv();
    });
    held_rx.recv().unwrap();
    let (w, i3) = (watchdog.clone(), index.clone());
    let probed = tokio::task::spawn_blocking(move || w.probe(&i3))
        .await
        .unwrap();
    assert!(!probed);
    tokio::time::timeout(Duration::from_secs(30), async {
        while watchdog.stalled_for().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let (s, v) = get(&app, "/healthz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("has not answered"),
        "{v}"
    );
    assert_eq!(
        get(&app, "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    free_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(watchdog.probe(&index));
    assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
}

fn stored_run(
    seq: u64,
    node: &str,
    profile: Option<kudos_orchestrator::state::ProfileRecord>,
) -> StoredRun {
    StoredRun {
        seq,
        report_id: format!("r{seq}"),
        run_id: format!("r{seq}"),
        node: node.into(),
        pod_namespace: "default".into(),
        pod_name: format!("p{seq}"),
        class: "resnet50".into(),
        device_ids: vec!["d0".into()],
        outcome: RunOutcome::Completed,
        start: 1_700_000_000.0,
        end: 1_700_000_600.0,
        gpu_busy_seconds: 550.0,
        progress: None,
        work_done: None,
        profile,
        received_at: 1_700_000_601.0,
    }
}

/// Queues runs 1..=`runs` on gpu-a, `gap` apart, so they arrive in several batches.
async fn learn_spaced(
    learner: &Learner,
    index: &kudos_orchestrator::index::SharedIndex,
    runs: u64,
    gap: Duration,
) {
    let profile = index.read().profile("gpu-a");
    for seq in 1..=runs {
        learner
            .learn(stored_run(seq, "gpu-a", profile.clone()))
            .await;
        tokio::time::sleep(gap).await;
    }
}

/// The learner refits a copy with no lock held: while it is stopped inside a refit, the
/// extender answers from the previous model and the index can even be written.
#[tokio::test]
async fn the_extender_answers_while_a_refit_is_in_progress() {
    let index = standard_index();
    let app = mk_app(index.clone());
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
    let hook: LearnHook = Arc::new(move || {
        let _ = entered_tx.lock().unwrap().send(());
        let _ = release_rx.lock().unwrap().recv();
    });
    let learner = Learner::spawn(index.clone(), Arc::new(Metrics::new()), Some(hook));
    let profile = index.read().profile("gpu-a");
    learner.learn(stored_run(1, "gpu-a", profile)).await;
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();

    // The refit is in progress (the hook has not returned).
    assert!(
        index.try_write().is_some(),
        "the learner holds no index lock"
    );
    let body = serde_json::to_vec(&serde_json::json!({
        "Pod": pod_json("p", Some("resnet50"), 1),
        "NodeNames": ["gpu-a", "gpu-b"],
    }))
    .unwrap();
    let (s, v) = post(&app, "/kudos/v1/prioritize", body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(
        index.read().applied_seq(),
        0,
        "the old model is still published"
    );

    release_tx.send(()).unwrap();
    wait_learned(&index, 1).await;
    assert_eq!(index.read().scheduler().state().runs(), 1);
}

/// Copies are spaced by a hundred times the last copy's cost, at most 500 ms: a large model (32
/// ms a copy at 30,000 cells) is published at most every 500 ms while runs keep arriving, and a
/// small one within milliseconds: 200 runs 5 ms apart are published about 170 times (a copy of
/// this model takes about 0.1 ms in a debug build), not twice a second (2 or 3 times).
#[tokio::test]
async fn copies_are_spaced_by_their_cost_and_a_small_model_is_not_delayed() {
    use kudos_orchestrator::learn::{PUBLISH_EVERY, publish_gap};
    use std::time::Duration;
    assert_eq!(publish_gap(Duration::from_millis(32)), PUBLISH_EVERY);
    assert_eq!(
        publish_gap(Duration::from_millis(3)),
        Duration::from_millis(300)
    );
    assert_eq!(publish_gap(Duration::from_secs(2)), PUBLISH_EVERY);
    assert_eq!(
        publish_gap(Duration::from_micros(20)),
        Duration::from_millis(2)
    );

    let index = standard_index();
    let metrics = Arc::new(Metrics::new());
    let learner = Learner::spawn(index.clone(), metrics.clone(), None);
    learn_spaced(&learner, &index, 200, Duration::from_millis(5)).await;
    wait_learned(&index, 200).await;
    let publishes = metrics.model_publishes.get();
    assert!(
        (20..=200).contains(&publishes),
        "{publishes} copies for 200 runs of a small model"
    );
    assert_eq!(metrics.learned_runs.get(), 200);
}

/// A panic while learning a batch loses nothing: the copy is rebuilt from the published model
/// and every run since the last publish is learned again (before, the runs learned but not yet
/// published were gone from the model, and the next snapshot's seq covered them, so not even a
/// restart brought them back).
#[tokio::test]
async fn a_panic_while_learning_loses_no_run() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let index = standard_index();
    let metrics = Arc::new(Metrics::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // The second batch panics after it is learned on the copy.
    let hook: LearnHook = Arc::new(move || {
        if c.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("a defect while learning");
        }
    });
    let learner = Learner::spawn(index.clone(), metrics.clone(), Some(hook));
    learn_spaced(&learner, &index, 12, Duration::from_millis(2)).await;
    wait_learned(&index, 12).await;
    assert!(calls.load(Ordering::SeqCst) >= 2, "the panicking batch ran");
    assert_eq!(index.read().scheduler().state().runs(), 12);
    assert_eq!(metrics.learned_runs.get(), 12);
    assert_eq!(metrics.runs_left_out.get(), 0);
}

/// The learner refits only each run's class per run and the whole model once per copy it
/// publishes (scheduler-core `Refit::Deferred`): what it publishes is settled and predicts what
/// refitting on every run predicts. 90 runs over three classes and three device profiles,
/// several batches and publishes, against the same runs applied one by one under the lock.
#[tokio::test]
async fn the_learner_publishes_the_model_every_run_refitted() {
    let nodes = ["gpu-a", "gpu-b", "gpu-c"];
    let classes = ["resnet50", "bert", "llama"];
    let learned = standard_index();
    let every_run = standard_index();
    let metrics = Arc::new(Metrics::new());
    let learner = Learner::spawn(learned.clone(), metrics.clone(), None);
    for seq in 1..=90u64 {
        let (class, node) = ((seq % 3) as usize, (seq / 3 % 3) as usize);
        let profile = learned.read().profile(nodes[node]);
        let mut run = stored_run(seq, nodes[node], profile);
        run.class = classes[class].into();
        // Classes differ in level and in how much each device speeds them up.
        let seconds = 300.0 * (1 + class) as f64 * [1.0, 1.6, 2.9][(node + class) % 3];
        run.end = run.start + seconds * (1.0 + 0.01 * (seq % 5) as f64);
        run.gpu_busy_seconds = run.end - run.start;
        run.received_at = run.end + 1.0;
        every_run.write().apply_run(&run).expect("learned");
        learner.learn(run).await;
        if seq % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    wait_learned(&learned, 90).await;
    assert!(metrics.model_publishes.get() >= 2, "several publishes");
    let (a, b) = (learned.read().model(), every_run.read().model());
    assert!(a.is_settled());
    assert_eq!(a.state().runs(), 90);
    for class in classes {
        for node in nodes {
            let profile = kudos_orchestrator::index::to_profile(
                &learned.read().profile(node).expect("known node"),
            );
            let (pa, pb) = (
                a.predict(class, node, &profile, None).seconds,
                b.predict(class, node, &profile, None).seconds,
            );
            assert!(
                ((pa - pb) / pb).abs() < 1e-3,
                "{class} on {node}: learner {pa} s, every run {pb} s"
            );
        }
    }
}
