//! Safe, typed access to NVML for the Kudos node components, plus a fake `libnvidia-ml.so.1`
//! so everything above NVML is tested through the real dynamic-loading path.
//!
//! Why a crate of its own: the device plugin (discovery, health) and the node agent (sampling)
//! both talk to NVML, and both must behave the same when NVML is missing, slow or failing. This
//! crate owns the NVML handle, turns nvml-wrapper's results into small owned values with typed
//! errors, and maps "not supported on this GPU" to `None` instead of an error, so callers only
//! see errors that mean something is wrong.
//!
//! Where to start:
//! - [`Nvml::init`] loads the library (path configurable) and returns a cheap-to-clone,
//!   thread-safe handle.
//! - [`Nvml::devices`] discovers devices ([`DeviceInfo`]: index, UUID, model, memory, PCI bus
//!   ID, minor number, NUMA node).
//! - [`Nvml::sample`] reads one device ([`DeviceSample`]: utilisation, memory, power, SM clock,
//!   temperature, energy, running compute processes with per-process utilisation).
//! - [`Nvml::watch_xid`] runs the XID event loop on its own thread and calls back with
//!   [`Event`]s; dropping the returned [`EventWatcher`] stops it.
//! - [`Nvml::interconnect`] gives the link between two devices ([`Interconnect`], NVLink or
//!   the PCIe/NUMA common ancestor), for topology-aware allocation.
//! - [`fake`]: the fake library's path and a typed writer for its configuration.
//!
//! Units are base units (bytes, watts, hertz, joules, degrees Celsius, percent 0..=100).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod device;
mod events;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod topology;

pub use device::{DeviceInfo, DeviceSample, ProcessSample};
pub use events::{Event, EventWatcher, XidEvent};
pub use topology::Interconnect;

use nvml_wrapper::error::NvmlError;
use std::ffi::OsStr;
use std::sync::Arc;

/// The library name looked up through the dynamic loader when no path is configured.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// Errors from NVML, with the call that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The library could not be loaded or `nvmlInit` failed (no driver, no permission).
    #[error("initialising NVML from {path}: {source}")]
    Init {
        /// Library path or name that was loaded.
        path: String,
        /// What NVML or the loader said.
        #[source]
        source: NvmlError,
    },
    /// An NVML call failed.
    #[error("NVML {call} failed: {source}")]
    Call {
        /// The wrapper call, e.g. `device_by_uuid`.
        call: &'static str,
        /// What NVML said.
        #[source]
        source: NvmlError,
    },
    /// The event loop thread could not be started.
    #[error("starting the NVML event thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl Error {
    fn call(call: &'static str) -> impl FnOnce(NvmlError) -> Error {
        move |source| Error::Call { call, source }
    }

    /// The NVML error behind this one, if any.
    pub fn nvml(&self) -> Option<&NvmlError> {
        match self {
            Error::Init { source, .. } | Error::Call { source, .. } => Some(source),
            Error::Thread(_) => None,
        }
    }

    /// True when the device has fallen off the bus or needs a reset: it must not be used.
    pub fn is_gpu_lost(&self) -> bool {
        matches!(
            self.nvml(),
            Some(NvmlError::GpuLost | NvmlError::ResetRequired)
        )
    }
}

/// Turns "not supported" into `None`; keeps every other error.
pub(crate) fn optional<T>(r: Result<T, NvmlError>, call: &'static str) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => Ok(None),
        Err(NvmlError::FailedToLoadSymbol(_)) => Ok(None),
        Err(e) => Err(Error::Call { call, source: e }),
    }
}

// === impl Nvml ===

/// A loaded, initialised NVML. Clones share one library handle; `nvmlShutdown` runs when the
/// last clone is dropped. Safe to use from many threads.
#[derive(Clone)]
pub struct Nvml {
    inner: Arc<nvml_wrapper::Nvml>,
    path: Arc<str>,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").field("path", &self.path).finish()
    }
}

impl Nvml {
    /// Loads NVML from `lib_path` (a path or a bare name resolved by the dynamic loader;
    /// [`DEFAULT_LIBRARY`] when `None`) and initialises it.
    pub fn init(lib_path: Option<&std::path::Path>) -> Result<Self, Error> {
        let path: &OsStr = lib_path.map_or(OsStr::new(DEFAULT_LIBRARY), |p| p.as_os_str());
        let inner = nvml_wrapper::Nvml::builder()
            .lib_path(path)
            .init()
            .map_err(|source| Error::Init {
                path: path.to_string_lossy().into_owned(),
                source,
            })?;
        Ok(Nvml {
            inner: Arc::new(inner),
            path: path.to_string_lossy().into(),
        })
    }

    /// The library path or name this handle was loaded from.
    pub fn library_path(&self) -> &str {
        &self.path
    }

    /// The driver version string, e.g. `550.54.15`.
    pub fn driver_version(&self) -> Result<String, Error> {
        self.inner
            .sys_driver_version()
            .map_err(Error::call("sys_driver_version"))
    }

    /// Number of devices NVML sees.
    pub fn device_count(&self) -> Result<u32, Error> {
        self.inner
            .device_count()
            .map_err(Error::call("device_count"))
    }

    /// Discovers every device, in NVML index order. Fails if any device cannot be described:
    /// a device that cannot even report its UUID cannot be served safely.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, Error> {
        (0..self.device_count()?)
            .map(|i| self.device_info(i))
            .collect()
    }

    /// Describes the device at NVML index `index`.
    pub fn device_info(&self, index: u32) -> Result<DeviceInfo, Error> {
        let d = self
            .inner
            .device_by_index(index)
            .map_err(Error::call("device_by_index"))?;
        device::describe(&d, index)
    }

    /// Reads the current values of the device with `uuid` (`GPU-...`).
    pub fn sample(&self, uuid: &str) -> Result<DeviceSample, Error> {
        let d = self
            .inner
            .device_by_uuid(uuid)
            .map_err(Error::call("device_by_uuid"))?;
        device::sample(&d, uuid)
    }

    /// Cheap liveness probe of one device: NVML answers and the device is on the bus.
    /// "Not supported" (e.g. utilisation on a MIG-enabled GPU) counts as an answer.
    pub fn check(&self, uuid: &str) -> Result<(), Error> {
        let d = self
            .inner
            .device_by_uuid(uuid)
            .map_err(Error::call("device_by_uuid"))?;
        optional(d.utilization_rates(), "utilization_rates").map(|_| ())
    }

    /// The best link between two devices: NVLink when any link between them is active,
    /// otherwise the closest common PCIe/NUMA ancestor.
    pub fn interconnect(&self, a_uuid: &str, b_uuid: &str) -> Result<Interconnect, Error> {
        topology::interconnect(&self.inner, a_uuid, b_uuid)
    }

    /// Starts the XID event loop for the devices with these UUIDs (all devices when empty) on
    /// a dedicated thread. `on_event` runs on that thread for every critical XID and for every
    /// failed wait (NVML not answering); it must not block for long. Each wait lasts at most
    /// `wait`, which bounds how long dropping the watcher takes.
    pub fn watch_xid<F>(
        &self,
        uuids: &[String],
        wait: std::time::Duration,
        on_event: F,
    ) -> Result<EventWatcher, Error>
    where
        F: FnMut(Event) + Send + 'static,
    {
        events::spawn(self.inner.clone(), uuids.to_vec(), wait, on_event)
    }
}
