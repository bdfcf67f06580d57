//! What each class's runs did on each vendor's devices: the evidence that keeps a class off a
//! vendor its image evidently cannot use.
//!
//! Every vendor registers the same resource name, so a pod that does not name its vendors
//! (`kudos.dev/vendors`) may reach a vendor whose runtime its image lacks; such runs fail at
//! once, every time. When a class has failed [`FAILURES_TO_EXCLUDE`] times on a vendor without
//! ever completing there, and has completed on another vendor (so the class itself works), that
//! vendor is excluded for the class's pods that name no vendors. One completion there lifts it.
//! Pods that name their vendors are taken at their word.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Failed final runs on a vendor, with no completion there, that exclude it for the class.
pub const FAILURES_TO_EXCLUDE: u32 = 3;

/// Classes whose outcomes are kept; runs of further classes are not counted (classes are
/// user-chosen labels, so the table is bounded like every other map keyed by them).
pub const MAX_CLASSES: usize = 4096;

/// Vendors counted per class (there are a handful in the world).
pub const MAX_VENDORS: usize = 16;

/// Final runs of one class on one vendor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VendorOutcome {
    /// Runs that completed.
    pub completed: u32,
    /// Runs that failed.
    pub failed: u32,
}

/// Class → vendor → outcomes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VendorOutcomes(BTreeMap<String, BTreeMap<String, VendorOutcome>>);

impl VendorOutcomes {
    /// Counts one final run of `class` on `vendor`; ignored beyond the bounds.
    pub fn record(&mut self, class: &str, vendor: &str, completed: bool) {
        if !self.0.contains_key(class) && self.0.len() >= MAX_CLASSES {
            return;
        }
        let vendors = self.0.entry(class.to_owned()).or_default();
        let vendor = vendor.to_ascii_lowercase();
        if !vendors.contains_key(&vendor) && vendors.len() >= MAX_VENDORS {
            return;
        }
        let o = vendors.entry(vendor).or_default();
        if completed {
            o.completed = o.completed.saturating_add(1);
        } else {
            o.failed = o.failed.saturating_add(1);
        }
    }

    /// Why `vendor` is excluded for `class`'s pods that name no vendors, if it is.
    pub fn excluded(&self, class: &str, vendor: &str) -> Option<String> {
        let vendors = self.0.get(class)?;
        let here = vendors
            .iter()
            .find(|(v, _)| v.eq_ignore_ascii_case(vendor))
            .map(|(_, o)| *o)?;
        let works_elsewhere = vendors
            .iter()
            .any(|(v, o)| !v.eq_ignore_ascii_case(vendor) && o.completed > 0);
        (here.failed >= FAILURES_TO_EXCLUDE && here.completed == 0 && works_elsewhere).then(|| {
            format!(
                "class {class} failed {} times on {vendor} devices and never completed there \
                 (it completes on other vendors); name the vendors in kudos.dev/vendors to override",
                here.failed
            )
        })
    }

    /// The outcomes of `class`, by vendor.
    pub fn of(&self, class: &str) -> Option<&BTreeMap<String, VendorOutcome>> {
        self.0.get(class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_exclude_a_vendor_only_where_the_class_works_elsewhere() {
        let mut o = VendorOutcomes::default();
        for _ in 0..5 {
            o.record("llm", "amd", false);
        }
        assert_eq!(
            o.excluded("llm", "amd"),
            None,
            "no evidence the class works at all"
        );
        o.record("llm", "nvidia", true);
        let why = o.excluded("llm", "AMD").expect("excluded");
        assert!(why.contains("failed 5 times on AMD"), "{why}");
        assert_eq!(o.excluded("llm", "nvidia"), None);
        assert_eq!(o.excluded("other", "amd"), None);
        o.record("llm", "amd", true);
        assert_eq!(o.excluded("llm", "amd"), None, "one completion lifts it");

        let mut few = VendorOutcomes::default();
        few.record("c", "nvidia", true);
        for _ in 0..FAILURES_TO_EXCLUDE - 1 {
            few.record("c", "amd", false);
        }
        assert_eq!(few.excluded("c", "amd"), None);
    }

    #[test]
    fn classes_and_vendors_are_bounded() {
        let mut o = VendorOutcomes::default();
        for i in 0..MAX_CLASSES + 10 {
            o.record(&format!("c{i}"), "nvidia", true);
        }
        assert_eq!(o.0.len(), MAX_CLASSES);
        for i in 0..MAX_VENDORS + 5 {
            o.record("c0", &format!("v{i}"), false);
        }
        assert_eq!(o.of("c0").map(BTreeMap::len), Some(MAX_VENDORS));
    }
}
