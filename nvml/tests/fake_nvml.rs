//! The safe layer against the fake library, loaded through nvml-wrapper's real loading path.
//! Each test has its own library copy, so they run in parallel without sharing state.

use kudos_nvml::fake::{
    FakeLink, FakeNvml, FakeProcess, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN,
};
use kudos_nvml::{Event, Interconnect, Nvml};
use std::sync::mpsc;
use std::time::Duration;

fn setup(devices: u32) -> (tempfile::TempDir, FakeNvml, Nvml) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeNvml::new(dir.path(), devices).expect("fake");
    let nvml = Nvml::init(Some(fake.library())).expect("init");
    (dir, fake, nvml)
}

/// The library checks mtime/size/inode; a rename always changes the inode.
fn rewrite(fake: &FakeNvml) {
    fake.write().expect("write config");
}

#[test]
fn discovers_configured_devices() {
    let (_dir, fake, nvml) = setup(3);
    let devs = nvml.devices().expect("devices");
    assert_eq!(devs.len(), 3);
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(d.index as usize, i);
        assert_eq!(d.uuid, fake.devices[i].uuid);
        assert_eq!(d.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(d.memory_total_bytes, 80 * 1024 * 1024 * 1024);
        assert_eq!(d.minor_number, Some(i as u32));
        assert_eq!(d.numa_node, Some(0));
        assert_eq!(d.compute_capability, Some((9, 0)));
        assert!(
            d.pci_bus_id
                .to_ascii_lowercase()
                .ends_with(&format!("{:02x}:00.0", 0x10 + i))
        );
    }
    assert_eq!(nvml.driver_version().expect("driver"), "550.54.15");
}

#[test]
fn compute_capability_is_read_and_absent_where_the_driver_does_not_say() {
    let (_dir, mut fake, nvml) = setup(2);
    fake.devices[0].compute_capability = Some((7, 5));
    fake.devices[1].compute_capability = None;
    rewrite(&fake);
    let devs = nvml.devices().expect("devices");
    assert_eq!(devs[0].compute_capability, Some((7, 5)));
    assert_eq!(devs[1].compute_capability, None);
}

#[test]
fn samples_follow_the_configuration_file() {
    let (_dir, mut fake, nvml) = setup(2);
    let uuid = fake.devices[1].uuid.clone();
    let s = nvml.sample(&uuid).expect("sample");
    assert_eq!(s.gpu_utilization_percent, 0);
    assert!(s.processes.is_empty());

    let d = &mut fake.devices[1];
    d.gpu_utilization_percent = 87;
    d.memory_utilization_percent = 40;
    d.memory_used_bytes = 1 << 30;
    d.power_milliwatts = 350_500;
    d.sm_clock_mhz = 1755;
    d.temperature_celsius = 71;
    d.energy_millijoules = 12_000;
    fake.processes.push(FakeProcess {
        device: 1,
        pid: 4242,
        memory_bytes: 1 << 29,
        sm_percent: 60,
        memory_percent: 20,
    });
    fake.processes.push(FakeProcess {
        device: 0,
        pid: 7,
        memory_bytes: 1,
        sm_percent: 1,
        memory_percent: 1,
    });
    rewrite(&fake);

    let s = nvml.sample(&uuid).expect("sample");
    assert_eq!(s.gpu_utilization_percent, 87);
    assert_eq!(s.memory_utilization_percent, 40);
    assert_eq!(s.memory_used_bytes, 1 << 30);
    assert_eq!(s.memory_total_bytes, 80 * 1024 * 1024 * 1024);
    assert_eq!(s.power_watts, Some(350.5));
    assert_eq!(s.sm_clock_hertz, Some(1755e6));
    assert_eq!(s.temperature_celsius, Some(71));
    assert_eq!(s.energy_joules, Some(12.0));
    assert_eq!(s.processes.len(), 1);
    let p = &s.processes[0];
    assert_eq!((p.pid, p.used_memory_bytes), (4242, Some(1 << 29)));
    assert_eq!(
        (p.sm_utilization_percent, p.memory_utilization_percent),
        (Some(60), Some(20))
    );
}

#[test]
fn device_and_library_failures_are_typed_errors() {
    let (_dir, mut fake, nvml) = setup(2);
    let lost = fake.devices[0].uuid.clone();
    let fine = fake.devices[1].uuid.clone();
    fake.devices[0].fail = Some(NVML_ERROR_GPU_IS_LOST);
    rewrite(&fake);
    let err = nvml.sample(&lost).expect_err("lost device");
    assert!(err.is_gpu_lost(), "{err}");
    assert!(nvml.check(&lost).is_err());
    nvml.check(&fine).expect("other device answers");

    fake.devices[0].fail = None;
    fake.fail = Some(NVML_ERROR_UNKNOWN);
    rewrite(&fake);
    assert!(nvml.check(&fine).is_err(), "NVML not answering");
    assert!(!nvml.check(&fine).expect_err("fails").is_gpu_lost());

    fake.fail = None;
    rewrite(&fake);
    nvml.check(&lost).expect("recovered");
}

#[test]
fn init_fails_cleanly_when_nvml_does_not_answer_or_is_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fake = FakeNvml::new(dir.path(), 1).expect("fake");
    fake.fail = Some(9);
    fake.write().expect("write");
    let err = Nvml::init(Some(fake.library())).expect_err("driver not loaded");
    assert!(err.to_string().contains("initialising NVML"), "{err}");
    let err = Nvml::init(Some(&dir.path().join("nope.so"))).expect_err("missing");
    assert!(matches!(err, kudos_nvml::Error::Init { .. }));
}

/// What a container given the driver sees: the configuration file bind-mounted, so XIDs are
/// appended in place (a rename would not reach it).
#[test]
fn an_xid_appended_in_place_is_delivered() {
    let (_dir, fake, nvml) = setup(2);
    let (tx, rx) = mpsc::channel();
    let _watcher = nvml
        .watch_xid(&[], Duration::from_millis(50), move |e| {
            let _ = tx.send(e);
        })
        .expect("watch");
    kudos_nvml::fake::append_xid(fake.config_path(), 1, 79).expect("append");
    match rx.recv_timeout(Duration::from_secs(5)).expect("event") {
        Event::Xid(x) => assert_eq!((x.uuid, x.xid), (fake.devices[1].uuid.clone(), 79)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn xid_events_are_delivered_and_failures_reported() {
    let (_dir, mut fake, nvml) = setup(2);
    let (tx, rx) = mpsc::channel();
    let watcher = nvml
        .watch_xid(&[], Duration::from_millis(50), move |e| {
            let _ = tx.send(e);
        })
        .expect("watch");
    fake.xid(1, 79);
    fake.xid(0, 48);
    rewrite(&fake);
    let mut got = Vec::new();
    while got.len() < 2 {
        match rx.recv_timeout(Duration::from_secs(5)).expect("event") {
            Event::Xid(x) => got.push((x.uuid, x.xid)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        got,
        vec![
            (fake.devices[1].uuid.clone(), 79),
            (fake.devices[0].uuid.clone(), 48)
        ]
    );

    fake.fail = Some(NVML_ERROR_UNKNOWN);
    rewrite(&fake);
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(5)).expect("event"),
        Event::WaitFailed(_)
    ));
    fake.fail = None;
    rewrite(&fake);
    loop {
        match rx.recv_timeout(Duration::from_secs(5)).expect("event") {
            Event::WaitRecovered => break,
            Event::WaitFailed(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    let started = std::time::Instant::now();
    drop(watcher);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stop joins within one wait"
    );
}

#[test]
fn watching_only_some_devices_filters_events() {
    let (_dir, mut fake, nvml) = setup(2);
    let (tx, rx) = mpsc::channel();
    let _w = nvml
        .watch_xid(
            &[fake.devices[1].uuid.clone()],
            Duration::from_millis(20),
            move |e| {
                let _ = tx.send(e);
            },
        )
        .expect("watch");
    fake.xid(0, 79);
    fake.xid(1, 31);
    rewrite(&fake);
    match rx.recv_timeout(Duration::from_secs(5)).expect("event") {
        Event::Xid(x) => assert_eq!(
            (x.uuid.as_str(), x.xid),
            (fake.devices[1].uuid.as_str(), 31)
        ),
        other => panic!("unexpected {other:?}"),
    }
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn interconnect_prefers_nvlink_then_topology() {
    let (_dir, mut fake, nvml) = setup(8);
    fake.links.push(FakeLink {
        a: 0,
        b: 1,
        level: 0,
        nvlinks: 4,
    });
    fake.links.push(FakeLink {
        a: 2,
        b: 3,
        level: 20,
        nvlinks: 0,
    });
    rewrite(&fake);
    let u = |i: usize| fake.devices[i].uuid.clone();
    assert_eq!(
        nvml.interconnect(&u(0), &u(1)).expect("0-1"),
        Interconnect::NvLink { links: 4 }
    );
    assert_eq!(
        nvml.interconnect(&u(1), &u(0)).expect("1-0"),
        Interconnect::NvLink { links: 4 }
    );
    assert_eq!(
        nvml.interconnect(&u(2), &u(3)).expect("2-3"),
        Interconnect::PcieSwitches
    );
    assert_eq!(
        nvml.interconnect(&u(0), &u(2)).expect("0-2"),
        Interconnect::NumaNode
    );
    assert_eq!(
        nvml.interconnect(&u(0), &u(5)).expect("0-5"),
        Interconnect::System
    );
    assert_eq!(
        nvml.interconnect(&u(0), &u(0)).expect("same"),
        Interconnect::Same
    );
    assert!(Interconnect::NvLink { links: 4 }.cost() < Interconnect::NumaNode.cost());
}
