//! Device descriptions and samples as owned values, so callers never hold NVML handles.

use crate::{Error, optional};
use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use std::collections::BTreeMap;

/// What discovery learns about one device; stable while the driver is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// NVML index (not stable across reboots; use `uuid` as identity).
    pub index: u32,
    /// `GPU-xxxxxxxx-...`.
    pub uuid: String,
    /// Model as NVML names it, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Total device memory in bytes.
    pub memory_total_bytes: u64,
    /// PCI bus ID as NVML formats it, e.g. `00000000:3B:00.0`.
    pub pci_bus_id: String,
    /// Minor number: the device node is `/dev/nvidia<minor>`. `None` where unsupported.
    pub minor_number: Option<u32>,
    /// NUMA node from NVML, else from sysfs; `None` when unknown.
    pub numa_node: Option<u32>,
    /// CUDA compute capability (major, minor); `None` where the driver does not say.
    pub compute_capability: Option<(u32, u32)>,
}

/// One process with a compute context on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSample {
    /// Host PID.
    pub pid: u32,
    /// Device memory used by the process, in bytes, where NVML reports it.
    pub used_memory_bytes: Option<u64>,
    /// Latest SM utilisation of the process in percent, where NVML reports it.
    pub sm_utilization_percent: Option<u32>,
    /// Latest memory utilisation of the process in percent, where NVML reports it.
    pub memory_utilization_percent: Option<u32>,
}

/// Current readings of one device. `None` means "not supported on this device".
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSample {
    /// The device's UUID.
    pub uuid: String,
    /// Percent of time a kernel was running over the driver's last sample period.
    pub gpu_utilization_percent: u32,
    /// Percent of time device memory was read or written.
    pub memory_utilization_percent: u32,
    /// Device memory in use, in bytes.
    pub memory_used_bytes: u64,
    /// Total device memory, in bytes.
    pub memory_total_bytes: u64,
    /// Board power draw in watts.
    pub power_watts: Option<f64>,
    /// Energy used since the driver loaded, in joules.
    pub energy_joules: Option<f64>,
    /// SM clock in hertz.
    pub sm_clock_hertz: Option<f64>,
    /// GPU core temperature in degrees Celsius.
    pub temperature_celsius: Option<u32>,
    /// Processes with a compute context, by PID.
    pub processes: Vec<ProcessSample>,
}

pub(crate) fn describe(d: &Device<'_>, index: u32) -> Result<DeviceInfo, Error> {
    let uuid = d.uuid().map_err(Error::call("uuid"))?;
    let name = d.name().map_err(Error::call("name"))?;
    let memory_total_bytes = d.memory_info().map_err(Error::call("memory_info"))?.total;
    let pci_bus_id = d.pci_info().map_err(Error::call("pci_info"))?.bus_id;
    let minor_number = optional(d.minor_number(), "minor_number")?;
    let numa_node = match optional(d.numa_node_id(), "numa_node_id") {
        Ok(Some(n)) => Some(n),
        // Older drivers lack the call; the kernel knows the PCI device's node.
        _ => sysfs_numa_node(&pci_bus_id),
    };
    let compute_capability = optional(d.cuda_compute_capability(), "cuda_compute_capability")?
        .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?)));
    Ok(DeviceInfo {
        index,
        uuid,
        name,
        memory_total_bytes,
        pci_bus_id,
        minor_number,
        numa_node,
        compute_capability,
    })
}

/// Reads `/sys/bus/pci/devices/<dddd:bb:dd.f>/numa_node`; -1 or absent means unknown.
fn sysfs_numa_node(nvml_bus_id: &str) -> Option<u32> {
    let id = normalize_bus_id(nvml_bus_id)?;
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{id}/numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// NVML's `00000000:3B:00.0` to the kernel's `0000:3b:00.0`.
pub(crate) fn normalize_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

pub(crate) fn sample(d: &Device<'_>, uuid: &str) -> Result<DeviceSample, Error> {
    let util = d
        .utilization_rates()
        .map_err(Error::call("utilization_rates"))?;
    let mem = d.memory_info().map_err(Error::call("memory_info"))?;
    let power_watts = optional(d.power_usage(), "power_usage")?.map(|mw| f64::from(mw) / 1000.0);
    let energy_joules = optional(d.total_energy_consumption(), "total_energy_consumption")?
        .map(|mj| mj as f64 / 1000.0);
    let sm_clock_hertz =
        optional(d.clock_info(Clock::SM), "clock_info")?.map(|mhz| f64::from(mhz) * 1e6);
    let temperature_celsius = optional(d.temperature(TemperatureSensor::Gpu), "temperature")?;
    Ok(DeviceSample {
        uuid: uuid.to_owned(),
        gpu_utilization_percent: util.gpu,
        memory_utilization_percent: util.memory,
        memory_used_bytes: mem.used,
        memory_total_bytes: mem.total,
        power_watts,
        energy_joules,
        sm_clock_hertz,
        temperature_celsius,
        processes: processes(d)?,
    })
}

fn processes(d: &Device<'_>) -> Result<Vec<ProcessSample>, Error> {
    let running =
        optional(d.running_compute_processes(), "running_compute_processes")?.unwrap_or_default();
    // Latest utilisation sample per PID.
    let mut util: BTreeMap<u32, (u64, u32, u32)> = BTreeMap::new();
    for s in optional(
        d.process_utilization_stats(None),
        "process_utilization_stats",
    )?
    .unwrap_or_default()
    {
        let e = util.entry(s.pid).or_insert((0, 0, 0));
        if s.timestamp >= e.0 {
            *e = (s.timestamp, s.sm_util, s.mem_util);
        }
    }
    Ok(running
        .into_iter()
        .map(|p| {
            let u = util.get(&p.pid);
            ProcessSample {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                sm_utilization_percent: u.map(|u| u.1),
                memory_utilization_percent: u.map(|u| u.2),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::normalize_bus_id;

    #[test]
    fn bus_ids_are_normalised_to_the_kernel_form() {
        assert_eq!(
            normalize_bus_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            normalize_bus_id("0001:AF:00.1").as_deref(),
            Some("0001:af:00.1")
        );
        assert_eq!(normalize_bus_id("garbage"), None);
    }
}
