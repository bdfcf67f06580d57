//! GPU sampling behind a trait.
//!
//! The agent must run on nodes without NVIDIA hardware (AMD nodes, CI, tests), and NVML calls
//! can hang on a wedged device for seconds. So the hardware sits behind [`GpuBackend`] — a small
//! blocking interface that NVML, a fake, or nothing implements — and [`Sampler`] drives it from
//! async code: every device is read on its own blocking thread under a deadline, a device whose
//! previous read is still stuck is skipped rather than piling up threads, and a failing device is
//! reported in its [`DeviceReading`] instead of failing the whole sample.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Static facts about one device, read once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Backend index (NVML index), used for the `gpu` metric label.
    pub index: u32,
    /// Vendor UUID as NVML reports it (`GPU-...`).
    pub uuid: String,
    /// Model name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// Total memory in bytes.
    pub memory_total_bytes: u64,
}

/// One compute process running on a device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSample {
    /// Host PID.
    pub pid: u32,
    /// Device memory the process holds, when the driver reports it.
    pub used_memory_bytes: Option<u64>,
    /// SM utilisation of the process in percent, when the driver reports it.
    pub sm_util_percent: Option<f64>,
}

/// One reading of one device. Optional fields are absent when the device does not support them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceSample {
    /// GPU (SM) utilisation over the driver's last sample window, percent.
    pub gpu_util_percent: f64,
    /// Memory-controller utilisation, percent.
    pub mem_util_percent: f64,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Board power draw, watts.
    pub power_watts: Option<f64>,
    /// Energy counter since driver load, joules (preferred over power for run energy).
    pub energy_joules: Option<f64>,
    /// SM clock, hertz.
    pub sm_clock_hz: Option<f64>,
    /// Core temperature, degrees Celsius.
    pub temperature_celsius: Option<f64>,
    /// XID errors seen on this device since the agent started.
    pub xid_errors_total: u64,
    /// The most recent XID code, if any was seen.
    pub last_xid: Option<u64>,
    /// Running compute processes, with per-process utilisation where available.
    pub processes: Vec<ProcessSample>,
}

/// Why a backend call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The device or library returned an error.
    #[error("{0}")]
    Device(String),
    /// The backend could not be initialised (library missing, driver not loaded).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// Blocking access to the GPUs of this node. Implementations may block (NVML does); the
/// [`Sampler`] calls them on blocking threads with a deadline.
pub trait GpuBackend: Send + Sync + 'static {
    /// Short name for logs (`nvml`, `fake`, `none`).
    fn name(&self) -> &'static str;
    /// The devices present. Called once at start-up.
    fn devices(&self) -> Result<Vec<DeviceInfo>, BackendError>;
    /// Reads one device now.
    fn sample(&self, device: &DeviceInfo) -> Result<DeviceSample, BackendError>;
}

/// Why one device produced no sample this period.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    /// The read did not finish within the deadline; it keeps running in the background.
    #[error("sample timed out")]
    Timeout,
    /// A read from an earlier period is still stuck; this period was skipped.
    #[error("previous sample still in progress")]
    Stuck,
    /// The backend returned an error.
    #[error("backend error: {0}")]
    Backend(String),
    /// The backend panicked.
    #[error("backend panicked")]
    Panicked,
}

/// A device and what sampling it gave this period.
#[derive(Clone, Debug)]
pub struct DeviceReading {
    /// The device.
    pub info: DeviceInfo,
    /// The sample, or why there is none.
    pub result: Result<DeviceSample, SampleError>,
}

// === impl Sampler ===

/// Drives a [`GpuBackend`] from async code with per-device deadlines.
pub struct Sampler {
    backend: Arc<dyn GpuBackend>,
    devices: Vec<DeviceInfo>,
    busy: Vec<Arc<AtomicBool>>,
    timeout: Duration,
}

impl Sampler {
    /// Discovers the devices (on a blocking thread, under `timeout`) and builds a sampler.
    pub async fn new(
        backend: Arc<dyn GpuBackend>,
        timeout: Duration,
    ) -> Result<Self, BackendError> {
        let b = backend.clone();
        let devices = match tokio::time::timeout(
            timeout * 10,
            tokio::task::spawn_blocking(move || b.devices()),
        )
        .await
        {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => {
                return Err(BackendError::Unavailable(
                    "device discovery panicked".into(),
                ));
            }
            Err(_) => {
                return Err(BackendError::Unavailable(
                    "device discovery timed out".into(),
                ));
            }
        };
        let busy = devices
            .iter()
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        Ok(Self {
            backend,
            devices,
            busy,
            timeout,
        })
    }

    /// The devices this sampler reads.
    pub fn devices(&self) -> &[DeviceInfo] {
        &self.devices
    }

    /// Reads every device concurrently; never waits longer than the deadline.
    pub async fn sample_all(&self) -> Vec<DeviceReading> {
        let mut pending = Vec::with_capacity(self.devices.len());
        for (info, busy) in self.devices.iter().zip(&self.busy) {
            if busy.swap(true, Ordering::AcqRel) {
                pending.push(None);
                continue;
            }
            let (backend, dev, flag) = (self.backend.clone(), info.clone(), busy.clone());
            pending.push(Some(tokio::task::spawn_blocking(move || {
                // Cleared on return and on panic, even when nobody awaits this read any more.
                let _done = ClearOnDrop(flag);
                backend.sample(&dev)
            })));
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut out = Vec::with_capacity(self.devices.len());
        for (info, handle) in self.devices.iter().zip(pending) {
            let result = match handle {
                None => Err(SampleError::Stuck),
                Some(h) => match tokio::time::timeout_at(deadline, h).await {
                    Ok(Ok(Ok(s))) => Ok(s),
                    Ok(Ok(Err(e))) => Err(SampleError::Backend(e.to_string())),
                    Ok(Err(_)) => Err(SampleError::Panicked),
                    Err(_) => Err(SampleError::Timeout),
                },
            };
            out.push(DeviceReading {
                info: info.clone(),
                result,
            });
        }
        out
    }
}

/// Clears a device's "read in progress" flag when dropped.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

// === impl NoGpus ===

/// A node without supported GPUs: no devices, nothing to sample.
pub struct NoGpus;

impl GpuBackend for NoGpus {
    fn name(&self) -> &'static str {
        "none"
    }
    fn devices(&self) -> Result<Vec<DeviceInfo>, BackendError> {
        Ok(Vec::new())
    }
    fn sample(&self, _device: &DeviceInfo) -> Result<DeviceSample, BackendError> {
        Err(BackendError::Device("no devices".into()))
    }
}

// === impl FakeGpus ===

/// In-memory GPUs whose readings tests (and `--gpu-backend fake`) set at will.
///
/// Power follows utilisation (100 W idle to 400 W busy) so energy figures are plausible.
pub struct FakeGpus {
    devices: Vec<DeviceInfo>,
    state: Mutex<HashMap<String, FakeState>>,
}

#[derive(Clone, Debug, Default)]
struct FakeState {
    util: f64,
    memory_used: u64,
    fail: bool,
    delay: Duration,
    xids: u64,
}

impl FakeGpus {
    /// `n` devices with UUIDs `GPU-00000000-0000-0000-0000-00000000000<i>` (hex index).
    pub fn new(n: u32) -> Self {
        let devices: Vec<DeviceInfo> = (0..n)
            .map(|i| DeviceInfo {
                index: i,
                uuid: Self::uuid(i),
                model: "Kudos Fake GPU 80GB".into(),
                memory_total_bytes: 80 << 30,
            })
            .collect();
        let state = devices
            .iter()
            .map(|d| (d.uuid.clone(), FakeState::default()))
            .collect();
        Self {
            devices,
            state: Mutex::new(state),
        }
    }

    /// The UUID of fake device `i`.
    pub fn uuid(i: u32) -> String {
        format!("GPU-00000000-0000-0000-0000-{i:012x}")
    }

    fn with(&self, uuid: &str, f: impl FnOnce(&mut FakeState)) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.get_mut(uuid) {
            f(s);
        }
    }

    /// Sets utilisation (percent) and memory in use.
    pub fn set(&self, uuid: &str, util: f64, memory_used: u64) {
        self.with(uuid, |s| {
            s.util = util;
            s.memory_used = memory_used;
        });
    }

    /// Makes the device fail (or recover).
    pub fn set_failing(&self, uuid: &str, fail: bool) {
        self.with(uuid, |s| s.fail = fail);
    }

    /// Makes every read of the device take `delay`.
    pub fn set_delay(&self, uuid: &str, delay: Duration) {
        self.with(uuid, |s| s.delay = delay);
    }

    /// Records one XID error on the device.
    pub fn add_xid(&self, uuid: &str) {
        self.with(uuid, |s| s.xids += 1);
    }
}

impl GpuBackend for FakeGpus {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn devices(&self) -> Result<Vec<DeviceInfo>, BackendError> {
        Ok(self.devices.clone())
    }
    fn sample(&self, device: &DeviceInfo) -> Result<DeviceSample, BackendError> {
        let s = {
            let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
            g.get(&device.uuid)
                .cloned()
                .ok_or_else(|| BackendError::Device("unknown device".into()))?
        };
        if !s.delay.is_zero() {
            std::thread::sleep(s.delay);
        }
        if s.fail {
            return Err(BackendError::Device("GPU is lost".into()));
        }
        Ok(DeviceSample {
            gpu_util_percent: s.util,
            mem_util_percent: s.util / 2.0,
            memory_used_bytes: s.memory_used,
            power_watts: Some(100.0 + 3.0 * s.util),
            energy_joules: None,
            sm_clock_hz: Some(1_980e6),
            temperature_celsius: Some(35.0 + s.util / 4.0),
            xid_errors_total: s.xids,
            last_xid: (s.xids > 0).then_some(79),
            processes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slow_or_failing_device_does_not_block_the_others() {
        let fake = Arc::new(FakeGpus::new(3));
        fake.set(&FakeGpus::uuid(0), 50.0, 1 << 30);
        fake.set_failing(&FakeGpus::uuid(1), true);
        fake.set_delay(&FakeGpus::uuid(2), Duration::from_millis(600));
        let sampler = Sampler::new(fake.clone(), Duration::from_millis(100))
            .await
            .expect("sampler");
        let t0 = std::time::Instant::now();
        let r = sampler.sample_all().await;
        assert!(
            t0.elapsed() < Duration::from_millis(400),
            "waited {:?}",
            t0.elapsed()
        );
        assert_eq!(r[0].result.as_ref().map(|s| s.gpu_util_percent), Ok(50.0));
        assert!(matches!(r[1].result, Err(SampleError::Backend(_))));
        assert_eq!(r[2].result, Err(SampleError::Timeout));
        // The stuck read is still running: the next period skips the device instead of
        // starting a second thread on it.
        let r = sampler.sample_all().await;
        assert_eq!(r[2].result, Err(SampleError::Stuck));
        assert!(r[0].result.is_ok());
        // Once it finishes and the device is fast again, it recovers.
        fake.set_delay(&FakeGpus::uuid(2), Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let r = sampler.sample_all().await;
        assert!(r[2].result.is_ok(), "{:?}", r[2].result);
    }
}
