//! Pure scheduling algorithms for Kudos.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
