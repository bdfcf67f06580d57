//! Which kubelet API allocates this node's devices: the device-plugin API (`v1beta1`, the
//! unified extended resource) or DRA (a ResourceSlice plus the DRA kubelet plugin).
//!
//! The orchestrator decides per node and answers in `ReportPluginResponse.allocation_api`;
//! `--allocation-api=auto` (the default) follows it. Its last answer is cached on disk beside
//! the name cache, so a node that uses DRA keeps using it when the orchestrator is down at
//! start. `--allocation-api=device-plugin|dra` overrides (standalone use, no orchestrator).

use clap::ValueEnum;
use kudos_api::dra::AllocationApi;
use std::path::PathBuf;

/// The `--allocation-api` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AllocationApiFlag {
    /// Follow the orchestrator's answer (else its last answer cached on disk, else the
    /// device-plugin API).
    #[default]
    Auto,
    /// Always register with the kubelet's device-plugin API.
    DevicePlugin,
    /// Always publish a ResourceSlice and serve the DRA kubelet plugin.
    Dra,
}

/// The API chosen and why, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The API to use.
    pub api: AllocationApi,
    /// Why.
    pub why: &'static str,
}

/// Chooses the API: an explicit flag wins; `auto` follows the orchestrator's latest answer,
/// else the cached one, else the device-plugin API.
pub fn decide(
    flag: AllocationApiFlag,
    answered: Option<AllocationApi>,
    cached: Option<AllocationApi>,
) -> Decision {
    match (flag, answered, cached) {
        (AllocationApiFlag::DevicePlugin, _, _) => Decision {
            api: AllocationApi::DevicePlugin,
            why: "--allocation-api=device-plugin",
        },
        (AllocationApiFlag::Dra, _, _) => Decision {
            api: AllocationApi::Dra,
            why: "--allocation-api=dra",
        },
        (AllocationApiFlag::Auto, Some(api), _) => Decision {
            api,
            why: "the orchestrator's answer (--allocation-api=auto)",
        },
        (AllocationApiFlag::Auto, None, Some(api)) => Decision {
            api,
            why: "the orchestrator's last answer, cached (no answer yet; --allocation-api=auto)",
        },
        (AllocationApiFlag::Auto, None, None) => Decision {
            api: AllocationApi::DevicePlugin,
            why: "the default: no orchestrator answer and none cached (--allocation-api=auto)",
        },
    }
}

/// The orchestrator's last answer, on disk (`device-plugin` or `dra`).
#[derive(Clone, Debug)]
pub struct ApiCache {
    path: PathBuf,
}

impl ApiCache {
    /// A cache at `path`.
    pub fn new(path: PathBuf) -> Self {
        ApiCache { path }
    }

    /// The cache beside the name cache `name_cache` (`<dir>/allocation-api`).
    pub fn beside(name_cache: &std::path::Path) -> Self {
        ApiCache::new(name_cache.with_file_name("allocation-api"))
    }

    /// The cached answer, if present and valid.
    pub fn load(&self) -> Option<AllocationApi> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let api = AllocationApi::parse(text.trim());
        if api.is_none() {
            tracing::warn!(path = %self.path.display(), "ignoring an invalid cached allocation API");
        }
        api
    }

    /// Stores `api` atomically; failures are logged, not fatal.
    pub fn store(&self, api: AllocationApi) {
        if self.load() == Some(api) {
            return;
        }
        let text = format!("{}\n", api.as_str());
        if let Err(e) = super::write_atomic(&self.path, text.as_bytes()) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot cache the allocation API");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_flag_wins_and_auto_follows_the_answer_then_the_cache() {
        use AllocationApi::{DevicePlugin as Dp, Dra};
        use AllocationApiFlag as F;
        let api = |f, a, c| decide(f, a, c).api;
        assert_eq!(api(F::DevicePlugin, Some(Dra), Some(Dra)), Dp);
        assert_eq!(api(F::Dra, Some(Dp), None), Dra);
        assert_eq!(api(F::Dra, None, None), Dra);
        assert_eq!(api(F::Auto, Some(Dra), Some(Dp)), Dra);
        assert_eq!(api(F::Auto, Some(Dp), Some(Dra)), Dp);
        assert_eq!(api(F::Auto, None, Some(Dra)), Dra);
        assert_eq!(api(F::Auto, None, None), Dp);
        assert!(decide(F::Auto, None, Some(Dra)).why.contains("cached"));
    }

    #[test]
    fn the_flag_parses_with_auto_by_default() {
        use crate::cli::{Args, Settings};
        use clap::Parser as _;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["kudos-device-plugin", "--node-name=n1"];
            argv.extend_from_slice(extra);
            Args::try_parse_from(argv).map(|a| Settings::try_from(a).expect("valid"))
        };
        let s = parse(&[]).expect("parses");
        assert_eq!(s.dra.allocation_api, AllocationApiFlag::Auto);
        assert_eq!(
            s.dra.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.kudos.dev-reg.sock")
        );
        assert_eq!(
            s.dra.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.kudos.dev/dra.sock")
        );
        assert_eq!(
            s.dra.checkpoint(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.kudos.dev/checkpoint.json")
        );
        assert_eq!(s.dra.cdi_root, PathBuf::from("/var/run/cdi"));
        for (flag, want) in [
            ("--allocation-api=dra", AllocationApiFlag::Dra),
            (
                "--allocation-api=device-plugin",
                AllocationApiFlag::DevicePlugin,
            ),
            ("--allocation-api=auto", AllocationApiFlag::Auto),
        ] {
            assert_eq!(parse(&[flag]).expect(flag).dra.allocation_api, want);
        }
        assert!(parse(&["--allocation-api=DRA"]).is_err());
        let s = parse(&[
            "--kubelet-plugins-dir=/p",
            "--kubelet-registry-dir=/r",
            "--cdi-root=/c",
        ])
        .expect("dirs");
        assert_eq!(
            s.dra.dra_socket(),
            PathBuf::from("/p/gpu.kudos.dev/dra.sock")
        );
        assert_eq!(
            s.dra.registration_socket(),
            PathBuf::from("/r/gpu.kudos.dev-reg.sock")
        );
        assert_eq!(s.dra.cdi_root, PathBuf::from("/c"));
    }

    #[test]
    fn the_cache_round_trips_and_ignores_garbage() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cache = ApiCache::beside(&tmp.path().join("state/resource-name"));
        assert_eq!(cache.load(), None);
        cache.store(AllocationApi::Dra);
        assert_eq!(cache.load(), Some(AllocationApi::Dra));
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("state/allocation-api")).expect("read"),
            "dra\n"
        );
        cache.store(AllocationApi::DevicePlugin);
        assert_eq!(cache.load(), Some(AllocationApi::DevicePlugin));
        std::fs::write(tmp.path().join("state/allocation-api"), "DRA!").expect("write");
        assert_eq!(cache.load(), None);
    }
}
