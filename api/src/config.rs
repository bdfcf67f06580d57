//! Versioned configuration files written by one Kudos process and read by another.
//!
//! Like NVIDIA's `api/config/v1`, each version lives in its own module with a `version`
//! field: a missing version means `v1`, an unknown version or an unknown field is an error
//! naming the file, never silently ignored.

pub mod v1;
