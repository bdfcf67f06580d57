//! The cross-class transfer model of the first model (§2.2 step 2, third source): profile speed
//! factors learned from every class, and class-specific interactions borrowed from similar classes.
//!
//! `x = ln(seconds / work) = class effect + profile effect + interaction`. The additive part is a
//! weighted least-squares fit over the (class, profile) cells' robust means, by alternating
//! sweeps (warm-started, so one new run costs a few sweeps), with the capability prior as a ridge
//! on each profile effect; this is what lets a class seen on a V100 be predicted on an H100 before
//! it ever ran there, with an uncertainty from the fit's residual spread. It was chosen over a
//! per-class copy of the capability table because real speed-ups are class-specific (Gavel:
//! V100/K80 from 0.66x to 11.6x) and over a full matrix factorisation because it is cheap, stable
//! with few cells, and interpretable (one speed factor per profile, shown in `/explain`).

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use crate::config::SchedulerConfig;
use crate::predict::{
    ModelState, NameHasher, PRIOR_INTERACTION_SD, PRIOR_INTERACTION_WEIGHT, PROFILE_PRIOR_WEIGHT,
    ProfileEffect, SIMILAR_FULL_EVERY, SIMILAR_PRIOR_WEIGHT,
};
use crate::prior::capability;

impl ModelState {
    /// Refits the log-additive transfer model over every (class, profile) cell.
    ///
    /// The cells are flattened into dense arrays first, so the alternating least-squares sweeps
    /// are plain arithmetic (this runs on every observation).
    ///
    /// The additive model misses class-specific speed-ups (a model that is memory bound gains
    /// less from a new device than one that is compute bound). So, for each class and each profile
    /// it has not run on, the interaction is also predicted from *similar* classes: those whose
    /// residuals agree with this class's on the profiles both have run on (a kernel-weighted
    /// neighbour average, shrunk toward zero). This is collaborative filtering over the class x
    /// profile matrix; its spread is the uncertainty. `touched` limits that (quadratic) step to one
    /// class, except every `SIMILAR_FULL_EVERY` runs (or every classes' next power of two runs,
    /// when there are more classes).
    pub(crate) fn refit(&mut self, config: &SchedulerConfig, touched: Option<&str>) {
        let mut keys: Vec<&str> = Vec::new();
        let mut prior: Vec<f64> = Vec::new();
        // Profile key → its index. Hashed, not ordered: every cell of every class looks its key
        // up here, and keys share long prefixes (`nvidia|…`), so an ordered map's comparisons
        // were a third of learning a run at 1,000 classes.
        let mut index: HashMap<&str, usize, BuildHasherDefault<NameHasher>> = HashMap::default();
        // (class, profile, mean, runs)
        let mut cells: Vec<(usize, usize, f64, f64)> = Vec::new();
        for (ci, class) in self.classes.values().enumerate() {
            for (key, cell) in &class.cells {
                let pi = *index.entry(key.as_str()).or_insert_with(|| {
                    keys.push(key.as_str());
                    prior.push(
                        -capability(&cell.profile.model, &config.capability_overrides)
                            .speed
                            .ln(),
                    );
                    keys.len() - 1
                });
                cells.push((ci, pi, cell.window.est.mean, cell.window.est.n));
            }
        }
        // Warm start from the previous fit: one new run barely moves it, so few sweeps converge.
        let mut beta: Vec<f64> = keys
            .iter()
            .zip(&prior)
            .map(|(k, p)| self.profile_effects.get(*k).map_or(*p, |e| e.effect))
            .collect();
        let lambda = if config.enable_transfer {
            PROFILE_PRIOR_WEIGHT
        } else {
            f64::INFINITY
        };
        let n_classes = self.classes.len();
        let mut mu: Vec<Option<f64>> = vec![None; n_classes];
        let mut acc = vec![(0.0f64, 0.0f64); n_classes.max(keys.len())];
        for _ in 0..100 {
            acc.iter_mut().for_each(|a| *a = (0.0, 0.0));
            for &(ci, pi, y, n) in &cells {
                acc[ci].0 += n * (y - beta[pi]);
                acc[ci].1 += n;
            }
            for (m, a) in mu.iter_mut().zip(&acc) {
                *m = (a.1 > 0.0).then(|| a.0 / a.1);
            }
            if lambda.is_infinite() {
                break;
            }
            acc.iter_mut().for_each(|a| *a = (0.0, 0.0));
            for &(ci, pi, y, n) in &cells {
                if let Some(m) = mu[ci] {
                    acc[pi].0 += n * (y - m);
                    acc[pi].1 += n;
                }
            }
            let mut change = 0f64;
            for (pi, b) in beta.iter_mut().enumerate() {
                let new = (lambda * prior[pi] + acc[pi].0) / (lambda + acc[pi].1);
                change = change.max((new - *b).abs());
                *b = new;
            }
            if change < 1e-7 {
                break;
            }
        }
        let mut per_class = vec![0usize; n_classes];
        for &(ci, ..) in &cells {
            per_class[ci] += 1;
        }
        let (mut ss, mut sw) = (0.0, 0.0);
        let mut weight = vec![0.0; keys.len()];
        for &(ci, pi, y, n) in &cells {
            weight[pi] += n;
            // A class seen on one profile fits it exactly and says nothing about interactions.
            if let Some(m) = mu[ci].filter(|_| per_class[ci] >= 2) {
                let r = y - m - beta[pi];
                ss += r * r;
                sw += 1.0;
            }
        }
        self.interaction_sd = Some(
            ((PRIOR_INTERACTION_WEIGHT * PRIOR_INTERACTION_SD.powi(2) + ss)
                / (PRIOR_INTERACTION_WEIGHT + sw))
                .sqrt(),
        );
        let effects: BTreeMap<String, ProfileEffect> = if config.enable_transfer {
            keys.iter()
                .enumerate()
                .map(|(pi, k)| {
                    let e = ProfileEffect {
                        effect: beta[pi],
                        weight: weight[pi],
                    };
                    ((*k).to_owned(), e)
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        self.profile_effects = effects;

        // Similar-class interactions.
        let n_prof = keys.len();
        let isd = self.interaction_sd();
        let mut resid = vec![f64::NAN; n_classes * n_prof];
        // Which profiles each class has a residual on, as bits: the pairwise pass below runs on
        // every class pair, and most of its work is finding the profiles two classes share.
        let words = n_prof.div_ceil(64).max(1);
        let mut seen = vec![0u64; n_classes * words];
        for &(ci, pi, y, _) in &cells {
            if let Some(m) = mu[ci].filter(|_| per_class[ci] >= 2) {
                resid[ci * n_prof + pi] = y - m - beta[pi];
                seen[ci * words + pi / 64] |= 1 << (pi % 64);
            }
        }
        let bandwidth2 = 2.0 * (0.5 * isd).max(0.1).powi(2);
        // A class pair's similarity does not depend on which profile is being predicted, so it
        // is computed once per pair (and only for pairs that can contribute), then added to
        // every profile the class is missing; the sums run in the same order as a per-profile
        // loop would, so the result is the same to the bit.
        let row = |ci: usize| -> BTreeMap<String, (f64, f64)> {
            let mut out = BTreeMap::new();
            if !config.enable_transfer || per_class[ci] < 2 {
                return out;
            }
            let mine = &resid[ci * n_prof..(ci + 1) * n_prof];
            let mine_bits = &seen[ci * words..(ci + 1) * words];
            let missing: Vec<usize> = (0..n_prof).filter(|&p| mine[p].is_nan()).collect();
            if missing.is_empty() {
                return out;
            }
            let missing_bits: Vec<u64> = {
                let mut m = vec![0u64; words];
                for &p in &missing {
                    m[p / 64] |= 1 << (p % 64);
                }
                m
            };
            // (sum w, sum w*v, sum w*v^2) per missing profile.
            let mut sums = vec![(0.0f64, 0.0f64, 0.0f64); missing.len()];
            for c2 in (0..n_classes).filter(|&c2| c2 != ci) {
                let theirs_bits = &seen[c2 * words..(c2 + 1) * words];
                if theirs_bits
                    .iter()
                    .zip(&missing_bits)
                    .all(|(t, m)| t & m == 0)
                {
                    continue;
                }
                let theirs = &resid[c2 * n_prof..(c2 + 1) * n_prof];
                let (mut d2, mut m) = (0.0, 0.0);
                for (w, (a, b)) in mine_bits.iter().zip(theirs_bits).enumerate() {
                    let mut common = a & b;
                    while common != 0 {
                        let p = w * 64 + common.trailing_zeros() as usize;
                        common &= common - 1;
                        let d = mine[p] - theirs[p];
                        d2 += d * d;
                        m += 1.0;
                    }
                }
                if m == 0.0 {
                    continue;
                }
                let w = m / (m + 1.0) * (-(d2 / m) / bandwidth2).exp();
                for (s, &p) in sums.iter_mut().zip(&missing) {
                    let v = theirs[p];
                    if !v.is_nan() {
                        s.0 += w;
                        s.1 += w * v;
                        s.2 += w * v * v;
                    }
                }
            }
            for (&(sw, swr, swr2), &p) in sums.iter().zip(&missing) {
                if sw > 0.0 {
                    let g = swr / (SIMILAR_PRIOR_WEIGHT + sw);
                    let spread = (swr2 - 2.0 * g * swr + g * g * sw).max(0.0);
                    let var =
                        (SIMILAR_PRIOR_WEIGHT * isd * isd + spread) / (SIMILAR_PRIOR_WEIGHT + sw);
                    out.insert(keys[p].to_owned(), (g, var.sqrt()));
                }
            }
            out
        };
        // The full pass costs classes² x profiles; running it every `period` runs, with the
        // period growing with the number of classes, keeps its share of each run's work linear
        // in classes. A class's own row is recomputed on each of its runs, and with C classes
        // each one runs about once every C runs anyway, so the other rows are no staler than
        // the traffic makes them. (The power of two keeps the period steady while classes
        // come and go.)
        let period = SIMILAR_FULL_EVERY.max((n_classes as u64).next_power_of_two());
        let full = touched.is_none() || self.runs.is_multiple_of(period);
        let rows: Vec<Option<BTreeMap<String, (f64, f64)>>> = self
            .classes
            .keys()
            .enumerate()
            .map(|(ci, name)| (full || touched == Some(name.as_str())).then(|| row(ci)))
            .collect();
        for (class, row) in self.classes.values_mut().zip(rows) {
            if let Some(row) = row {
                class.transfer = row;
            }
        }

        for (class, m) in self.classes.values_mut().zip(mu) {
            class.effect = m;
            class.best = class
                .cells
                .values()
                .map(|c| c.window.est.mean)
                .min_by(f64::total_cmp);
        }
    }
}
