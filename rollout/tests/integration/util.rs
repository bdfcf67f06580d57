//! Fixtures the integration tests share.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kudos_rollout::{DerivedImage, ImageRecorder};

/// Records every image set the reconciler hands it, as the orchestrator's store would.
#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<BTreeMap<String, DerivedImage>>>);

impl ImageRecorder for Recorder {
    fn record(
        &self,
        _generation: u64,
        images: &BTreeMap<String, DerivedImage>,
    ) -> Result<(), kudos_rollout::reconcile::RecordError> {
        self.0
            .lock()
            .map_err(|e| e.to_string())?
            .push(images.clone());
        Ok(())
    }
}
