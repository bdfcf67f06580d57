//! The on-disk stores, damaged: the orchestrator's redb file (plugin configuration, runs,
//! report IDs, model snapshot) and the node agent's outbox (unacknowledged reports, active
//! runs). Both hold what a restart must not lose, and both meet torn writes, full disks and
//! bad blocks.
//!
//! Input: the first byte picks the store (bit 0) and whether the file is also truncated
//! (bit 1, at the `u32` that follows, modulo its length). The rest is a list of patches, each a
//! little-endian `u32` offset (modulo the file's length), a length byte and that many bytes,
//! written over a real store file that the target builds once per process (three nodes,
//! twelve runs, a model snapshot; twelve reports, two acknowledged, two active runs).
//!
//! Checked besides "no escaped panic": the orchestrator's store always opens, intact or moved
//! aside and started empty, and the process can rebuild its index from what loaded and keep
//! writing; the outbox opens or refuses with an error, and an opened one answers reads and
//! takes a report. redb panics on some damaged pages; the stores catch that on purpose
//! ([`crate::caught_panics`] counts it).

use kudos_node_agent::outbox::Outbox;
use kudos_orchestrator::metrics::Metrics;
use kudos_orchestrator::state::{RunOutcome, StoredRun};
use kudos_orchestrator::store::{FileStore, Store};
use kudos_proto::kudos::v1::{RunReport, RunState};
use std::path::Path;
use std::sync::OnceLock;

const STORE_FILE: &str = "s.redb";
const OUTBOX_FILE: &str = "outbox.redb";
const OUTBOX_MAX: u64 = 100;

/// One input; see the module docs.
pub fn run(data: &[u8]) {
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let outbox = first & 1 == 1;
    let mut file = if outbox {
        templates().1.clone()
    } else {
        templates().0.clone()
    };
    if first & 2 == 2 && rest.len() >= 4 {
        let at = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        file.truncate(at % (file.len() + 1));
        rest = &rest[4..];
    }
    apply_patches(&mut file, rest);
    let dir = crate::scratch();
    if outbox {
        write(&dir.path().join(OUTBOX_FILE), &file);
        outbox_reopened(dir.path());
    } else {
        let path = dir.path().join(STORE_FILE);
        write(&path, &file);
        store_reopened(&path);
    }
}

/// Writes patches (`u32` LE offset, length byte, bytes) over `file`.
pub fn apply_patches(file: &mut [u8], mut rest: &[u8]) {
    while rest.len() >= 5 && !file.is_empty() {
        let at = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize % file.len();
        let len = usize::from(rest[4]).min(rest.len() - 5);
        let patch = &rest[5..5 + len];
        let end = (at + patch.len()).min(file.len());
        file[at..end].copy_from_slice(&patch[..end - at]);
        rest = &rest[5 + len..];
    }
}

fn write(path: &Path, bytes: &[u8]) {
    if let Err(e) = std::fs::write(path, bytes) {
        panic!("cannot write {}: {e}", path.display());
    }
}

fn store_reopened(path: &Path) {
    let metrics = Metrics::new();
    let (store, loaded) = match FileStore::open_checked(path, &metrics) {
        Ok(opened) => opened,
        Err(e) => panic!("a damaged store must open, intact or moved aside; it failed: {e}"),
    };
    // What the process does next: rebuild the index (a snapshot that redb's checks let
    // through but does not decode is an error here, never a panic), then keep writing.
    let settings = default_settings();
    if let Ok((mut idx, backlog)) = kudos_orchestrator::restore(&settings, loaded, false) {
        kudos_orchestrator::replay(&mut idx, &backlog);
    }
    let rt = crate::runtime();
    let _ = rt.block_on(store.append_run(stored_run(99, "gpu-a", "after-damage")));
}

fn outbox_reopened(dir: &Path) {
    let Ok(outbox) = Outbox::open(dir, OUTBOX_MAX) else {
        return;
    };
    let _ = outbox.pending(None, 1000);
    let _ = outbox.load_active();
    let _ = outbox.push(&[report(99, RunState::Completed)]);
    let _ = outbox.ack(&["r-1", "r-99"]);
}

fn default_settings() -> kudos_orchestrator::config::Settings {
    use clap::Parser;
    let args = match kudos_orchestrator::Args::try_parse_from(["kudos-orchestrator"]) {
        Ok(a) => a,
        Err(e) => panic!("the orchestrator's arguments without flags do not parse: {e}"),
    };
    match kudos_orchestrator::config::Settings::merge(&args, Default::default()) {
        Ok(s) => s,
        Err(e) => panic!("the default settings do not validate: {e}"),
    }
}

fn stored_run(seq: u64, node: &str, class: &str) -> StoredRun {
    let start = 1_700_000_000.0 + seq as f64 * 100.0;
    StoredRun {
        seq: 0,
        report_id: format!("r-{seq}"),
        run_id: format!("run-{seq}"),
        node: node.into(),
        pod_namespace: "ml".into(),
        pod_name: format!("train-{seq}"),
        class: class.into(),
        device_ids: vec![format!("{node}-0")],
        outcome: RunOutcome::Completed,
        start,
        end: start + 60.0 + (seq % 5) as f64 * 30.0,
        gpu_busy_seconds: 50.0,
        progress: None,
        work_done: Some(1000.0),
        profile: None,
        received_at: start + 200.0,
    }
}

fn report(seq: u64, state: RunState) -> RunReport {
    RunReport {
        report_id: format!("r-{seq}"),
        run_id: format!("run-{seq}"),
        node: "gpu-a".into(),
        pod_namespace: "ml".into(),
        pod_name: format!("train-{seq}"),
        class: "resnet50".into(),
        device_ids: vec!["gpu-a-0".into()],
        state: state as i32,
        start_unix_ms: 1_700_000_000_000 + seq as i64 * 100_000,
        end_unix_ms: 1_700_000_060_000 + seq as i64 * 100_000,
        gpu_busy_seconds: 50.0,
        ..Default::default()
    }
}

/// The undamaged files: (orchestrator store, outbox), built once per process.
pub fn templates() -> &'static (Vec<u8>, Vec<u8>) {
    static TEMPLATES: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let dir = crate::scratch();
        (store_template(dir.path()), outbox_template(dir.path()))
    })
}

fn read(path: &Path) -> Vec<u8> {
    match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    }
}

fn store_template(dir: &Path) -> Vec<u8> {
    let path = dir.join(STORE_FILE);
    let rt = crate::runtime();
    let built: Result<(), kudos_orchestrator::store::StoreError> = rt.block_on(async {
        let store = FileStore::open(&path)?;
        let index = crate::extender::index();
        let cfg = index.read().plugin_config().clone();
        store.save_plugin_config(cfg).await?;
        let nodes = ["gpu-a", "gpu-b", "gpu-c"];
        let runs: Vec<StoredRun> = (1..=12)
            .map(|i| {
                stored_run(
                    i,
                    nodes[i as usize % 3],
                    ["resnet50", "bert"][i as usize % 2],
                )
            })
            .collect();
        store.append_runs(runs.clone()).await?;
        // A snapshot of the first eight runs, as the orchestrator saves it.
        let model = {
            let mut idx = index.write();
            for (seq, r) in runs.iter().take(8).enumerate() {
                let r = StoredRun {
                    seq: seq as u64 + 1,
                    ..r.clone()
                };
                let _ = idx.apply_run(&r);
            }
            idx.model()
        };
        let bytes = serde_json::to_vec(model.state()).map_err(|e| {
            kudos_orchestrator::store::StoreError::Damaged(format!("snapshot: {e}"))
        })?;
        store.save_model(bytes, 8).await
    });
    if let Err(e) = built {
        panic!("cannot build the store template: {e}");
    }
    read(&path)
}

fn outbox_template(dir: &Path) -> Vec<u8> {
    let sub = dir.join("outbox");
    {
        let outbox = match Outbox::open(&sub, OUTBOX_MAX) {
            Ok(o) => o,
            Err(e) => panic!("cannot open a new outbox: {e}"),
        };
        let reports: Vec<RunReport> = (1..=12)
            .map(|i| {
                let state = if i % 4 == 0 {
                    RunState::InProgress
                } else {
                    RunState::Completed
                };
                report(i, state)
            })
            .collect();
        let done = outbox
            .push(&reports)
            .and_then(|_| outbox.ack(&["r-1", "r-2"]))
            .and_then(|_| {
                outbox.save_active(&[
                    report(20, RunState::InProgress),
                    report(21, RunState::InProgress),
                ])
            });
        if let Err(e) = done {
            panic!("cannot build the outbox template: {e}");
        }
    }
    read(&sub.join(OUTBOX_FILE))
}
