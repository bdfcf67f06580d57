//! How two GPUs are connected, for placing multi-GPU containers on the best-linked set.

use crate::Error;
use crate::device::normalize_bus_id;
use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;

/// NVML exposes at most this many NVLinks per device.
const MAX_NVLINKS: u32 = 18;

/// The link between two devices, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interconnect {
    /// The same device.
    Same,
    /// Direct NVLink with this many active links.
    NvLink {
        /// Active links between the two devices.
        links: u32,
    },
    /// On the same board (multi-GPU board).
    Board,
    /// Behind one PCIe switch.
    PcieSwitch,
    /// Behind several PCIe switches, without crossing the host bridge.
    PcieSwitches,
    /// Under the same PCIe host bridge.
    HostBridge,
    /// Within the same NUMA node (crossing host bridges).
    NumaNode,
    /// Across NUMA nodes (SMP interconnect).
    System,
}

impl Interconnect {
    /// A cost for allocation scoring: lower is better. NVLink cost falls with more links.
    pub fn cost(self) -> u32 {
        match self {
            Interconnect::Same => 0,
            Interconnect::NvLink { links } => 10u32.saturating_sub(links.min(9)),
            Interconnect::Board => 11,
            Interconnect::PcieSwitch => 20,
            Interconnect::PcieSwitches => 30,
            Interconnect::HostBridge => 40,
            Interconnect::NumaNode => 50,
            Interconnect::System => 60,
        }
    }
}

pub(crate) fn interconnect(
    nvml: &nvml_wrapper::Nvml,
    a_uuid: &str,
    b_uuid: &str,
) -> Result<Interconnect, Error> {
    if a_uuid == b_uuid {
        return Ok(Interconnect::Same);
    }
    let a = nvml
        .device_by_uuid(a_uuid)
        .map_err(Error::call("device_by_uuid"))?;
    let b = nvml
        .device_by_uuid(b_uuid)
        .map_err(Error::call("device_by_uuid"))?;
    let b_bus = b.pci_info().map_err(Error::call("pci_info"))?.bus_id;
    let b_bus = normalize_bus_id(&b_bus).unwrap_or(b_bus);
    let mut links = 0;
    for link in 0..MAX_NVLINKS {
        let l = a.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            // No NVLink on this device, or past its last link.
            Err(NvmlError::NotSupported | NvmlError::InvalidArg) => break,
            Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => break,
            Err(source) => {
                return Err(Error::Call {
                    call: "nvlink_is_active",
                    source,
                });
            }
        }
        match l.remote_pci_info() {
            Ok(p) => {
                if normalize_bus_id(&p.bus_id).unwrap_or(p.bus_id) == b_bus {
                    links += 1;
                }
            }
            Err(NvmlError::NotSupported) => {}
            Err(source) => {
                return Err(Error::Call {
                    call: "nvlink_remote_pci_info",
                    source,
                });
            }
        }
    }
    if links > 0 {
        return Ok(Interconnect::NvLink { links });
    }
    let level = nvml
        .topology_common_ancestor(&a, &b)
        .map_err(Error::call("topology_common_ancestor"))?;
    Ok(match level {
        TopologyLevel::Internal => Interconnect::Board,
        TopologyLevel::Single => Interconnect::PcieSwitch,
        TopologyLevel::Multiple => Interconnect::PcieSwitches,
        TopologyLevel::HostBridge => Interconnect::HostBridge,
        TopologyLevel::Node => Interconnect::NumaNode,
        TopologyLevel::System => Interconnect::System,
    })
}
