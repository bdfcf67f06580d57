//! The XID event loop. NVML's event wait blocks a thread, so the loop owns one OS thread and
//! hands events to a callback; the caller decides what an XID means (the device plugin keeps
//! an ignore list, the node agent counts them).

use crate::Error;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// A critical XID error reported by the driver for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// UUID of the device the event is about (empty if NVML could not name it).
    pub uuid: String,
    /// XID code, e.g. 79 (fallen off the bus). 999 when NVML reports "unknown".
    pub xid: u64,
}

/// What the event loop reports.
#[derive(Debug)]
pub enum Event {
    /// A critical XID on a device.
    Xid(XidEvent),
    /// Waiting for events failed for a reason other than a timeout: NVML is not answering.
    /// The loop keeps trying, with the wait period as back-off.
    WaitFailed(Error),
    /// Waiting works again after one or more [`Event::WaitFailed`].
    WaitRecovered,
}

/// Handle to a running event loop; dropping it stops the loop and joins its thread (within
/// one wait period).
#[derive(Debug)]
pub struct EventWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventWatcher {
    /// Stops the loop and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EventWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the loop. Registration errors are returned here (synchronously); errors while
/// waiting go to the callback.
pub(crate) fn spawn<F>(
    nvml: Arc<nvml_wrapper::Nvml>,
    uuids: Vec<String>,
    wait: Duration,
    mut on_event: F,
) -> Result<EventWatcher, Error>
where
    F: FnMut(Event) + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), Error>>(1);
    let stop_thread = stop.clone();
    let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX).max(1);
    let thread = std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || {
            let set = match register(&nvml, &uuids) {
                Ok(set) => {
                    let _ = ready_tx.send(Ok(()));
                    set
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut failing = false;
            while !stop_thread.load(Ordering::Relaxed) {
                match set.wait(wait_ms) {
                    Ok(data) => {
                        if failing {
                            failing = false;
                            on_event(Event::WaitRecovered);
                        }
                        if let Some(ev) = to_xid(&data) {
                            on_event(Event::Xid(ev));
                        }
                    }
                    Err(NvmlError::Timeout) => {
                        if failing {
                            failing = false;
                            on_event(Event::WaitRecovered);
                        }
                    }
                    Err(source) => {
                        failing = true;
                        on_event(Event::WaitFailed(Error::Call {
                            call: "event_set_wait",
                            source,
                        }));
                        std::thread::sleep(wait);
                    }
                }
            }
        })
        .map_err(Error::Thread)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(EventWatcher {
            stop,
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(Error::Thread(std::io::Error::other(
                "event thread exited during setup",
            )))
        }
    }
}

fn register<'n>(
    nvml: &'n nvml_wrapper::Nvml,
    uuids: &[String],
) -> Result<nvml_wrapper::EventSet<'n>, Error> {
    let mut set = nvml
        .create_event_set()
        .map_err(Error::call("create_event_set"))?;
    let devices = if uuids.is_empty() {
        let n = nvml.device_count().map_err(Error::call("device_count"))?;
        (0..n)
            .map(|i| {
                nvml.device_by_index(i)
                    .map_err(Error::call("device_by_index"))
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        uuids
            .iter()
            .map(|u| {
                nvml.device_by_uuid(u.as_str())
                    .map_err(Error::call("device_by_uuid"))
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    for d in devices {
        let supported = match d.supported_event_types() {
            Ok(t) => t,
            Err(NvmlError::NotSupported) => EventTypes::empty(),
            Err(source) => {
                return Err(Error::Call {
                    call: "supported_event_types",
                    source,
                });
            }
        };
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            tracing::warn!(
                uuid = d.uuid().unwrap_or_default(),
                "device does not report XID events"
            );
            continue;
        }
        set = d
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| Error::Call {
                call: "register_events",
                source: e.error,
            })?;
    }
    Ok(set)
}

fn to_xid(data: &EventData<'_>) -> Option<XidEvent> {
    use nvml_wrapper::enums::event::XidError;
    let xid = match data.event_data.as_ref()? {
        XidError::Value(v) => *v,
        XidError::Unknown => 999,
    };
    Some(XidEvent {
        uuid: data.device.uuid().unwrap_or_default(),
        xid,
    })
}
