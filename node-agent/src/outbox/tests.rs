use super::*;

fn report(id: &str, state: RunState) -> RunReport {
    RunReport {
        report_id: id.into(),
        run_id: format!("run-{id}"),
        state: state as i32,
        ..Default::default()
    }
}

fn ids(v: &[(u64, RunReport)]) -> Vec<String> {
    v.iter().map(|(_, r)| r.report_id.clone()).collect()
}

#[test]
fn reports_survive_reopen_and_leave_only_when_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outbox");
    {
        let ob = Outbox::open(&path, 100).expect("open");
        let out = ob
            .push(&[
                report("a", RunState::Completed),
                report("b", RunState::InProgress),
            ])
            .expect("push");
        assert_eq!(out.stored, 2);
        // Same ID again: stored once.
        assert_eq!(
            ob.push(&[report("a", RunState::Completed)])
                .expect("push")
                .duplicates,
            1
        );
        assert_eq!(ob.depth(), 2);
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let ob = Outbox::open(&path, 100).expect("reopen");
    assert_eq!(ob.depth(), 2);
    let p = ob.pending(None, 10).expect("pending");
    assert_eq!(ids(&p), vec!["a", "b"]);
    assert_eq!(
        ids(&ob.pending(Some(p[0].0), 10).expect("pending")),
        vec!["b"]
    );
    assert_eq!(ob.ack(&["a", "unknown"]).expect("ack"), 1);
    assert_eq!(ids(&ob.pending(None, 10).expect("pending")), vec!["b"]);
    assert_eq!(ob.depth(), 1);
}

#[test]
fn full_outbox_drops_oldest_snapshots_first_and_refuses_completed_loudly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ob = Outbox::open(dir.path(), 4).expect("open");
    ob.push(&[
        report("s1", RunState::InProgress),
        report("c1", RunState::Completed),
        report("s2", RunState::InProgress),
        report("c2", RunState::Completed),
    ])
    .expect("push");
    // Full: a completed report evicts the oldest snapshot.
    let out = ob.push(&[report("c3", RunState::Completed)]).expect("push");
    assert_eq!(out.dropped_snapshots, vec!["s1"]);
    // A new snapshot evicts the next oldest snapshot.
    let out = ob
        .push(&[report("s3", RunState::InProgress)])
        .expect("push");
    assert_eq!(out.dropped_snapshots, vec!["s2"]);
    let out = ob.push(&[report("c4", RunState::Failed)]).expect("push");
    assert_eq!(out.dropped_snapshots, vec!["s3"]);
    assert_eq!(
        ids(&ob.pending(None, 10).expect("pending")),
        vec!["c1", "c2", "c3", "c4"]
    );
    // Only completed runs left: a snapshot is dropped, a completed report is refused, and
    // nothing already stored is touched.
    let out = ob
        .push(&[
            report("s4", RunState::InProgress),
            report("c5", RunState::Completed),
        ])
        .expect("push");
    assert_eq!(out.dropped_snapshots, vec!["s4"]);
    assert_eq!(out.refused.len(), 1);
    assert_eq!(out.refused[0].report_id, "c5");
    assert_eq!(out.stored, 0);
    assert_eq!(
        ids(&ob.pending(None, 10).expect("pending")),
        vec!["c1", "c2", "c3", "c4"]
    );
    // Acks make room again.
    ob.ack(&["c1"]).expect("ack");
    assert_eq!(
        ob.push(&[report("c5", RunState::Completed)])
            .expect("push")
            .stored,
        1
    );
}

#[test]
fn push_once_generates_a_batch_only_once_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let make = || {
        (0..3)
            .map(|i| report(&format!("x{i}"), RunState::Completed))
            .collect()
    };
    {
        let ob = Outbox::open(dir.path(), 100).expect("open");
        assert_eq!(
            ob.push_once("synthetic", make)
                .expect("push")
                .map(|o| o.stored),
            Some(3)
        );
        ob.ack(&["x0"]).expect("ack");
    }
    let ob = Outbox::open(dir.path(), 100).expect("open");
    assert!(ob.push_once("synthetic", make).expect("push").is_none());
    assert_eq!(ob.depth(), 2);
}

#[test]
fn active_runs_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ob = Outbox::open(dir.path(), 100).expect("open");
    ob.save_active(&[
        report("a", RunState::InProgress),
        report("b", RunState::InProgress),
    ])
    .expect("save");
    ob.save_active(&[report("b", RunState::InProgress)])
        .expect("save");
    let got = ob.load_active().expect("load");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].report_id, "b");
}

/// Every 4 KiB block of a real outbox, overwritten with garbage in turn: the outbox opens each
/// time (intact, or the file moved aside and an empty outbox started, said by `recovered`),
/// answers reads and takes a new report. Before, a damaged page made redb panic at open and
/// the agent crash-looped.
#[test]
fn a_damaged_block_is_set_aside_and_the_outbox_starts_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good");
    {
        let ob = Outbox::open(&good, 100).expect("open");
        let reports: Vec<_> = (0..20)
            .map(|i| report(&format!("r{i}"), RunState::Completed))
            .collect();
        ob.push(&reports).expect("push");
        ob.save_active(&[report("live", RunState::InProgress)])
            .expect("active");
    }
    let bytes = std::fs::read(good.join("outbox.redb")).expect("read");
    let (mut intact, mut recovered) = (0, 0);
    for block in 0..bytes.len().div_ceil(4096) {
        let case = dir.path().join(format!("block-{block}"));
        std::fs::create_dir_all(&case).expect("mkdir");
        let mut damaged = bytes.clone();
        let end = ((block + 1) * 4096).min(damaged.len());
        damaged[block * 4096..end].fill(0xa5);
        std::fs::write(case.join("outbox.redb"), &damaged).expect("write");
        let ob = Outbox::open(&case, 100).unwrap_or_else(|e| panic!("block {block}: {e}"));
        match ob.recovered() {
            Some(why) => {
                recovered += 1;
                assert!(why.contains("moved to"), "{why}");
                assert_eq!(
                    ob.depth(),
                    0,
                    "block {block}: a recovered outbox starts empty"
                );
                let aside = std::fs::read_dir(&case)
                    .expect("ls")
                    .filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with("outbox.redb.damaged-")
                    })
                    .count();
                assert_eq!(aside, 1, "block {block}: the damaged file is kept");
            }
            None => intact += 1,
        }
        ob.pending(None, 100).expect("pending");
        ob.push(&[report("new", RunState::Completed)])
            .expect("push");
    }
    assert!(
        recovered > 0,
        "no damaged block was detected ({intact} intact)"
    );
}

#[test]
fn an_empty_file_is_damage_not_a_new_outbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("outbox.redb"), b"").expect("write");
    let ob = Outbox::open(dir.path(), 100).expect("open");
    let why = ob.recovered().expect("an empty file is reported");
    assert!(why.contains("zero bytes"), "{why}");
    drop(ob);
    let again = Outbox::open(dir.path(), 100).expect("reopen");
    assert!(again.recovered().is_none(), "the new outbox is sound");
}

/// A file whose `reports` table has other types than ours is damage: set aside, not a reason
/// to refuse to start.
#[test]
fn a_table_of_the_wrong_type_is_damage() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = redb::Database::create(dir.path().join("outbox.redb")).expect("create");
        let txn = db.begin_write().expect("txn");
        txn.open_table(redb::TableDefinition::<&str, &str>::new("reports"))
            .expect("table");
        txn.commit().expect("commit");
    }
    let ob = Outbox::open(dir.path(), 100).expect("open");
    assert!(ob.recovered().is_some());
    ob.push(&[report("a", RunState::Completed)]).expect("push");
}
