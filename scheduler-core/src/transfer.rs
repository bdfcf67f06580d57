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
    MAX_UNSETTLED_CLASSES, ModelState, NameHasher, PRIOR_INTERACTION_SD, PRIOR_INTERACTION_WEIGHT,
    PROFILE_PRIOR_WEIGHT, ProfileEffect, SIMILAR_FULL_EVERY, SIMILAR_PRIOR_WEIGHT, Unsettled,
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
        let full = touched.is_none() || self.runs.is_multiple_of(self.similar_period());
        self.fit(config, full, &|class| touched == Some(class));
    }

    /// Runs between two full similar-class passes. The full pass costs classes² x profiles;
    /// running it every `period` runs, with the period growing with the number of classes,
    /// keeps its share of each run's work linear in classes. A class's own row is recomputed on
    /// each of its runs, and with C classes each one runs about once every C runs anyway, so
    /// the other rows are no staler than the traffic makes them. (The power of two keeps the
    /// period steady while classes come and go.)
    fn similar_period(&self) -> u64 {
        SIMILAR_FULL_EVERY.max((self.classes.len() as u64).next_power_of_two())
    }

    /// What [`crate::Refit::Deferred`] does for one observation of `class_key`: the part of
    /// [`ModelState::refit`] the observation needs at once (the class's effect against the
    /// current profile effects, which is the fit's class step with them held, and its fastest
    /// cell), costing the class's cells, not the model's; and a note of the rest for
    /// [`ModelState::settle`]. `runs_before` is [`ModelState::runs`] before this observation.
    pub(crate) fn refit_deferred(
        &mut self,
        config: &SchedulerConfig,
        class_key: &str,
        runs_before: u64,
    ) {
        let owed = self.unsettled.get_or_insert_with(|| Unsettled {
            runs_before,
            ..Unsettled::default()
        });
        if !owed.all && !owed.classes.contains(class_key) {
            if owed.classes.len() >= MAX_UNSETTLED_CLASSES {
                owed.all = true;
                owed.classes.clear();
            } else {
                owed.classes.insert(class_key.to_owned());
            }
        }
        let Some(class) = self.classes.get(class_key) else {
            return;
        };
        let (mut sum, mut weight, mut best) = (0.0, 0.0, None::<f64>);
        for (key, cell) in &class.cells {
            // The profile's effect as the full fit would start from it.
            let beta = self
                .profile_effects
                .get(key)
                .map_or_else(|| prior_effect(config, &cell.profile.model), |e| e.effect);
            let (y, n) = (cell.window.est.mean, cell.window.est.n);
            sum += n * (y - beta);
            weight += n;
            // As the fit's `min_by(f64::total_cmp)`: the first of equal means.
            best = match best {
                Some(b) if b.total_cmp(&y).is_le() => Some(b),
                _ => Some(y),
            };
        }
        let effect = (weight > 0.0).then(|| sum / weight);
        if let Some(class) = self.classes.get_mut(class_key) {
            class.effect = effect;
            class.best = best;
        }
    }

    /// Makes the refit that deferred observations left (see [`crate::Refit::Deferred`]): the
    /// whole fit, the similar-class rows of the classes observed since, and the full pass if
    /// its period came round meanwhile. Nothing to do on a settled model.
    pub(crate) fn settle(&mut self, config: &SchedulerConfig) {
        let Some(owed) = self.unsettled.take() else {
            return;
        };
        let period = self.similar_period();
        let full = owed.all || self.runs / period != owed.runs_before / period;
        self.fit(config, full, &|class| owed.classes.contains(class));
    }

    /// The fit itself: every class and profile effect, and the similar-class rows of every
    /// class when `full`, else of the classes `row_of` names.
    fn fit(&mut self, config: &SchedulerConfig, full: bool, row_of: &dyn Fn(&str) -> bool) {
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
                    prior.push(prior_effect(config, &cell.profile.model));
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
        let rows: Vec<Option<BTreeMap<String, (f64, f64)>>> = self
            .classes
            .keys()
            .enumerate()
            .map(|(ci, name)| (full || row_of(name)).then(|| row(ci)))
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

/// The profile effect the capability table gives `model` (log time relative to a V100): the
/// fit's ridge target, and its starting point for a profile it has not fitted yet.
fn prior_effect(config: &SchedulerConfig, model: &str) -> f64 {
    -capability(model, &config.capability_overrides).speed.ln()
}

#[cfg(test)]
mod tests {
    use crate::tests::{profile, run};
    use crate::{Refit, Scheduler, SchedulerConfig};

    const MODELS: [&str; 5] = ["Tesla V100", "Tesla K80", "A100", "H100 SXM", "T4"];

    /// Run `i` of a stream over 12 classes and 20 nodes (four of each model); each class runs
    /// on three of the five models, so the similar-class rows have something to predict.
    fn stream(i: usize) -> (String, crate::RunObservation, f64) {
        let class = i % 12;
        let model = (class + i / 12 % 3) % MODELS.len();
        let node = format!("n{}-{model}", i / 7 % 4);
        let speed = [1.0, 0.3, 2.2, 3.1, 0.6][model];
        let class_speedup = 1.0 + 0.15 * ((class * 7 + model * 3) % 5) as f64;
        let noise = 1.0 + 0.03 * ((i * 37 % 11) as f64 - 5.0) / 5.0;
        let seconds = 600.0 * (1.0 + class as f64) / (speed * class_speedup) * noise;
        let end = 1_000.0 + 10.0 * i as f64;
        let r = run(
            &node,
            MODELS[model],
            &format!("class-{class}"),
            seconds,
            end,
        );
        (format!("run-{i}"), r, end)
    }

    /// Predicted seconds of every (class, model), on a node with no history of its own.
    fn predictions(s: &Scheduler) -> Vec<f64> {
        (0..12)
            .flat_map(|c| {
                MODELS.map(|m| {
                    s.predict(&format!("class-{c}"), "elsewhere", &profile(m), None)
                        .seconds
                })
            })
            .collect()
    }

    fn close(a: &[f64], b: &[f64], rel: f64) -> bool {
        a.iter()
            .zip(b)
            .all(|(x, y)| ((x - y) / x.abs().max(1e-9)).abs() <= rel)
    }

    #[test]
    fn deferred_observations_settle_to_the_fit_of_every_run() {
        let config = SchedulerConfig::default();
        let mut every = Scheduler::new(config.clone());
        let mut deferred = Scheduler::new(config.clone());
        for i in 0..600 {
            let (key, r, now) = stream(i);
            let a = every.observe_run(&key, &r, now).unwrap();
            let b = deferred
                .observe_with(Some(&key), &r, now, Refit::Deferred)
                .unwrap();
            // The run's review is against its class's fastest cell, which a deferred
            // observation keeps current.
            assert_eq!(a.review, b.review, "run {i}");
            assert!(!deferred.is_settled());
            if i % 50 == 49 {
                deferred.settle();
                assert!(deferred.is_settled());
                // The similar-class rows of classes not observed since the last full pass are
                // as old as that pass in either model; the effects and spread are fitted anew.
                let (full_a, full_b) = (
                    Scheduler::with_state(config.clone(), every.state().clone()),
                    Scheduler::with_state(config.clone(), deferred.state().clone()),
                );
                assert!(
                    close(&predictions(&full_a), &predictions(&full_b), 1e-5),
                    "after run {i} the deferred model holds other data than the every-run one"
                );
            }
        }
        deferred.settle();
        // Profiles a class has not run on borrow from similar classes' rows, which the two
        // models recompute at different runs (0.04 % apart here at most).
        let (a, b) = (predictions(&every), predictions(&deferred));
        assert!(
            close(&a, &b, 0.005),
            "settled predictions drifted: {a:?} vs {b:?}"
        );
        // Profiles each class has run on come from the same fit, to its tolerance.
        for c in 0..12 {
            for m in 0..3 {
                let model = MODELS[(c + m) % MODELS.len()];
                let class = format!("class-{c}");
                let pa = every.predict(&class, "elsewhere", &profile(model), None);
                let pb = deferred.predict(&class, "elsewhere", &profile(model), None);
                assert!(
                    close(&[pa.seconds], &[pb.seconds], 1e-5),
                    "{class} on {model}: {} vs {}",
                    pa.seconds,
                    pb.seconds
                );
            }
        }
    }

    #[test]
    fn a_deferred_refit_is_owed_until_settled_or_an_every_run_observation() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        for i in 0..40 {
            let (key, r, now) = stream(i);
            s.observe_run(&key, &r, now).unwrap();
        }
        let before = predictions(&s);
        // A class's level moves at once; the profile effects (another class's predictions)
        // wait for the settle.
        let (key, mut r, now) = stream(40);
        let other = "class-5";
        assert_ne!(r.class, other);
        r.start = r.end - (r.end - r.start) * 3.0;
        let own = |s: &Scheduler| {
            s.predict(&r.class, "elsewhere", &profile(&r.profile.model), None)
                .seconds
        };
        let theirs = |s: &Scheduler| {
            s.predict(other, "elsewhere", &profile("A100"), None)
                .seconds
        };
        let (own_before, theirs_before) = (own(&s), theirs(&s));
        s.observe_with(Some(&key), &r, now, Refit::Deferred)
            .unwrap();
        assert!(
            own(&s) > own_before * 1.01,
            "the class's own level moves at once"
        );
        assert_eq!(
            theirs(&s),
            theirs_before,
            "profile effects wait for the settle"
        );
        assert_ne!(predictions(&s), before);
        // An every-run observation settles what was owed before its own refit.
        let mut mixed = s.clone();
        let mut settled = s.clone();
        settled.settle();
        let settled_before = predictions(&settled);
        let (key, r, now) = stream(41);
        mixed.observe_run(&key, &r, now).unwrap();
        settled.observe_run(&key, &r, now).unwrap();
        assert!(mixed.is_settled());
        assert_eq!(predictions(&mixed), predictions(&settled));
        // Settling moved the other class too, and is the same whenever it is made.
        s.settle();
        assert_ne!(theirs(&s), theirs_before);
        assert_eq!(predictions(&s), settled_before);
        let again = predictions(&s);
        s.settle();
        assert_eq!(
            predictions(&s),
            again,
            "a settled model has nothing to settle"
        );
    }
}
