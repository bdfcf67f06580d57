//! Against the real driver, on a GPU machine only:
//! `cargo test -p kudos-nvml --test real_nvml -- --ignored`.

use kudos_nvml::Nvml;
use std::time::Duration;

#[test]
#[ignore = "needs an NVIDIA driver"]
fn real_driver_discovery_samples_events_and_topology() {
    let nvml = Nvml::init(None).expect("NVML loads");
    println!("driver {}", nvml.driver_version().expect("driver version"));
    let devices = nvml.devices().expect("devices");
    assert!(!devices.is_empty());
    for d in &devices {
        println!("{d:?}");
        assert!(d.uuid.starts_with("GPU-"));
        assert!(format!("nv-{}", d.uuid).len() <= 63);
        let s = nvml.sample(&d.uuid).expect("sample");
        println!("{s:?}");
        assert!(s.memory_total_bytes > 0 && s.gpu_utilization_percent <= 100);
        nvml.check(&d.uuid).expect("answers");
    }
    for a in &devices {
        for b in &devices {
            println!(
                "{} - {}: {:?}",
                a.index,
                b.index,
                nvml.interconnect(&a.uuid, &b.uuid).expect("topology")
            );
        }
    }
    let watcher = nvml
        .watch_xid(&[], Duration::from_millis(100), |e| println!("{e:?}"))
        .expect("event set");
    std::thread::sleep(Duration::from_millis(300));
    watcher.stop();
}
