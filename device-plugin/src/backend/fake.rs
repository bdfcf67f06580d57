//! An in-memory backend for tests: devices given by the test, probe results and health
//! signals set at will. Not used by the binary.

use super::{
    Allocation, BackendError, Device, DeviceBackend, HealthGuard, HealthSignal, Inventory, Vendor,
};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// A controllable backend.
#[derive(Debug)]
pub struct FakeBackend {
    inventory: Inventory,
    probes: Mutex<HashMap<String, String>>,
    probe_delay: Mutex<Option<std::time::Duration>>,
    signals: Mutex<Option<mpsc::UnboundedSender<HealthSignal>>>,
}

impl FakeBackend {
    /// `n` devices `<key>-dev<i>` on NUMA node `i / per_numa`.
    pub fn new(key: &str, n: usize, per_numa: usize) -> Self {
        let prefix = format!("{key}-");
        let devices = (0..n)
            .map(|i| Device {
                id: format!("{prefix}dev{i}"),
                vendor: key.into(),
                model: format!("{key} model"),
                memory_bytes: 1 << 34,
                uuid: format!("{key}-uuid-{i}"),
                numa_node: i64::try_from(i / per_numa.max(1)).ok(),
                arch: None,
            })
            .collect();
        let vendor = Vendor {
            key: key.into(),
            resource_name: format!("{key}.example/gpu"),
            id_prefix: prefix,
        };
        FakeBackend {
            inventory: Inventory { vendor, devices },
            probes: Mutex::default(),
            probe_delay: Mutex::default(),
            signals: Mutex::default(),
        }
    }

    /// Gives every device the model name `model`.
    pub fn set_model(&mut self, model: &str) {
        for d in &mut self.inventory.devices {
            d.model = model.into();
        }
    }

    /// Makes the probe of `id` fail with `reason` (`None`: pass again).
    pub fn set_probe(&self, id: &str, reason: Option<&str>) {
        let mut p = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        match reason {
            Some(r) => p.insert(id.into(), r.into()),
            None => p.remove(id),
        };
    }

    /// Makes the next probes block for `d`, like a hung vendor library.
    pub fn set_probe_delay(&self, d: Option<std::time::Duration>) {
        *self.probe_delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Sends a health signal as the backend's event source would.
    pub fn signal(&self, s: HealthSignal) {
        if let Some(tx) = self
            .signals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            let _ = tx.send(s);
        }
    }
}

impl DeviceBackend for FakeBackend {
    fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    fn allocate(&self, devices: &[&Device]) -> Allocation {
        let mut a = Allocation::default();
        let uuids = devices.iter().map(|d| d.uuid.as_str());
        let key = self.inventory.vendor.key.to_ascii_uppercase();
        a.envs.insert(
            format!("{key}_VISIBLE_DEVICES"),
            uuids.collect::<Vec<_>>().join(","),
        );
        a.device_specs
            .push(("/dev/shared".into(), "/dev/shared".into(), "rw".into()));
        for d in devices {
            let p = format!("/dev/{}", d.id);
            a.device_specs.push((p.clone(), p, "rw".into()));
        }
        a
    }

    fn probe(&self, device: &Device) -> Result<(), String> {
        let delay = *self.probe_delay.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        match self
            .probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&device.id)
        {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }

    fn watch(
        &self,
        tx: mpsc::UnboundedSender<HealthSignal>,
    ) -> Result<Option<HealthGuard>, BackendError> {
        *self.signals.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        Ok(None)
    }
}
