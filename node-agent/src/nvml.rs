//! The NVML [`GpuBackend`], over `kudos-nvml` (shared with the device plugin, so both read
//! devices the same way and both are tested against the same fake `libnvidia-ml.so.1`).
//!
//! XIDs arrive as NVML events on a dedicated thread (`kudos_nvml::Nvml::watch_xid`); they are
//! counted per device here and reported with each sample. Unlike the device plugin, the agent
//! ignores no XID: it only counts and exports them.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kudos_nvml::{Event, EventWatcher, Nvml};

use crate::sample::{BackendError, DeviceInfo, DeviceSample, GpuBackend, ProcessSample};

/// (XIDs seen, last XID) per UUID.
type XidCounts = Arc<Mutex<HashMap<String, (u64, u64)>>>;

/// GPUs read through NVML.
pub struct NvmlBackend {
    nvml: Nvml,
    xids: XidCounts,
    _watcher: Option<EventWatcher>,
}

impl NvmlBackend {
    /// Loads NVML (from `library`, or the loader's search path) and starts counting XIDs. A
    /// failing XID watcher is logged and sampling continues without XID counts.
    pub fn new(library: Option<&Path>) -> Result<Self, BackendError> {
        let nvml = Nvml::init(library).map_err(|e| BackendError::Unavailable(e.to_string()))?;
        let xids: XidCounts = Arc::default();
        let counts = xids.clone();
        let watcher = nvml.watch_xid(&[], Duration::from_secs(1), move |ev| match ev {
            Event::Xid(x) => {
                tracing::warn!(uuid = %x.uuid, xid = x.xid, "XID error");
                let mut g = counts.lock().unwrap_or_else(|p| p.into_inner());
                let e = g.entry(x.uuid).or_default();
                e.0 += 1;
                e.1 = x.xid;
            }
            Event::WaitFailed(e) => tracing::debug!(error = %e, "NVML event wait failed"),
            Event::WaitRecovered => tracing::debug!("NVML event wait recovered"),
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch XID events; XID counts stay at zero");
                None
            }
        };
        Ok(Self {
            nvml,
            xids,
            _watcher: watcher,
        })
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>, BackendError> {
        let devs = self
            .nvml
            .devices()
            .map_err(|e| BackendError::Device(e.to_string()))?;
        Ok(devs
            .into_iter()
            .map(|d| DeviceInfo {
                index: d.index,
                uuid: d.uuid,
                model: d.name,
                memory_total_bytes: d.memory_total_bytes,
            })
            .collect())
    }

    fn sample(&self, device: &DeviceInfo) -> Result<DeviceSample, BackendError> {
        let s = self
            .nvml
            .sample(&device.uuid)
            .map_err(|e| BackendError::Device(e.to_string()))?;
        let (xid_errors_total, last) = self
            .xids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&device.uuid)
            .copied()
            .unwrap_or((0, 0));
        Ok(DeviceSample {
            gpu_util_percent: f64::from(s.gpu_utilization_percent),
            mem_util_percent: f64::from(s.memory_utilization_percent),
            memory_used_bytes: s.memory_used_bytes,
            power_watts: s.power_watts,
            energy_joules: s.energy_joules,
            sm_clock_hz: s.sm_clock_hertz,
            temperature_celsius: s.temperature_celsius.map(f64::from),
            xid_errors_total,
            last_xid: (xid_errors_total > 0).then_some(last),
            processes: s
                .processes
                .into_iter()
                .map(|p| ProcessSample {
                    pid: p.pid,
                    used_memory_bytes: p.used_memory_bytes,
                    sm_util_percent: p.sm_utilization_percent.map(f64::from),
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{SampleError, Sampler};
    use kudos_nvml::fake::{FakeNvml, FakeProcess};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_the_fake_library_and_follows_changes_during_the_test() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut fake = FakeNvml::new(dir.path(), 2).expect("fake nvml");
        let backend = Arc::new(NvmlBackend::new(Some(fake.library())).expect("nvml"));
        let sampler = Sampler::new(backend, Duration::from_secs(2))
            .await
            .expect("sampler");
        assert_eq!(sampler.devices().len(), 2);
        assert_eq!(sampler.devices()[0].model, "NVIDIA H100 80GB HBM3");
        let r = sampler.sample_all().await;
        let s0 = r[0].result.as_ref().expect("sample");
        assert_eq!(s0.gpu_util_percent, 0.0);
        assert_eq!(s0.power_watts, Some(70.0));
        assert_eq!(s0.sm_clock_hz, Some(1980e6));

        fake.devices[0].gpu_utilization_percent = 87;
        fake.devices[0].memory_used_bytes = 5 << 30;
        fake.processes.push(FakeProcess {
            device: 0,
            pid: 4242,
            memory_bytes: 5 << 30,
            sm_percent: 80,
            memory_percent: 10,
        });
        fake.devices[1].fail = Some(kudos_nvml::fake::NVML_ERROR_GPU_IS_LOST);
        fake.xid(0, 79);
        fake.write().expect("write");
        // The XID arrives on the event thread; wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = sampler.sample_all().await;
            let s0 = r[0].result.as_ref().expect("sample");
            if s0.xid_errors_total == 1 {
                assert_eq!(s0.gpu_util_percent, 87.0);
                assert_eq!(s0.memory_used_bytes, 5 << 30);
                assert_eq!(s0.last_xid, Some(79));
                assert_eq!(s0.processes.len(), 1);
                assert_eq!(s0.processes[0].pid, 4242);
                assert!(
                    matches!(r[1].result, Err(SampleError::Backend(_))),
                    "a lost GPU is reported, not fatal"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "XID never counted: {s0:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
